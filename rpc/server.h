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
// answered UNIMPLEMENTED. A Service's handlers run on the handler pool by default, an
// AsyncService's unary handlers (which return at once) inline on the poller thread, and SetInline
// moves a method either way: THREADING.md has the model.
//
// Shutdown(grace), in order: stop accepting; answer new requests UNAVAILABLE; wait until the
// calls in flight finish or `grace` passes; answer the calls still running UNAVAILABLE and mark
// them cancelled (ServerContext::IsCancelled), so their handlers can stop early (what they
// answer later is discarded); wait until the answers given have reached the clients (up to the
// grace period's end, at least 500 ms); close every connection; wait for the handlers still
// running to return and for every call to be finished (a handler that never returns, or an
// AsyncService that holds a PendingCall and never finishes or drops it, blocks Shutdown: the
// server cannot take a thread or a held call back); stop the threads. After Shutdown returns no
// handler runs and nothing is left registered. The destructor shuts down with no grace if Shutdown
// was not called.
//
// Threads: AddService, SetInline and Start before serving, from one thread; Shutdown from any
// thread but a handler's; the accessors from any thread.
#ifndef ZRPC_RPC_SERVER_H_
#define ZRPC_RPC_SERVER_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "rpc/bulk.h"
#include "rpc/metrics.h"
#include "rpc/metrics_http.h"
#include "rpc/options.h"
#include "rpc/registered_memory.h"
#include "rpc/service.h"

namespace zrpc {

namespace internal {
class ServerImpl;
}

struct ServerStats {
  uint64_t connections_accepted = 0;
  uint64_t connections_open = 0;
  // Connections accepted and since closed, for any reason: the client's, a failure, idleness,
  // Shutdown. Counted once each connection has let everything go (its calls ended), as it leaves
  // connections_open; a connection refused during its handshake is neither accepted nor closed.
  uint64_t connections_closed = 0;
  // The most connections open or handshaking at once since Start (the listener's admission
  // count, so never above ServerOptions::listener.max_connections), until Shutdown began.
  uint64_t connections_peak = 0;
  // Pollers running: ServerOptions::pollers, and those added since (max_pollers); 0 after
  // Shutdown.
  uint64_t pollers = 0;
  uint64_t calls_started = 0;
  // Calls started and not yet retired. A call retires just after its answer has left, so a
  // client may hold its answer a moment before this count (and the method's metrics) drop.
  uint64_t calls_in_flight = 0;
  // Calls answered UNIMPLEMENTED: for a service or method this server does not serve, for a
  // method its service declares but does not implement (the generated default answered), or by
  // a handler's own UNIMPLEMENTED.
  uint64_t unimplemented = 0;
  uint64_t protocol_violations = 0;  // connections closed for breaking the protocol
  uint64_t cancels_received = 0;
  uint64_t keepalives_answered = 0;
  // Calls whose caller gave up (deadline passed, cancelled, connection gone) while they waited
  // for a handler thread, or while their request was pulled: ended without running the handler.
  uint64_t calls_skipped = 0;
  // Answers not sent because the caller had given up by the time the handler finished (no
  // payload staged or written for them).
  uint64_t answers_dropped = 0;
  // Idle connections closed: no word ever within ServerOptions::idle_probe_interval, or none for
  // max_connection_idle.
  uint64_t connections_idle_closed = 0;
  // Probes of clients silent for liveness_probe_interval that hold calls or spoke since their
  // last probe.
  uint64_t liveness_probes = 0;
  uint64_t idle_probes = 0;  // probes of silent idle connections (idle_probe_interval)
  // ServerOptions::park_windows: connections whose receive window is parked now, and knocks
  // heard from parked clients (each opened a window, at once or once a floor was free).
  uint64_t parked_windows = 0;
  uint64_t knocks_heard = 0;
  // The shared receive queues' low-water reports from the device (their pollers fell behind the
  // arrivals, or the slot pool ran dry: transport/shared_receive_queue.h, "Low water"), and the
  // device's own events read so far (transport/async_events.h): its port going down and coming
  // back, queue pairs it failed. The device's are the process's, whatever server reads them.
  uint64_t shared_queue_low_reports = 0;
  uint64_t device_port_down = 0;
  uint64_t device_port_active = 0;
  uint64_t device_queue_pair_errors = 0;
  // Peer authentication (ServerOptions::listener.connection.auth_keys; transport/auth.h):
  // connections whose client proved its key, and requests or handshakes refused, by why: no key
  // presented, a key this server does not hold (a client not moved yet after a rotation), a key
  // presented to a server without keys, a replayed nonce, a tag that did not match, and a client
  // that did not send its tag (another frame first, a hang-up, listener.handshake_timeout).
  uint64_t authenticated = 0;
  uint64_t auth_refused_no_key = 0;
  uint64_t auth_refused_unknown_key = 0;
  uint64_t auth_refused_unexpected_key = 0;
  uint64_t auth_refused_replay = 0;
  uint64_t auth_refused_bad_tag = 0;
  uint64_t auth_refused_no_tag = 0;
  uint64_t streams_started = 0;  // streaming calls whose handler thread started
  uint64_t streams_open = 0;     // of those, not finished yet
  uint64_t streams_refused = 0;  // past max_streams_per_connection or max_streams
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
  // Memory registrations made on the server's device since it opened (each a system call that
  // pins pages; the device is the process's, shared with its channels of the same options): the
  // application's RegisterMemory, staging memory as it grows, request payloads pulled into the
  // runtime's memory, and response payloads exposed for pulling that need a region of their own
  // (unregistered bytes; on rxe, a part of a registration: rpc/WIRE.md). A response pulled from
  // memory registered in advance adds none.
  uint64_t memory_registrations = 0;
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
  // thread (true) or on the handler pool (false). Before Start. kNotFound for an unknown method,
  // kInvalidArgument for a streaming one asked to run inline (its handler has a thread of its
  // own).
  absl::Status SetInline(absl::string_view method, bool inline_handler);
  // Starts listening. kFailedPrecondition when called twice or after Shutdown.
  absl::Status Start();
  // What the health service (ServerOptions::health_service) answers for `service`: a service's
  // full name ("package.Service"), or "" for the server as a whole. Start makes "" and every
  // service added SERVING unless this said otherwise first; any name may be set, at any time,
  // from any thread, and its watchers hear of it. After Shutdown began, does nothing (everything
  // is NOT_SERVING then). Without the health service, does nothing.
  void SetServingStatus(absl::string_view service, bool serving);
  // See the top of this file.
  void Shutdown(absl::Duration grace);

  // The port it listens on (after Start), and the address.
  uint16_t port() const;
  std::string address() const;
  ServerStats stats() const;
  // Replaces the keys clients must present (transport/auth.h), from the next connection on, so
  // that a key rotates without a restart: accept the old and the new, move the clients to the
  // new, then drop the old. Connections open stay open. Empty: no authentication from then on.
  // Before Start it replaces listener.connection.auth_keys. kInvalidArgument for keys that
  // AuthKeyring refuses (an id of 0 or given twice, a secret not of 16 to 64 bytes): the keys stay
  // as they were. kFailedPrecondition after Shutdown.
  absl::Status SetAuthKeys(std::vector<transport::AuthKey> keys);
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
  Server(std::unique_ptr<internal::ServerImpl> core, std::string metrics_address);
  std::unique_ptr<internal::ServerImpl> impl_;
  const std::string metrics_address_;
  // After impl_, so that it stops (and renders no more) before the core goes.
  mutable absl::Mutex metrics_mu_;
  std::unique_ptr<MetricsHttpServer> metrics_http_ ABSL_GUARDED_BY(metrics_mu_);
};

}  // namespace zrpc

#endif  // ZRPC_RPC_SERVER_H_
