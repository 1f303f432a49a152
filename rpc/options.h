// ChannelOptions and ServerOptions: everything an application sets on a channel or a server, and
// the transport's options they hold (transport/options.h: connection, poller, slots, listener;
// transport/device_config.h: which device).
//
// Contract: plain values, read once by CreateChannel or Server::Create, which check them and
// answer kInvalidArgument naming the option that is out of range. Changing a copy afterwards
// changes nothing. Including this header brings no verbs header: applications that only set
// options compile without rdma-core's headers in their include path.
#ifndef ZRPC_RPC_OPTIONS_H_
#define ZRPC_RPC_OPTIONS_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "rpc/bulk.h"
#include "rpc/interceptor.h"
#include "rpc/service.h"
#include "transport/device_config.h"
#include "transport/options.h"

namespace zrpc {

// RuntimeOptions::shared_receive_queue and arena_pool set to this are chosen by the side's size:
// a channel's default (ChannelOptions: by the connections it puts on a poller), and on a server
// its defaults.
inline constexpr uint32_t kBySize = ~uint32_t{0};

// What a channel and a server both set: the device and its registered memory, the pollers, the
// limits on what a peer may send, and streams' flow control. Each field means the same on both
// sides; "this side" is the channel or the server the options are for.
struct RuntimeOptions {
  // The device; unset: from the environment (ZRPC_RDMA_*), else the first active one.
  std::optional<transport::DeviceConfig> device;
  // Poller threads; connections are spread over them. In [1, 64]. On a server, those it starts
  // with: it adds more as connections fill them, up to ServerOptions::max_pollers (16).
  int pollers = 1;
  // kEvent sleeps when idle; kBusy spins a core per poller for the lowest latency.
  transport::PollMode poll_mode = transport::PollMode::kEvent;
  // The most a thread polls for its next work before it sleeps: a poller in kEvent after its
  // last completion, on a channel a blocking call (the stub's synchronous form, either mode) for
  // its answer, on a server an idle handler-pool worker for its next task. Within it each polls
  // for about twice its recent waits, and hardly at all while they outlast it (adaptive polling: a
  // message caught polling costs no wake-up; THREADING.md). Zero: sleep at once. In [0, 1s].
  absl::Duration spin = absl::Microseconds(50);
  // Receives of one queue that every connection of a poller shares (transport/
  // shared_receive_queue.h), or 0 for each connection's own: 4096 by default on a server (16 MiB
  // of 4 KiB slots per poller, cut to half the room RLIMIT_MEMLOCK leaves, with a warning); on a
  // channel kBySize by default: its connections keep their own receives (the fewest instructions
  // a call) while it puts at most kOwnReceivesPerPoller (16) on a poller, and beyond that share a
  // queue backing their floors (4/3 of connections per poller x idle_recv_credits, at least
  // 1,024: 4 MiB of slots per poller), so that a fan-out channel scales too. With it an
  // idle connection keeps no receive posted: each poller's queue holds this many pool slots, the
  // windows its connections grant their peers are claims on them that never sum to more (each
  // from a floor, the connection options' idle_recv_credits, 3 by default, up to recv_credits,
  // 32, while its peer uses it: transport/credits.h), and a poller takes connections while their
  // floors fit in three quarters of it (the other quarter is for windows to grow into:
  // transport/receive_budget.h); a server lowers its admission limit to match. At least one floor
  // (a server) or a floor for each of the connections a channel puts on a poller (connections /
  // pollers, rounded up), or creating the server or channel fails; at most half a poller's
  // completion queue, and the device's max_srq_wr. A device without shared receive queues gets
  // receives per connection instead (and a server's windows do not park), said once a process.
  uint32_t shared_receive_queue = 0;
  // Receive arenas lent on demand (transport/arena.h, "Loans"): each poller of a server lends
  // its connections up to this many arenas of listener.connection.arena_size, each registered
  // when first lent and kept, and an idle connection registers none (it borrows one while its
  // client writes bulk payloads into it; a poller short of them recalls idle loans). 64 by
  // default (16 MiB per poller at most with 256 KiB arenas, cut to a quarter of the room
  // RLIMIT_MEMLOCK leaves, with a warning), 0: each connection registers an arena of its own. A
  // device without type-2 memory windows cannot scope a loan to one connection: there each
  // connection registers its own, and the process says so once. A channel lends its
  // connection.arena_size arenas (for the server's response payloads) the same way; kBySize by
  // default: its own arena per connection up to kOwnReceivesPerPoller connections per poller, 64
  // lent beyond (a connection's first response payload then waits one round trip for its loan).
  uint32_t arena_pool = 0;
  // A server with shared_receive_queue: once every poller it may start (max_pollers) holds as
  // many connections as its queue's floors back, further connections are admitted parked, with
  // no receive credit, up to what the completion queues hold, instead of refused
  // (transport/credits.h, "Parked windows"). A parked client's first message waits for a floor:
  // about a millisecond when one is free, else until a connection idle for 10-20 ms gives its
  // floor up. No peer that keeps to its credits meets receiver-not-ready either way. Off by
  // default; refused without shared_receive_queue, and on a channel (its pollers accept no
  // connections); off, said once, on a device without shared receive queues.
  bool park_windows = false;
  // The device's registered message slots, shared with the process's other servers and
  // channels that ask for the same: slot_size bounds the largest message (request or response,
  // 40 bytes of headers included) and must match the peer's.
  transport::SlotPoolOptions slots;
  // Registered memory for staging outgoing payloads from unregistered bytes
  // (rpc/bulk/staging.h). One connection stages at most what its peer's arena holds; payloads
  // beyond wait for that connection's earlier ones.
  size_t staging_bytes = size_t{64} << 20;
  // The largest request or response message (serialized protobuf bytes) this side sends or
  // takes, at most 2 GiB - 1 (protobuf's own bound). One that does not fit a message slot
  // travels at the front of a bulk payload, written into the peer's arena or pulled from this
  // side's memory like one (rpc/WIRE.md, "Messages larger than a slot"), with no option to set
  // on either side; past this limit the call fails with RESOURCE_EXHAUSTED naming the option,
  // before any byte moves (a sender's own limit) or before the message is read (a receiver's).
  uint64_t max_message_size = uint64_t{4} << 20;
  // Bulk payloads larger than the peer's arena are pulled by this side with RDMA READ into
  // memory it allocates and registers per payload (rpc/WIRE.md, "Pulled payloads"): one is at
  // most max_bulk_size bytes (at most 4 GiB - 1), and all those pulled and not yet released at
  // most max_pulled_bytes together (a cap: nothing is allocated in advance). Past either, the
  // call fails with RESOURCE_EXHAUSTED naming the option, before any byte moves.
  uint64_t max_bulk_size = uint64_t{1} << 30;
  uint64_t max_pulled_bytes = uint64_t{4} << 30;
  // Messages of the peer's a stream holds unread before the peer must wait (per-stream flow
  // control: rpc/stream/stream_state.h); at least 1. Memory per stream: this many parsed
  // messages.
  uint16_t stream_window = 16;
};

// A channel's options (rpc/channel.h), beside the shared ones.
struct ChannelOptions : RuntimeOptions {
  // Receives and arenas chosen by the channel's size (kBySize, above).
  ChannelOptions() {
    shared_receive_queue = kBySize;
    arena_pool = kBySize;
  }
  // Hooks around every call (rpc/interceptor.h, ClientInterceptor): their OnCallStart in this
  // order as each call starts, OnCallEnd in reverse once it ends. Shared by every call, from many
  // threads; none may be null (CreateChannel refuses). Empty (the default) costs a load and a
  // branch per call.
  std::vector<std::shared_ptr<ClientInterceptor>> interceptors;
  // The most connections per poller that keep their own receives and arenas under kBySize.
  static constexpr int kOwnReceivesPerPoller = 16;

  // Channels of one process that name the same group share its pollers (threads, completion
  // queues, shared receive queues, arena pools: rpc/client/poller_group.h), so that a client with
  // a channel to each of many servers pays for pollers once. The first channel to join makes them
  // from its options; one that asks for other ones (device, slots, pollers, poll_mode, spin,
  // shared_receive_queue, arena_pool, and connection.arena_size when there is a pool) is refused
  // with both named. The group cuts its queue and pool to RLIMIT_MEMLOCK when it is made, as a
  // server does; ChannelStats then shows the group's figures.
  // In a group kBySize means a server's sizes (a shared queue of 4,096 receives, 64 arenas)
  // whatever the channel's size, and a connection goes to the group's next poller with room for
  // it (connects fail, and back off, while none has). The pollers stop when the group's last
  // channel is destroyed. The group's channels share one timer thread too (deadlines,
  // keepalives; their keepalive passes fall on a grid of a twentieth of keepalive_interval, at
  // most 50 ms, so they share its wake-ups); each keeps its own staging pool. Empty (the
  // default): the channel's own pollers and timer thread.
  std::string poller_group;

  // Connections to the server; calls are spread over them round robin. In [1, 1024]. One lost
  // while another is open is made again in the background (after a wait drawn from
  // [reconnect_backoff_initial / 2, reconnect_backoff_initial], then its backoff), so a
  // restarted server gets all of them back; while none is open, calls connect on demand.
  int connections = 1;
  // Each connection's options (arena_size bounds the largest response payload it takes).
  transport::ConnectionOptions connection;
  // One connection attempt, at most (the call's deadline may cut it shorter).
  absl::Duration connect_timeout = absl::Seconds(3);
  // Calls in flight per connection; more fail with RESOURCE_EXHAUSTED.
  uint32_t max_calls_per_connection = 4096;
  // Reconnection backoff (rpc/channel.h, "Connections").
  absl::Duration reconnect_backoff_initial = absl::Milliseconds(50);
  absl::Duration reconnect_backoff_max = absl::Seconds(5);
  // Retries (rpc/channel.h, "Retries"): a unary call to a method the .proto marks idempotent
  // (option idempotency_level = IDEMPOTENT or NO_SIDE_EFFECTS) that fails UNAVAILABLE is made
  // again, up to `max_attempts` attempts in all (1: none again; at most 10), the n-th retry after
  // a wait drawn from [d/2, d], d = min(max_backoff, initial_backoff * 2^(n-1)), within the call's
  // deadline. Nothing else is retried: not a stream, not a method with a request payload, not a
  // call with a response_destination, and never a method not marked idempotent (its call may
  // have run).
  struct Retry {
    int max_attempts = 3;
    absl::Duration initial_backoff = absl::Milliseconds(50);
    absl::Duration max_backoff = absl::Seconds(1);
  };
  Retry retry;
  // Liveness: a connection with calls in flight that received nothing for keepalive_interval
  // sends a ping; a ping unanswered within keepalive_timeout closes the connection (its calls
  // fail UNAVAILABLE). A server whose handlers hold the whole window (slow calls) or whose
  // answers wait for arena space this side holds (IncomingBulk not released) is busy, not dead:
  // its NIC is probed instead, without a credit. A host that vanished under calls fails the ping
  // or the probe through the transport's retries (connection.ack_timeout_exponent and
  // retry_count: 1.9 s by default), so its calls end within one to two intervals + 1.9 s: 2.2 to
  // 2.5 s at the defaults, under the 3 s tests/hosts holds a killed host and a one-way partition
  // to. A hung process is noticed within one to two intervals + timeout. keepalive_interval zero:
  // no keepalives at all.
  absl::Duration keepalive_interval = absl::Milliseconds(300);
  absl::Duration keepalive_timeout = absl::Seconds(2);
  // A connection with nothing in flight is checked the same way once it received nothing for
  // idle_keepalive_interval (each time from [3/4, 1] of it, so that connections made together
  // spread their pings), at least keepalive_interval; a channel checks at most 256 idle
  // connections a second (rpc/client/keepalive.h). A server may ask for a longer
  // interval in its answers (ServerOptions::idle_keepalive_budget), up to
  // max_idle_keepalive_interval. So a dead server is noticed on an idle connection within about
  // the interval in force + keepalive_timeout, and ten thousand idle connections cost their
  // server about 20 pings a second (its default budget), not 500. Zero: idle connections are
  // never pinged (the server then probes their NIC now and then, ServerOptions::
  // idle_probe_interval, and closes a connection that never said a word).
  absl::Duration idle_keepalive_interval = absl::Seconds(20);
  // The longest idle interval a server's advice (ServerOptions::idle_keepalive_budget) may make
  // this side wait between checks of an idle connection: a server cannot talk a client out of
  // noticing that it vanished for longer than this. At or below idle_keepalive_interval, the
  // advice is ignored.
  absl::Duration max_idle_keepalive_interval = absl::Minutes(10);
};

// A server's options (rpc/server.h), beside the shared ones.
struct ServerOptions : RuntimeOptions {
  // A server shares each poller's receives among its connections by default: an idle connection
  // then holds one slot and one completion-queue entry instead of a window's worth.
  ServerOptions() {
    shared_receive_queue = 4096;
    arena_pool = 64;
  }

  // Where to listen: an address of the RDMA device (empty: the device's own address) and a port
  // (0: any free one; port() says which).
  std::string address;
  uint16_t port = 0;
  // Pollers added as connections come: a connection is placed on the next poller with room for
  // it (Poller::Capacity: its completion queue's entries and, with shared_receive_queue, that
  // queue's floors), and when none has, the server starts another, up to max_pollers, so that a
  // server sized for thousands of clients holds the pollers (threads, queues, a shared receive
  // queue's slots) of the hundreds it has. Pollers are never taken back before Shutdown. Admission
  // (listener.max_connections) counts what max_pollers hold. In [0, 64]; at or below `pollers`:
  // `pollers`, none added. With the default shared receive queue of 4096, 16 pollers hold 16,384
  // connections (floors of 3 in three quarters of each queue) and their queues 65,536 slots.
  int max_pollers = 16;
  // Threads of the handler pool (methods not marked inline run there). In [1, 1024].
  int handler_threads = 4;
  // Run every method inline on the poller thread unless overridden (SetInline). Streaming
  // methods never run inline. An AsyncService's unary methods run inline whatever this says
  // (their handlers return at once), unless SetInline(method, false) moves one to the pool.
  bool inline_by_default = false;
  // Streams (rpc/streaming.h): each streaming handler of a Service runs on a thread of its own,
  // at most max_streams_per_connection per connection and max_streams in the whole server; a
  // stream past either is refused with RESOURCE_EXHAUSTED naming the option. An AsyncService's
  // streaming handlers need no thread: they count against max_streams_per_connection only.
  // Each at least 1.
  int max_streams_per_connection = 16;
  int max_streams = 256;
  // Hooks around every call (rpc/interceptor.h): their OnCallStart in this order before each
  // handler, OnCallEnd in reverse once it is answered. Shared by every call, from many threads;
  // none may be null (Create refuses). Empty (the default) costs a load and a branch per call.
  std::vector<std::shared_ptr<ServerInterceptor>> interceptors;
  // Accepting: handshake deadline, admission limits, and every connection's options (its
  // arena_size bounds the largest request payload a client can send). max_connections is
  // lowered to what the pollers can hold (Poller::Capacity: completion-queue entries and shared
  // receive queues) and to what RLIMIT_MEMLOCK lets the process register (a warning says what to
  // set; transport/process_limits.h), and then max_connections_per_peer to half of that, so that
  // one address can never fill it. Otherwise max_connections_per_peer (512 by default) is halved
  // the same way unless it is set to max_connections or more: then it is taken to mean it (a
  // proxy in front of every client, a one-host test) and stands at max_connections.
  transport::ListenerOptions listener;
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
  // Liveness, checked by a thread of the server's. Every connection's client is checked now and
  // then, and a client host that vanished without a word loses its connections (slots, arena and
  // admission place go back); a live client keeps them however quiet it is:
  //  - a connection that holds calls (looked at every half liveness_probe_interval) and received
  //    nothing for liveness_probe_interval has its client's NIC probed (a zero-length RDMA WRITE:
  //    no credit, no work for the client's process), and again each further interval of silence:
  //    a client host that vanished fails the probe after the transport's retries (1.9 s), the
  //    connection fails, and its calls are marked cancelled (ServerContext::IsCancelled) instead
  //    of running for nobody. A connection whose client spoke (any message but a ping: a call, a
  //    stream frame, a cancel) and then went silent that long is probed once, calls or not: so a
  //    break that leaves the server nothing unacknowledged (a one-way partition toward it, under
  //    calls it answers at once) is found within about 2.5 s at the defaults, as the client finds
  //    it (the same interval as ChannelOptions::keepalive_interval: a zrpc client waiting for
  //    answers pings before a probe is due). A client that pauses between bursts costs one probe
  //    a pause. Zero: never.
  //  - a connection that holds none and received nothing for idle_probe_interval, or for half as
  //    long again as the idle interval this server asks its clients to keep (its keepalive
  //    advice, below; the longer of what it asks now and what it last asked of that client) when
  //    that is longer, is probed the same way, and again each time it stays silent that long. A
  //    zrpc client that follows the advice pings before then, so its idle connections are never
  //    probed; one with keepalives off is probed, at the same bounded rate. A connection that
  //    never received a message at all (a peer that connected and said nothing) is closed
  //    instead, at idle_probe_interval (the accept reply asks a client for its first check
  //    within two thirds of it). Idle connections are looked at every eighth of the shorter of
  //    idle_probe_interval and max_connection_idle, not every pass. Zero: never.
  absl::Duration liveness_probe_interval = absl::Milliseconds(300);
  absl::Duration idle_probe_interval = absl::Minutes(5);
  // A connection that held no calls and received nothing for this long is closed, its client
  // alive or not (gRPC's MAX_CONNECTION_IDLE): for a server that would rather its idle clients
  // reconnect when they call again than hold their place. Pings count as words (unlike gRPC's),
  // so clients with keepalives on keep their connections: the server's advice asks them for at
  // most a third of this, and it should stay well above their idle_keepalive_interval. Zero (the
  // default): never.
  absl::Duration max_connection_idle = absl::ZeroDuration();
  // The keepalive pings a second this server asks its idle clients to keep to, all together: its
  // answer to a ping carries an idle interval of (open connections / this) seconds, and a zrpc
  // client checks an idle connection no more often than that (ChannelOptions::
  // idle_keepalive_interval is the least it waits, max_idle_keepalive_interval the most). So ten
  // thousand idle connections cost the server about 20 pings a second (one every 500 s each), not
  // 500 (rpc/WIRE.md, "Keepalive"; benchmarks/README, "Idle connections"). Zero: no advice
  // (clients keep their own interval). At least 0.
  double idle_keepalive_budget = 20;
  // Serve PrometheusText() at http://<metrics_address>/metrics from Start to Shutdown: "host:port"
  // on a plain TCP interface ("0.0.0.0:9464", "127.0.0.1:0" for any free port; metrics_port()
  // says which). Empty: no endpoint. See rpc/metrics_http.h for what it answers and its bounds.
  std::string metrics_address;
  // Answer the health service, zrpc.health.v1.Health (proto/zrpc/health.proto, the shape of
  // gRPC's grpc.health.v1): Check and Watch for "" (the server) and each service added, SERVING
  // from Start (unless Server::SetServingStatus said otherwise) and NOT_SERVING from the moment
  // Shutdown begins. False: the service is not added, and a client asking gets UNIMPLEMENTED.
  bool health_service = true;
};

}  // namespace zrpc

#endif  // ZRPC_RPC_OPTIONS_H_
