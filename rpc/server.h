// Server: serves generated services over RDMA.
//
//   MyGreeter impl;                                    // derives from Greeter::Service
//   auto server = zrpc::Server::Create(zrpc::ServerOptions{});
//   (*server)->AddService(&impl);
//   (*server)->Start();                                // (*server)->port() says where
//   ...
//   (*server)->Shutdown(absl::Seconds(5));
//
// What it does. Start listens on the address and port of ServerOptions and accepts connections
// on the transport's listener thread (transport/listener.h: bounded handshakes, admission
// limits). Each connection is placed on one of `pollers` poller threads, round robin. A request
// is dispatched by its service id (a hash of the service's full name, WIRE.md) and method index,
// an array lookup after one hash-map probe, never by name; an unknown service or method is
// answered UNIMPLEMENTED. Handlers run on the handler pool by default, or inline on the poller
// thread for methods that opt in (SetInline): THREADING.md has the model.
//
// Shutdown(grace), in order: stop accepting; answer new requests UNAVAILABLE; wait until the
// calls in flight finish or `grace` passes; answer the calls still running UNAVAILABLE and mark
// them cancelled (ServerContext::IsCancelled), so their handlers can stop early (what they
// answer later is discarded); wait until the answers given have reached the clients (up to the
// grace period's end, at least 500 ms); close every connection; wait for the handlers still
// running to return and for every call to be finished (a handler that never returns, or an
// AsyncService that holds a PendingCall and never finishes or drops it, blocks Shutdown: the
// server cannot take a thread or a held call back); stop the threads. After Shutdown returns no handler runs and nothing is left registered.
// The destructor shuts down with no grace if Shutdown was not called.
//
// Threads: AddService, SetInline and Start before serving, from one thread; Shutdown from any
// thread but a handler's; the accessors from any thread.
#ifndef ZRPC_RPC_SERVER_H_
#define ZRPC_RPC_SERVER_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "rpc/generated_api.h"
#include "rpc/metrics.h"
#include "rpc/metrics_http.h"
#include "rpc/registered_memory.h"
#include "transport/device_config.h"
#include "transport/listener.h"
#include "transport/poller.h"

namespace zrpc {

namespace internal {
class ServerCore;
}

struct ServerOptions {
  // Where to listen: an address of the RDMA device (empty: the device's own address) and a port
  // (0: any free one; port() says which).
  std::string address;
  uint16_t port = 0;
  // The device; unset: from the environment (ZRPC_RDMA_*), else the first active one.
  std::optional<transport::DeviceConfig> device;
  // Poller threads; connections are spread over them.
  int pollers = 1;
  // kEvent sleeps when idle; kBusy spins a core per poller for the lowest latency.
  transport::PollMode poll_mode = transport::PollMode::kEvent;
  // kEvent: how long a poller keeps polling after its last completion before it sleeps
  // (adaptive polling: a request within it costs no wake-up; THREADING.md). Zero: sleep at
  // once. In [0, 1s].
  absl::Duration spin = absl::Microseconds(50);
  // Threads of the handler pool (methods not marked inline run there).
  int handler_threads = 4;
  // Run every method inline on the poller thread unless overridden (SetInline). Streaming
  // methods never run inline.
  bool inline_by_default = false;
  // Streams (rpc/streaming.h): each streaming handler of a Service runs on a thread of its own,
  // at most max_streams_per_connection per connection and max_streams in the whole server; a
  // stream past either is refused with RESOURCE_EXHAUSTED naming the option. An AsyncService's
  // streaming handlers need no thread: they count against max_streams_per_connection only. stream_window: messages of
  // the client's a stream holds unread before the client must wait (per-stream flow control,
  // rpc/stream_core.h). Each at least 1.
  int max_streams_per_connection = 16;
  int max_streams = 256;
  uint16_t stream_window = 16;
  // Accepting: handshake deadline, admission limits, and every connection's options (its
  // arena_size bounds the largest request payload a client can send). The admission limits are
  // lowered to what the pollers' completion queues can hold (CqEntriesFor each connection), and
  // max_connections_per_peer to half of that, so that one address can never fill the server.
  transport::ListenerOptions listener;
  // The device's registered message slots, shared with other servers and channels of the
  // process that ask for the same: slot_size bounds the largest message (request or response,
  // 40 bytes of headers included) and must match the clients'.
  transport::SlotPoolOptions slots;
  // Registered memory for staging response payloads (rpc/staging.h). One connection stages at
  // most what its client's arena holds; answers beyond wait for that connection's earlier ones.
  size_t staging_bytes = size_t{64} << 20;
  // The largest request or response message (serialized protobuf bytes) this side sends or
  // takes, at most 2 GiB - 1 (protobuf's own bound). One that does not fit a message slot
  // travels at the front of a bulk payload, written into the peer's arena or pulled from this
  // side's memory like one (rpc/WIRE.md, "Messages larger than a slot"), with no option to set
  // on either side; past this limit the call fails with RESOURCE_EXHAUSTED naming the option,
  // before any byte moves (a sender's own limit) or before the message is read (a receiver's).
  uint64_t max_message_size = uint64_t{4} << 20;
  // Where request payloads this server pulls land (those larger than its arena: rpc/WIRE.md,
  // "Pulled payloads"). Unset: memory the server allocates and registers per payload, within
  // max_pulled_bytes. Set: called with the method and the payload's size, on a poller thread (it
  // must not block), it returns memory the application registered on this server
  // (Server::RegisterMemory), at least that large, and a release to run once the runtime is done
  // with it. The payload is read straight there by this side's NIC, and the handler's
  // IncomingBulk views it in place: a page cache, a tensor or a KV-cache block gets its bytes
  // where it wants them, with no copy. An error fails the call with that status, nothing read;
  // memory too small or registered elsewhere fails it too (RESOURCE_EXHAUSTED,
  // FAILED_PRECONDITION). Payloads written into the arena (at most its size) are not placed:
  // lower listener.connection.arena_size to place smaller ones.
  std::function<absl::StatusOr<PayloadPlacement>(const MethodInfo& method, size_t size)>
      place_request_payload;
  // Bulk payloads larger than the peer's arena are pulled by this side with RDMA READ into
  // memory it allocates and registers per payload (rpc/WIRE.md, "Pulled payloads"): one is at
  // most max_bulk_size bytes (at most 4 GiB - 1), and all those pulled and not yet released at
  // most max_pulled_bytes together (a cap: nothing is allocated in advance). Past either, the
  // call fails with RESOURCE_EXHAUSTED naming the option, before any byte moves.
  uint64_t max_bulk_size = uint64_t{1} << 30;
  uint64_t max_pulled_bytes = uint64_t{4} << 30;
  // Liveness, checked every second or so by a thread of the server's:
  //  - a connection that held no calls and received nothing for idle_timeout is closed (its
  //    slots, arena and admission place go back): a peer that went away without a word, or
  //    never said anything. A zrpc client with keepalives on is never idle (its pings count);
  //    one with them off reconnects on its next call. Zero: never.
  //  - a connection that holds calls and received nothing for liveness_probe_interval has its
  //    client's NIC probed (a zero-length RDMA WRITE, no credit): a client host that vanished
  //    fails the probe after the transport's retries, the connection fails, and its calls are
  //    marked cancelled (ServerContext::IsCancelled) instead of running for nobody. Zero: never.
  absl::Duration idle_timeout = absl::Minutes(5);
  absl::Duration liveness_probe_interval = absl::Seconds(2);
  // Serve PrometheusText() at http://<metrics_address>/metrics from Start to Shutdown: "host:port"
  // on a plain TCP interface ("0.0.0.0:9464", "127.0.0.1:0" for any free port; metrics_port()
  // says which). Empty: no endpoint. See rpc/metrics_http.h for what it answers and its bounds.
  std::string metrics_address;
};

struct ServerStats {
  uint64_t connections_accepted = 0;
  uint64_t connections_open = 0;
  uint64_t calls_started = 0;
  uint64_t calls_in_flight = 0;
  uint64_t unimplemented = 0;       // requests for a service or method this server lacks
  uint64_t protocol_violations = 0;  // connections closed for breaking the protocol
  uint64_t cancels_received = 0;
  uint64_t keepalives_answered = 0;
  // Calls whose caller gave up (deadline passed, cancelled, connection gone) while they waited
  // for a handler thread, or while their request was pulled: ended without running the handler.
  uint64_t calls_skipped = 0;
  // Answers not sent because the caller had given up by the time the handler finished (no
  // payload staged or written for them).
  uint64_t answers_dropped = 0;
  uint64_t connections_idle_closed = 0;  // closed after idle_timeout without a word
  uint64_t liveness_probes = 0;          // probes of silent clients that hold calls
  uint64_t streams_started = 0;          // streaming calls whose handler thread started
  uint64_t streams_open = 0;             // of those, not finished yet
  uint64_t streams_refused = 0;          // past max_streams_per_connection or max_streams
  // Streaming calls an AsyncService's handler took: no thread, so not in streams_started.
  uint64_t async_streams_started = 0;
  // Response payload bytes copied into staging memory (from unregistered bytes), and those the
  // NIC sent straight from memory registered with RegisterMemory; the staging memory
  // registered now (at most ServerOptions::staging_bytes).
  uint64_t bulk_bytes_staged = 0;
  uint64_t bulk_bytes_zero_copy = 0;
  uint64_t staging_bytes_registered = 0;
  // Memory held now by request payloads pulled from clients (being read, or not yet released by
  // their handlers): at most ServerOptions::max_pulled_bytes.
  uint64_t pulled_bytes_held = 0;
};

class Server {
 public:
  // Opens the device and starts the pollers and the handler pool; not yet listening.
  static absl::StatusOr<std::unique_ptr<Server>> Create(const ServerOptions& options);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Serves `service` (not owned; must outlive the server). Before Start. kAlreadyExists when a
  // service with the same full name or the same id (a hash collision) is already served.
  absl::Status AddService(Service* service);
  // Runs `method` ("package.Service/Method", of a service already added) inline on the poller
  // thread (true) or on the handler pool (false). Before Start. kNotFound for an unknown method.
  absl::Status SetInline(absl::string_view method, bool inline_handler);
  // Starts listening. kFailedPrecondition when called twice or after Shutdown.
  absl::Status Start();
  // See the top of this file.
  void Shutdown(absl::Duration grace);

  // The port it listens on (after Start), and the address.
  uint16_t port() const;
  std::string address() const;
  ServerStats stats() const;
  // Registers [data, data + size) on this server's device, once, so that response payloads from
  // it (a handler's *response_bulk = memory.Bulk(...)) are sent with no copy
  // (rpc/registered_memory.h). The bytes must outlive the handle and every payload made from it.
  absl::StatusOr<RegisteredMemory> RegisterMemory(void* data, size_t size);
  // Per-method server metrics (calls, status codes, bytes, latency); PrometheusText() for scrapes.
  const Metrics& metrics() const;
  // What /metrics serves: the per-method metrics, then stats() as zrpc_server_* counters and
  // gauges, in Prometheus text format 0.0.4.
  std::string PrometheusText() const;
  // The port of the metrics endpoint (ServerOptions::metrics_address) from Start to Shutdown;
  // 0 otherwise, or without one.
  uint16_t metrics_port() const;

 private:
  Server(std::unique_ptr<internal::ServerCore> core, std::string metrics_address);
  std::unique_ptr<internal::ServerCore> core_;
  const std::string metrics_address_;
  // After core_, so that it stops (and renders no more) before the core goes.
  mutable absl::Mutex metrics_mu_;
  std::unique_ptr<MetricsHttpServer> metrics_http_ ABSL_GUARDED_BY(metrics_mu_);
};

}  // namespace zrpc

#endif  // ZRPC_RPC_SERVER_H_
