// The client's side of one connection: its calls in flight (a CallTable), the requests it sends
// and the responses it matches to them.
//
// The calls in flight live in the transport connection's serialization domain
// (transport/serial_domain.h): the table and the requests waiting for a send slot change only
// there, with no lock. A thread inside the domain (the poller in its batch: a done-callback
// starting the next call) works on them at once; any other thread enters the domain when it is
// free, or leaves its work there as a task for the thread that holds it, and returns (a
// DomainTask: StartCall, EndCall, ExpireCalls). A call that ends inside the domain on a thread
// that is not the runtime's (an application thread that entered it, or ran what others left)
// runs its DoneCallback after that thread has let go (EndInDomain): a callback there may wait
// for this connection.
//
// A call's life:
//   caller's thread: Channel::AcquireSendSlot picks a connection and a send slot; generated
//     code serializes the request into it; StartUnaryCall -> Start: an id (call_table.h), then
//     in the domain: the call enters the table (id, deadline), the request goes out (payload
//     staged and written first).
//   poller thread: OnMessage -> Receive (header checked, payload paired) -> Take(id): the call,
//     or nothing for a late response (dropped, its memory given back at once) -> response parsed
//     in place into the caller's message, payload handed over as an IncomingBulk -> done.
//   timer thread: Expire -> in the domain, TakeExpired -> done(DEADLINE_EXCEEDED), and a cancel
//     to the server.
//   any thread: Cancellation::Cancel -> CancelCall -> in the domain, Take -> done(CANCELLED),
//     and a cancel.
//   Either of those first withdraws a request payload that has not left (RpcConnection::
//   Withdraw); `done` runs once the payload is released (ClientCall::End). A payload the server
//   may be pulling is not withdrawn under its READ: it stays exposed until the server says
//   pulled (or answers), for at most pull_grace (CallEnded).
//   poller thread, kind pulled: the server has the request's payload: released (ServerPulled).
//   OnClosed: TakeAll -> done(UNAVAILABLE, or CANCELLED when the channel is being destroyed).
// Every call leaves the table exactly once, so `done` runs exactly once whoever wins.
//
// Keepalive. A connection can stay open to a host that is gone (power loss, a cable): RC
// notices only when a work request exhausts its retries, and an idle connection posts none. So
// the channel's timer calls Keepalive every keepalive_interval, and the connection's
// KeepaliveSchedule (keepalive.h) says whether a check is due: when nothing arrived since the
// last pass and the connection has work in flight (or calls timed out since the last pass), or
// nothing arrived for about idle_keepalive_interval and it has none. A due check with no ping out
// sends a ping (a request to the reserved service "zrpc.Keepalive", which every server answers on
// its poller thread, never queued behind handlers) with keepalive_timeout as its deadline, counted
// from its send (StartInDomain: the timer's start may be left in the domain and wait for its holder
// and the poller first). A ping that times out closes the connection, failing its calls with
// UNAVAILABLE and the reason. A peer that died under calls is thus noticed within interval +
// timeout (plus one interval when traffic stopped just after a pass); on an idle connection, within
// about the idle interval in force + timeout: idle_keepalive_interval, or the longer one the
// server asked for (in its accept reply, then in its last answer), at most
// max_idle_keepalive_interval (keepalive.h).
//
// A ping never waits on the application's window. When this side's messages wait for credits
// (the server's handlers hold every receive this side may fill: slow calls, not a dead server)
// or the server's answers wait for arena space this side's application holds, or a large
// payload is being pulled either way or is still being written (READs and WRITEs of megabytes
// that may hold the send queue for seconds),
// a ping would queue behind them and its silence would prove nothing. Then the pass probes the
// server's NIC instead (transport::Connection::Probe: a zero-length RDMA WRITE, no credit): a
// vanished host fails it after the transport's retries and the connection fails with it; a live
// one acks, and the connection stays. A ping that timed out while such a wait began is treated the
// same. So is a pass that finds the connection's domain held (a user's callback on its poller, an
// application thread sending): the timer serves every connection of the channel and never waits
// for one (transport::Connection::TryStats): a busy connection is checked again on the next pass,
// an idle one on its next idle check. An idle connection whose application merely holds received
// payloads is pinged all the same (no call's answer can wait behind its ping), so that the server
// hears from it (ServerOptions::idle_probe_interval).
#ifndef ZRPC_RPC_CLIENT_CLIENT_CONNECTION_H_
#define ZRPC_RPC_CLIENT_CLIENT_CONNECTION_H_

#include <google/protobuf/wrappers.pb.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <deque>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "rpc/client/call_table.h"
#include "rpc/client/keepalive.h"
#include "rpc/common/object_pool.h"
#include "rpc/connection/rpc_connection.h"
#include "rpc/generated_api.h"
#include "rpc/metrics.h"
#include "rpc/stream/stream_state.h"

namespace zrpc::internal {

class ClientConnection;

// What a connection needs from its channel.
class ClientConnectionOwner {
 public:
  // `count` calls ended at their deadline (ChannelStats::deadlines_exceeded).
  virtual void CountExpired(size_t count) = 0;
  virtual StagingPool& staging() = 0;
  virtual std::shared_ptr<ReceiveLimits> receive_limits() = 0;
  // A call with `deadline` entered a table: the timer may need to wake sooner.
  virtual void DeadlineAdded(absl::Time deadline) = 0;
  virtual void CountLateResponse() = 0;
  // A call waited in a connection's queue for a send slot (StartWaiting).
  virtual void CountWaitedForSlot() = 0;
  // The connection closed (after failing its calls); `violation` when this side closed it
  // because the server broke the protocol.
  virtual void ConnectionClosed(ClientConnection* connection, bool violation) = 0;
  // Why calls fail when their connection closes: UNAVAILABLE, or CANCELLED once the channel is
  // being destroyed.
  virtual absl::Status CloseStatus(const std::string& peer, const absl::Status& why) = 0;

 protected:
  ~ClientConnectionOwner() = default;
};

struct ClientCall {
  const MethodInfo* method = nullptr;
  ::google::protobuf::MessageLite* response = nullptr;
  IncomingBulk* response_bulk = nullptr;
  DoneCallback done;
  MethodMetrics* metrics = nullptr;  // null for none (pings carry the channel's keepalive series)
  int64_t start_nanos = 0;           // monotonic (monotonic.h): its metrics count from here
  // For a call with a request payload: the payload's release opens it (rpc_connection.h).
  std::shared_ptr<BulkGate> gate;
  // For a call whose response payload lands in the caller's memory (CallOptions::
  // response_destination): held while a READ writes there.
  BulkDestination destination;
  std::shared_ptr<BulkGate> landing;
  // For a stream (rpc/streaming.h): its messages and flow control; `done` ends it.
  std::shared_ptr<StreamState> stream;
  // The request carries a metadata block in front of its message (CallOptions::metadata).
  bool sends_metadata = false;
  // Where the server's trailing metadata goes (CallOptions::trailing_metadata), or null.
  Metadata* trailing = nullptr;

  // Records the outcome and runs `done`: the one way a call ends. With a request payload the
  // runtime still holds (its WRITE posted, or waiting), the ending waits for the payload's
  // release, and with a READ landing in the caller's destination, for that READ: the caller
  // never gets `done` while the NIC may still read its bytes or write into its memory.
  void End(absl::Status status);
};

extern const MethodInfo kKeepalivePing;  // of kKeepaliveService (rpc_connection.h)

// Bytes of the metadata block a request with `options` carries in front of its message (0:
// none; WIRE.md, "Metadata").
inline size_t RequestMetadataBlock(const CallOptions& options) {
  return options.metadata.empty() ? 0 : MetadataBlock::kPrefix + options.metadata.encoded_size();
}

// A call's times, monotonic (monotonic.h), fixed where the call starts (the channel's
// AcquireSendSlot): the one clock reading a call takes (rpc/common/call_clock.h).
struct CallTiming {
  int64_t start_nanos = 0;                       // the call began: its metrics count from here
  int64_t now_nanos = 0;                         // the latest reading (after a wait, a new one)
  absl::Time deadline = absl::InfiniteFuture();  // StartTiming
};

// The times of a call starting now (the call clock's reading): its deadline is CallOptions'
// deadline (converted from the wall clock, read only when it is set) or timeout, whichever ends
// first.
CallTiming StartTiming(const CallOptions& options);

class ClientConnection final : public RpcConnection,
                               public std::enable_shared_from_this<ClientConnection> {
 public:
  // `pull_grace`: how long a request payload stays exposed after its call ended while the
  // server may still be pulling it (see CallEnded).
  // (Out of line, with the destructor: the start pool's objects are defined in the .cc.)
  ClientConnection(ClientConnectionOwner& owner, uint32_t max_calls, absl::Duration pull_grace,
                   std::shared_ptr<transport::Device> device,
                   std::shared_ptr<transport::Poller> poller);
  ~ClientConnection() override;

  // Takes the connection Connect made; the ClientConnection keeps itself alive until OnClosed.
  void Attach(std::shared_ptr<transport::Connection> connection);
  transport::Connection& connection() { return *connection_; }
  bool open() const { return !closed() && connection_->open(); }
  // OnClosed has begun: the calls are failing or failed.
  bool closed() const { return closed_.load(std::memory_order_acquire); }

  // Sends the request built in `buffer` (`body_size` bytes), or in `large_body` when it did not
  // fit a slot (body_size 0 then), for `call`; `call.done` runs once. A call with a stream opens
  // it, granting the server `stream_window` messages (the stream is marked opened once its
  // request has gone to the transport: StreamState::MarkOpened). Returns the call's id, or 0 when
  // it ended here, before the domain (its `done` has run). The start itself may be left in the
  // domain for the thread that holds it: the call may end there too, later. `large_body`, `bulk`
  // and `call` are taken (by reference, to save the moves of by-value parameters on every call):
  // the caller must not use them after.
  uint64_t Start(uint32_t service_id, const transport::SendBuffer& buffer, size_t body_size,
                 OutgoingBulk&& large_body, OutgoingBulk&& bulk, ClientCall&& call,
                 const CallOptions& options, const CallTiming& timing, uint16_t stream_window = 0);
  // Start for a unary request that found no send slot on a runtime thread, which must not wait
  // for one (THREADING.md): the request, serialized into `body` (malloc'd, `body_size` bytes,
  // owned from here), waits in this connection's queue, in order, and goes when a slot frees
  // (OnSendSlotFree, or the timer's pass). The call is in the table meanwhile: its deadline,
  // a cancel or the connection's end take it as they take any call. Fails RESOURCE_EXHAUSTED
  // past max_calls_per_connection (the table) or kMaxWaitingBytes of waiting requests.
  // With metadata, `body` starts with its `block` bytes, which `body_size` leaves out.
  uint64_t StartWaiting(uint32_t service_id, uint8_t* body, size_t block, size_t body_size,
                        OutgoingBulk&& bulk, ClientCall&& call, const CallOptions& options,
                        const CallTiming& timing);
  // Requests waiting for a send slot: a runtime thread's next call waits behind them, in order.
  size_t requests_waiting() const { return waiting_count_.load(std::memory_order_acquire); }
  // The most bytes of requests one connection keeps waiting for a send slot.
  static constexpr size_t kMaxWaitingBytes = size_t{64} << 20;
  // Ends call `id` with CANCELLED and tells the server; nothing when the call already ended.
  void CancelCall(uint64_t id);
  // Ends call `id` with `status` and tells the server (a cancel); nothing when it already ended.
  void AbortCall(uint64_t id, absl::Status status);
  // Sends a stream's message or control frame (credit, half-close) in a send buffer of its own,
  // waiting for one while every send slot is in flight, until the call ends. Never on a runtime
  // thread (which would wait for itself): there it fails at once. The message, if any, is
  // serialized straight into the buffer. false: not sent (the call has ended or is ended here
  // with the reason). `quota_taken`: the staging quota for a message larger than a slot is
  // taken already (TakeQuotaOrWait); it is given back if the message does not go. `no_slot`
  // (not null: an asynchronous stream's pump): on a runtime thread that finds every slot taken,
  // set, and the call goes on (the caller tries again later: WaitForSlot) instead of ending.
  // `bulk`: a bulk payload beside the message (RpcConnection::SendStreamFrame's).
  bool SendOnStream(uint64_t id, const RpcHeader& header,
                    const google::protobuf::MessageLite* message, StreamState& stream,
                    bool quota_taken = false, bool* no_slot = nullptr,
                    OutgoingBulk* bulk = nullptr);
  // WaitForSendSlot (rpc_connection.h), with the timer's next pass (within a millisecond) as
  // the fallback.
  void WaitForSlot(std::weak_ptr<StreamListener> waiter);
  // One keepalive pass (see the top of this file); spends an idle check of `pass` when it checks
  // an idle connection.
  void Keepalive(KeepalivePass& pass);
  // The timer's pass: fails the calls whose deadline has passed and tells the server (in the
  // domain: at once, or left for its holder), withdraws exposed request payloads whose grace has
  // passed, and sends what waits for a send slot.
  void Expire(absl::Time now);
  // The earliest call deadline or exposed request payload's grace end, as the timer should see
  // it (a call's that ended since may come first: early, never late).
  absl::Time NextDeadline();
  size_t calls_in_flight() const { return calls_.published_size(); }
  // Closes the connection; its calls fail with `reason` (UNAVAILABLE).
  void Close(absl::string_view reason);

  void OnMessage(transport::Connection& connection,
                 const transport::ReceivedMessage& message) override;
  void OnClosed(transport::Connection& connection, const absl::Status& why) override;
  void OnSendSlotFree(transport::Connection& connection) override;
  void OnDeferredFailed(transport::Connection& connection, const RpcHeader& header,
                        const absl::Status& status) override;
  void OnPulled(transport::Connection& connection, IncomingMessage& message) override;
  bool PrepareExposure(uint64_t call_id, BulkGate& gate) override;

 private:
  struct StartRequest;
  struct StartCall;
  struct EndCall;
  struct Ending;
  // The timer's work on the table (Expire), in the domain. One per connection: left at most once
  // at a time (pending_), holding the connection while it is.
  struct ExpireCalls final : transport::DomainTask, transport::ExitTask {
    explicit ExpireCalls(ClientConnection& c) : self(c) {}
    void RunInDomain(transport::Connection& connection) override;
    void AfterExit() override;
    ClientConnection& self;
    absl::Time now;
    std::shared_ptr<ClientConnection> hold;
    std::atomic<bool> pending{false};
  };

  // In the domain: Start's part there (the table, the send), and AbortCall's.
  void StartInDomain(StartRequest& start);
  void AbortInDomain(uint64_t id, absl::Status status, bool tell_server);
  // In the domain: ends `call` with `status`; on a thread that is not the runtime's, after it
  // has let go of the domain (see the top of this file).
  void EndInDomain(ClientCall call, absl::Status status);
  // Runs `task` (a StartCall or an EndCall made for this call) in the domain.
  template <typename Task>
  void RunTask(Task* task);
  // Tells the server call `id` was given up (kCancel); queued for the timer when no send slot
  // is free (see pending_cancels_).
  void SendCancel(uint64_t id);
  // Sends the queued cancels while slots are free (the timer's pass).
  void FlushCancels();
  // Start's common part. With `buffer` the request is sent at once; otherwise `waiting_body`
  // holds it and it waits for a slot (StartWaiting).
  uint64_t Begin(uint32_t service_id, const transport::SendBuffer* buffer, uint8_t* waiting_body,
                 size_t body_size, OutgoingBulk&& large_body, OutgoingBulk&& bulk,
                 ClientCall&& call, const CallOptions& options, const CallTiming& timing,
                 uint16_t stream_window);
  // Drops the waiting requests whose calls have ended, then sends the others, in order, while
  // send slots are free; asks the transport for a notice when they run out.
  void SendWaiting();
  // The connection closed: every waiting request is dropped (its call ends with the rest).
  void DropWaiting();
  // Call `id` was taken from the table by its canceller: its waiting request (if any) is dropped,
  // and nothing else is done on the canceller's thread.
  void DropWaitingCall(uint64_t id);
  // A response or error whose payload (if any) is here: to its call, or dropped as late.
  void Deliver(transport::Connection& connection, IncomingMessage& message);
  void Complete(transport::Connection& connection, IncomingMessage& message, ClientCall& call);
  void OnPingDone(const absl::Status& status, absl::Duration timeout);
  // A stream message or credit from the server.
  void OnStreamFrame(transport::Connection& connection, IncomingMessage& message);
  // A response or error: to its call, once what it carries is here (OnPulled). A stream's end
  // waits (held_ends_) while messages before it are still being pulled.
  inline void OnAnswer(transport::Connection& connection, IncomingMessage& message);
  // A stream message OnStreamFrame pulled has landed: into its place; a held end may go now.
  void StreamPulled(transport::Connection& connection, IncomingMessage& message);
  // This side's messages wait for credits or arena space, or (`arena_counts`) its application
  // holds received payloads, or the domain is held: a ping now could wait behind them (see the
  // top of this file). An idle connection leaves the arena out: no answer of a call can wait for
  // it behind the ping.
  bool WindowHeld(bool arena_counts = true);
  // Whether the connection has work in flight (calls and streams, requests and cancels waiting
  // to go, request payloads exposed or moving) or calls ended at their deadlines since the last
  // pass. Timer thread only.
  bool Busy();
  // Call `call_id`, with a request payload behind `gate`, has ended (answered, deadline,
  // cancel, failure). A payload still exposed then (`exposed`) stays so until the server says
  // it pulled it, or answers the call (it answers only after its READ), or pull_grace passes,
  // whichever comes first: withdrawing it at once would fail the server's READ, and that fails
  // the connection and every other call on it. The call's `done` waits for it, as for any
  // payload the NIC may still read.
  void CallEnded(uint64_t call_id, BulkGate& gate, bool exposed);
  // The server is done with call `call_id`'s request payload (it said pulled, or answered):
  // withdrawn now, whether the call has ended or not.
  void ServerPulled(uint64_t call_id);

  ClientConnectionOwner& owner_;
  // In the domain (see the top of this file): the table; its size and next deadline are
  // published for the timer and stats().
  CallTable<ClientCall> calls_;
  CallIds ids_;
  ExpireCalls expire_;
  // Starts left in the domain by other threads (StartCall): reused, never a malloc in steady
  // state. 64: application threads that start at once while the poller holds the domain.
  ObjectPool<StartCall, 64> start_pool_;
  const absl::Duration pull_grace_;
  // Calls whose request payload is exposed for the server, from just before it is exposed
  // (PrepareExposure) until the server is done with it or the grace after the call's end passes
  // (CallEnded). Looked up by id, not through the call table: a call leaves the table before its
  // ending runs. Requests whose payload is written, not pulled, never enter it.
  struct ExposedRequest {
    std::shared_ptr<BulkGate> gate;
    absl::Time until = absl::InfiniteFuture();  // monotonic; set when the call ends
  };
  absl::Mutex exposed_mu_;
  absl::flat_hash_map<uint64_t, ExposedRequest> exposed_requests_ ABSL_GUARDED_BY(exposed_mu_);
  std::atomic<size_t> exposed_entries_{0};  // its size, read without the lock
  std::shared_ptr<transport::Connection> connection_;
  // In the domain: stream messages being pulled on this connection (while none is, an answer
  // costs no look at its stream), and the ends of streams that arrived while messages before
  // them were still being pulled, by call id (given back on close).
  uint32_t stream_pulls_ = 0;
  absl::flat_hash_map<uint64_t, IncomingMessage> held_ends_;
  absl::Mutex self_mu_;
  std::shared_ptr<ClientConnection> self_ ABSL_GUARDED_BY(self_mu_);  // until OnClosed
  std::atomic<bool> closed_{false};
  absl::Mutex reason_mu_;
  std::string close_reason_ ABSL_GUARDED_BY(reason_mu_);  // why this side closed, if it did

  // Keepalive state: messages received (the poller thread alone writes it, the timer reads), the
  // schedule of checks (timer thread only), and whether a ping is out.
  std::atomic<uint64_t> received_{0};
  // Calls ended at their deadlines (the domain's holder alone writes it), and what the timer saw
  // at its last pass.
  std::atomic<uint64_t> expired_{0};
  uint64_t expired_at_last_pass_ = 0;
  KeepaliveSchedule keepalive_;
  std::atomic<bool> ping_out_{false};
  // One ping at a time; parsed on the poller thread. The server's answer may carry the idle
  // interval it asks for, in milliseconds (rpc/WIRE.md, "Keepalive"): an older server's empty
  // answer reads as zero, no advice.
  google::protobuf::UInt32Value ping_reply_;
  // The last advice, for the timer's passes (KeepaliveSchedule::Due).
  std::atomic<uint32_t> server_idle_interval_ms_{0};

  // Cancels that found no send slot (every one waiting for the server's credits, say), sent
  // again by the timer (Expire) until they go: a server that never hears of a cancel keeps the
  // call, and a stream without a deadline keeps its handler's thread and one of its connection's
  // stream places for as long as the connection lasts. At most max_calls (each call is
  // cancelled once; past that, the oldest are dropped, logged).
  absl::Mutex cancels_mu_;
  std::deque<uint64_t> pending_cancels_ ABSL_GUARDED_BY(cancels_mu_);
  std::atomic<bool> cancels_pending_{false};
  const size_t max_pending_cancels_;
  // Unary requests that found no send slot on a runtime thread (StartWaiting), oldest first.
  struct WaitingRequest {
    uint64_t id;
    RpcHeader header;
    uint8_t* body;  // malloc'd, null for a large body; freed when copied into a slot or dropped
    size_t body_size;
    OutgoingBulk large_body;  // a request larger than a slot (StartWaiting)
    OutgoingBulk bulk;
    absl::Time deadline;
    BulkGate* gate;  // the call's, kept alive by the releases chained to the payloads
    size_t bytes;    // body_size + large_body.size(): its share of waiting_bytes_
    // Frees the body and releases the payloads (which may end the call: never under a lock).
    void Drop() {
      std::free(std::exchange(body, nullptr));
      large_body.Reset();
      bulk.Reset();
    }
  };
  mutable absl::Mutex waiting_mu_;
  std::deque<WaitingRequest> waiting_ ABSL_GUARDED_BY(waiting_mu_);
  size_t waiting_bytes_ ABSL_GUARDED_BY(waiting_mu_) = 0;
  bool sending_waiting_ ABSL_GUARDED_BY(waiting_mu_) = false;     // a SendWaiting is sending
  bool send_waiting_again_ ABSL_GUARDED_BY(waiting_mu_) = false;  // and should look once more
  std::atomic<size_t> waiting_count_{0};  // waiting_.size(), read without the lock
};

}  // namespace zrpc::internal

#endif  // ZRPC_RPC_CLIENT_CLIENT_CONNECTION_H_
