// ClientChannel: calls a server's services over RDMA.
//
//   auto channel = zrpc::CreateChannel("198.18.0.1:7471", zrpc::ChannelOptions{});
//   Greeter::Stub stub(channel->get());
//   absl::Status s = stub.SayHello(request, &reply, zrpc::CallOptions::Timeout(absl::Seconds(1)));
//
// Connections. A channel keeps `connections` connections to its server (default 1), each on one
// of its `pollers` poller threads, and spreads calls over them round robin; calls on one
// connection are multiplexed by call id (call_table.h). Connections are made on demand: the
// first call connects (on the caller's thread, bounded by connect_timeout and the call's
// deadline), and a connection that fails fails its calls with UNAVAILABLE and is made again by
// the next call. Reconnection backs off exponentially with jitter: after the n-th failed attempt
// in a row, calls fail fast with UNAVAILABLE (quoting the last error) until a delay drawn
// uniformly from [d/2, d] has passed, d = min(reconnect_backoff_max,
// reconnect_backoff_initial * 2^(n-1)). So a client facing a dead server neither spins nor gives
// up; stats() shows attempts, failures and the current delay. A call with
// CallOptions::wait_for_ready waits out the backoff instead of failing (call_options.h).
//
// Cancellation: CallOptions::cancellation (generated_api.h) ends a call with CANCELLED and tells
// the server.
//
// Retries (ChannelOptions::retry). A unary call to a method its .proto marks safe to repeat
//
//   rpc Get(GetRequest) returns (GetReply) { option idempotency_level = IDEMPOTENT; }
//
// (or NO_SIDE_EFFECTS) that fails UNAVAILABLE is made again: by default up to 3 attempts in
// all, the n-th retry after a wait drawn from [d/2, d], d = min(max_backoff,
// initial_backoff * 2^(n-1)) (50 ms, 100 ms; at most 1 s). UNAVAILABLE is a call that found no
// connection, or lost its connection while it was out, so it may have run: which is why only
// idempotent methods are retried, and a method not marked so never is. The attempts share the
// call's deadline: a wait that would pass it ends the call with the last attempt's error. A
// Cancellation ends the call at once, waiting or not; destroying the channel ends a waiting call
// with CANCELLED. Not retried: streams, methods with a request payload (its bytes are the
// caller's, sent once), calls with a response_destination. A retried method's request is kept,
// serialized (one copy per call), until the call ends; the later attempts are made on a thread of
// the channel's own (they may connect, but never wait for a connection as wait_for_ready does: the
// backoff stands for that wait), started with the first retry. Interceptors see each
// attempt as a call of its own. stats().retries counts the retries scheduled.
//
// Liveness: keepalives (ChannelOptions::keepalive_*) close a connection whose server stopped
// answering; a server process that dies is noticed at once (its kernel disconnects).
//
// Deadlines. A call fails with DEADLINE_EXCEEDED at its deadline whether or not the server
// answers: a timer thread sleeps until the earliest deadline of any call in flight (the
// channel's own, or one its poller group's channels share: ChannelOptions::poller_group).
// The server is told (a cancel message), and a response that arrives afterwards is dropped, its
// receive slot and payload released at once (the call's id is stale: call_table.h).
//
// Threads. Any number of threads may call at once, blocking (the stub's plain methods) or
// asynchronously (Async*: `done` runs once, on a poller thread or the timer thread, or for a
// retried call the channel's retrier thread; it must not block or make a blocking call on this
// channel, which would wait for the thread it runs on).
// The channel must outlive its calls' callbacks: destroying it fails the calls still in flight
// with CANCELLED, runs their callbacks, and returns after the last one. A channel destroyed from
// one of its own callbacks (a poller or the timer thread) is torn down the same way on a thread
// of the runtime's once that callback returns, and the destructor returns at once. Received
// payloads (IncomingBulk) may outlive the channel: each keeps what its release needs.
#ifndef ZRPC_RPC_CHANNEL_H_
#define ZRPC_RPC_CHANNEL_H_

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "rpc/call_options.h"
#include "rpc/impl/call_interfaces.h"
#include "rpc/metrics.h"
#include "rpc/options.h"
#include "rpc/registered_memory.h"

namespace zrpc {

namespace internal {
class ChannelImpl;
}  // namespace internal

struct ChannelStats {
  uint64_t connect_attempts = 0;
  uint64_t connect_failures = 0;
  uint64_t connections_lost = 0;  // open connections that failed later
  uint64_t calls_in_flight = 0;
  uint64_t deadlines_exceeded = 0;
  // Answers the server sent, not knowing the call had ended here (its deadline passed while the
  // answer was on the way, or a cancel crossed it), dropped. Calls the server knew were given up
  // get no answer at all (ServerStats::answers_dropped), so they are not counted here.
  uint64_t late_responses = 0;
  uint64_t protocol_violations = 0;  // connections closed because the server broke the protocol
  absl::Duration backoff = absl::ZeroDuration();  // the current reconnection delay, if failing
  // The largest request or response (serialized bytes) that goes in a message slot on the
  // connection made last: the smaller of this channel's and the server's receive slots, less 40
  // bytes of headers and 16 kept for a pull descriptor (a mismatch is logged once, at connect,
  // as a warning). Larger messages, up
  // to ChannelOptions::max_message_size, travel as payloads. 0 before the first connection.
  uint64_t max_slot_message = 0;
  // The idle keepalive interval the server asked for in its accept reply on the connection made
  // last (ServerOptions::idle_keepalive_budget; rpc/WIRE.md, "Accept data"): zero for none. Its
  // answers to pings may ask for another later; the channel waits at most
  // max_idle_keepalive_interval whatever it asks.
  absl::Duration server_idle_advice = absl::ZeroDuration();
  // Request payload bytes copied into staging memory (from unregistered bytes), and those the
  // NIC sent straight from memory registered with RegisterMemory: an application whose payloads
  // should be zero-copy sees it here. staging_bytes_registered is the staging memory registered
  // now (at most ChannelOptions::staging_bytes).
  uint64_t bulk_bytes_staged = 0;
  uint64_t bulk_bytes_zero_copy = 0;
  uint64_t staging_bytes_registered = 0;
  // Memory held now by response payloads pulled from the server (being read, or IncomingBulk
  // not yet released): at most ChannelOptions::max_pulled_bytes.
  uint64_t pulled_bytes_held = 0;
  // Memory registrations made on the channel's device since it opened, as ServerStats has them:
  // a request pulled from memory registered in advance adds none.
  uint64_t memory_registrations = 0;
  // Response payloads being pulled now (RDMA READs under way), into the runtime's memory or a
  // caller's response_destination.
  uint64_t bulk_reads_in_flight = 0;
  // Calls started on a runtime thread (a callback) that found every send slot taken and waited
  // in their connection's queue for one, instead of being refused (THREADING.md).
  uint64_t calls_waited_for_slot = 0;
  // Retries scheduled (ChannelOptions::retry; "Retries" above): each wait for a next attempt
  // counts once, made or not (a cancel or the channel's end may come first).
  uint64_t retries = 0;
  // What the channel's pollers hold for receiving (ChannelOptions::shared_receive_queue and
  // arena_pool, kBySize resolved by the channel's size): the receives their shared queues post (0:
  // each connection posts its own), and the response arenas they may lend (0: each connection
  // registers its own), of which arenas_registered are registered now and arenas_lent lent.
  uint64_t shared_receives = 0;
  uint64_t arena_pool = 0;
  uint64_t arenas_registered = 0;
  uint64_t arenas_lent = 0;
};

class ClientChannel final : public Channel {
 public:
  ~ClientChannel() override;

  // Registers [data, data + size) on this channel's device, once, so that request payloads from
  // it are sent with no copy (rpc/registered_memory.h). The bytes must outlive the handle and
  // every payload made from it. Memory registered on one channel (or server) can be sent from
  // any channel or server with the same device options.
  absl::StatusOr<RegisteredMemory> RegisterMemory(void* data, size_t size);
  // Connects every connection now instead of on the first calls, trying again after each
  // backoff until `deadline` while attempts fail for reasons that may pass (nothing listening
  // yet, a handshake that timed out, a full server): a client started beside its server waits
  // for it. An error that will not pass (an address that does not resolve, an incompatible
  // server) returns at once. The first connection's error, if any; DEADLINE_EXCEEDED, quoting
  // the last attempt's error, when the deadline comes first. Up to 16 connections are made at
  // once, each on a thread that lasts as long as Connect.
  absl::Status Connect(absl::Time deadline);
  ChannelStats stats() const;
  // Per-method client metrics (calls, status codes, bytes, latency); PrometheusText() for scrapes.
  const Metrics& metrics() const;
  const std::string& target() const;

 private:
  friend absl::StatusOr<std::unique_ptr<ClientChannel>> CreateChannel(
      absl::string_view target, const ChannelOptions& options);
  // Makes a retried call's later attempts through a ClientChannel of its own (rpc/client/retry.h).
  friend class internal::ChannelImpl;

  // Channel's calls, for generated stubs (rpc/impl/call_interfaces.h says what each does).
  absl::StatusOr<SendSlot> AcquireSendSlot(const MethodInfo& method, size_t size,
                                           const CallOptions& options) override;
  // AcquireSendSlot's work, once the channel's interceptors (if any) have run: inlined into it,
  // so that a channel without interceptors pays no call of its own for them.
  absl::StatusOr<SendSlot> AcquireSlot(const MethodInfo& method, size_t size,
                                       const CallOptions& options);
  // StartUnaryCall for a call a retry may make again: its first attempt, with `slot` (its
  // ticket) and `done` taken. False, nothing taken: not such a call (nor one with a payload,
  // `request_bulk`).
  bool StartRetried(const MethodInfo& method, SendSlot slot, bool request_bulk,
                    ::google::protobuf::MessageLite* response, IncomingBulk* response_bulk,
                    const CallOptions& options, DoneCallback& done);
  // AcquireSendSlot through the interceptors.
  absl::StatusOr<SendSlot> AcquireIntercepted(const MethodInfo& method, size_t size,
                                              const CallOptions& options);
  void StartUnaryCall(const MethodInfo& method, SendSlot slot, OutgoingBulk request_bulk,
                      ::google::protobuf::MessageLite* response, IncomingBulk* response_bulk,
                      const CallOptions& options, DoneCallback done) override;
  internal::BlockingWait blocking_wait() const override;
  std::unique_ptr<ClientStreamCall> OpenStream(const MethodInfo& method, SendSlot slot,
                                               const google::protobuf::MessageLite* read_prototype,
                                               google::protobuf::MessageLite* response,
                                               const CallOptions& options) override;

  // `retry_front`: the one a channel's retries make their attempts through (rpc/client/retry.h),
  // which starts calls as they are, retrying none itself.
  explicit ClientChannel(std::unique_ptr<internal::ChannelImpl> core, bool retry_front = false);
  std::unique_ptr<internal::ChannelImpl> impl_;
  const bool retry_front_;
  const std::chrono::nanoseconds blocking_spin_;  // ChannelOptions::spin
  const bool intercepted_;                        // ChannelOptions::interceptors is not empty
};

// A channel to `target`, "host:port" (an IPv6 address in brackets: "[fe80::1]:7471"). Checks
// the target and options, opens the device and starts the threads; connects on the first call
// (or Connect). kInvalidArgument for a malformed target or options.
absl::StatusOr<std::unique_ptr<ClientChannel>> CreateChannel(absl::string_view target,
                                                             const ChannelOptions& options);

}  // namespace zrpc

#endif  // ZRPC_RPC_CHANNEL_H_
