// Connection: one reliable-connected queue pair to a peer, with credits, a receive arena and the
// handler its completions are dispatched to. The RPC runtime's unit of transport.
//
// What moves. Small messages go by RDMA SEND from a pool slot (slot_pool.h) into a RECV the peer
// posted, behind an 8-byte frame header (wire.h); the receiver reads them in place and hands the
// slot back with Release. Bulk payloads go by RDMA WRITE_WITH_IMM from any registered buffer
// straight into the peer's receive arena (arena.h); the immediate says where they landed.
//
// Flow control (credits.h, arena.h). Nothing is posted that the peer cannot take: a SEND or a
// bulk WRITE needs a credit (a RECV the peer posted), a bulk WRITE needs arena space the peer has
// released, and the send queue needs a free entry. What cannot go yet waits in a FIFO (so a bulk
// payload and the message that refers to it stay in order) and goes as soon as credits or space
// come back; nothing is ever dropped or truncated. Credits and arena releases ride back on every
// frame; a side with nothing to send returns them in an explicit credit frame.
//
// Send queue. Invariant fields of the work requests are filled once (wr templates); a SEND that
// fits the device's inline limit is copied into the work request, and its slot is free at once.
// What can go is posted as one chain of up to kPostBatch work requests: one doorbell (one
// ibv_post_send, one provider lock) for a window of sends. Completions are requested
// selectively: every kSignalInterval-th work request, every bulk WRITE (its source buffer is the
// caller's), and the last work request before a pause when something waits on its completion (an
// OnSendDone, or a slot held by a message too long to inline), so that never waits on traffic
// that may not come. A message sent without a token (Send(buffer, length)) is inlined and waits
// on nothing: it is signalled only on the interval, so a ping-pong costs no send completion at
// all. A signalled completion retires every earlier work request, since a send queue completes
// in order; Flush() asks for one behind whatever was left unsignalled.
//
// Completions are handled in batches: the poller hands a connection every completion of one
// ibv_poll_cq run at once (one lock), then dispatches what they produced. Sends the handlers
// make on the poller thread meanwhile are held (corked) until the batch's last handler sends,
// then posted as one chain, as eRPC does with its event loop: a server answering 16 requests
// inline rings one doorbell, and a batch of one request costs its answer no wait at all.
//
// Failure. The first failed completion, a protocol violation by the peer, the peer's disconnect
// (its process died: the kernel disconnects for it) or Close() put the connection in the error
// state: the queue pair is disconnected and a drain marker is posted to the send queue. When it
// has come back and so has every posted RECV (rxe never flushes a RECV posted after the error,
// so the receive queue is counted, not marked), every earlier work request has completed or
// been flushed: each operation not yet reported gets OnSendDone with the error, exactly once,
// and then OnClosed. A drain that has not ended Poller::kDrainGiveUp (3 s) after the failure is
// given up on by the poller's watchdog (GiveUpOnDrain): rxe was seen to lose the flush of
// hundreds of queue pairs' markers when they closed while others connected, which left those
// connections draining for good, their handlers never told, their memory never freed. In the
// error state the device moves no data for the queue pair (without a shared receive queue it
// also goes to reset, dropping what was posted), the drain ends as above, and a warning names
// the connection and its state.
// Messages and payloads that arrive while draining are dropped, except after
// the peer's orderly disconnect: what it sent before hanging up is delivered (before OnClosed),
// however the disconnect event and those completions were ordered in this side's polling.
// A peer that vanishes without a disconnect (its host lost power) is noticed when a work request
// exhausts its retries: (retry_count + 1) tries of 4.096 us x 2^ack_timeout_exponent, 1.9 s at
// the default options (transport/README.md, "Retry timing"); an idle
// connection to such a peer is noticed only once something is posted: Probe() does that without
// a credit (the RPC layer's keepalives and liveness sweep use it).
//
// Threads: one serialization domain per connection (serial_domain.h). A connection's state
// changes only inside its domain, which one thread holds at a time and no thread waits for. The
// poller holds it for a whole completion batch: the handlers run inside it, so their Send,
// WriteBulk and Release touch the state directly (posted after the batch, see above). Any other
// thread's call enters the domain when it is free (a compare-and-swap in, one out: no lock),
// and otherwise leaves its operation to the thread that holds it, which carries it out before it
// lets go, and returns at once: such a call is checked as far as it can be without the state
// (sizes; the connection open) and accepted, and a later failure is reported as for any accepted
// operation (OnSendDone, OnClosed). Reports always come on the poller thread: completions and
// events that another thread's exit produced are handed to the poller (Poller::Defer). stats()
// and DebugString() are the exceptions that wait: diagnostics, they wait for the domain to be
// free (never call them from a handler for another connection). A Connection is shared: the
// poller holds it while it is open; it is destroyed when the last reference goes, which must be
// before its Poller and Device.
#ifndef ZRPC_TRANSPORT_CONNECTION_H_
#define ZRPC_TRANSPORT_CONNECTION_H_

#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/inlined_vector.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "transport/arena.h"
#include "transport/auth_session.h"
#include "transport/cm_util.h"
#include "transport/completion_budget.h"
#include "transport/credits.h"
#include "transport/device.h"
#include "transport/exposures.h"
#include "transport/memory_window.h"
#include "transport/options.h"
#include "transport/park_doors.h"
#include "transport/ring.h"
#include "transport/serial_domain.h"
#include "transport/verbs_owners.h"
#include "transport/wire.h"

namespace zrpc::transport {

class Connection;
class Listener;
class Poller;

// Whether `why`, a connection's close reason (OnClosed), says the peer hung up or its process
// died (its kernel hung up for it): the ordinary end of a connection, as opposed to a fault.
bool IsPeerDisconnect(const absl::Status& why);

// Completions are requested at least every this many work requests (see the header comment).
inline constexpr uint32_t kSignalInterval = 16;
// Work requests posted with one doorbell at most.
inline constexpr uint32_t kPostBatch = 16;

// Completion-queue entries a connection with `options` may need at once at most: every
// send-queue entry and RECV, plus the drain marker and one spare. With a shared receive queue
// (`shared_receives`) its receives are the queue's.
inline uint32_t CqEntriesFor(const ConnectionOptions& options, bool shared_receives = false) {
  return options.send_queue_depth + (shared_receives ? 0 : options.recv_credits) + 2;
}

// Of those, what its poller reserves while it is registered: what it may complete while idle,
// its drain marker and its own RECVs (none with a shared receive queue). Its sends take entries
// from the poller as they go (poller.h, "Capacity"; completion_budget.h).
inline uint32_t CqEntriesReservedFor(const ConnectionOptions& options, bool shared_receives) {
  return 1 + (shared_receives ? 0 : options.recv_credits);
}

// A message received by SEND, in a pool slot. Valid until Connection::Release(handle).
struct ReceivedMessage {
  const uint8_t* data;
  uint32_t size;
  uint64_t handle;
};

// A bulk payload written into this side's arena. Valid until Connection::Release(handle).
struct ReceivedBulk {
  const uint8_t* data;
  uint32_t size;
  uint64_t handle;
};

// A pool slot to build a message in, from AcquireSendBuffer. Send consumes it; so does
// ReleaseSendBuffer if the message is abandoned.
struct SendBuffer {
  uint8_t* data = nullptr;  // where the payload goes (the frame header sits just before it)
  uint32_t capacity = 0;    // payload bytes that fit in the slot and in the peer's RECVs
  uint32_t slot = 0;
};

// A registered source for WriteBulk: [data, data + size) under `lkey`, e.g. from a MemoryRegion
// or a pool slot. It must stay valid and unchanged until OnSendDone for the write.
struct BulkSource {
  const void* data;
  uint32_t size;
  uint32_t lkey;
};

// Memory the peer exposed for this side to RDMA READ (for one transfer): its address and key.
struct RemoteRange {
  uint64_t addr;
  uint32_t rkey;
};

// Work of the layer above that must run inside a connection's domain: state that layer keeps
// per connection (a server's calls, a client's table) then needs no lock of its own, because it
// changes only where the connection's does. Connection::RunInDomain runs it. Intrusive: the
// caller provides the memory (embed it in the object the work is about) and keeps it alive until
// it has run; a task is never copied, queued twice or freed by the connection.
class DomainTask : private DomainOp {
 public:
  DomainTask() { task = true; }
  DomainTask(const DomainTask&) = delete;
  DomainTask& operator=(const DomainTask&) = delete;

  // Runs inside `connection`'s domain: on the caller's thread when it found the domain free (or
  // held it), else on the connection's poller thread, in its pass (RunInDomain). It may call the
  // connection's operations (they run at once) and give its own memory back; it must not block,
  // nor wait for another domain.
  virtual void RunInDomain(Connection& connection) = 0;

 protected:
  ~DomainTask() = default;

 private:
  friend class Connection;
};

// Work of the layer above for after a thread lets go of a connection's domain: on the same thread,
// outside the domain (Connection::RunAfterExit). For what must not run inside it on every thread
// (a user's callback on an application thread, which may wait for this connection), and for
// references whose last release must not come inside it. Intrusive, like DomainTask.
class ExitTask {
 public:
  ExitTask() = default;
  ExitTask(const ExitTask&) = delete;
  ExitTask& operator=(const ExitTask&) = delete;

  // Runs once the thread that held the domain when RunAfterExit was called has let go of it.
  // The connection is alive while it runs; the task may free its own memory.
  virtual void AfterExit() = 0;

 protected:
  ~ExitTask() = default;

 private:
  friend class Connection;
  ExitTask* next_exit_ = nullptr;
};

// What a connection reports, on the poller thread. Implementations must not block for long:
// every connection on the poller waits meanwhile.
class ConnectionHandler {
 public:
  virtual ~ConnectionHandler() = default;
  virtual void OnMessage(Connection& connection, const ReceivedMessage& message) = 0;
  virtual void OnBulk(Connection& connection, const ReceivedBulk& bulk) = 0;
  // A Send or WriteBulk with `token` is done: delivered to the peer's NIC (OK), or failed.
  virtual void OnSendDone(Connection& connection, uint64_t token, const absl::Status& status) = 0;
  // The connection is closed: after Close() (kCancelled) or a failure (the reason). Called
  // once, after every OnSendDone; nothing follows it.
  virtual void OnClosed(Connection& connection, const absl::Status& why) = 0;
  // After NotifyWhenSendSlotFree: a completion batch left this connection below
  // max_send_slots, so AcquireSendBuffer may succeed now. Once per request; never after OnClosed.
  virtual void OnSendSlotFree(Connection& /*connection*/) {}
};

struct ConnectionStats {
  uint64_t messages_sent = 0;
  uint64_t bulk_sent = 0;
  uint64_t messages_received = 0;
  uint64_t bulk_received = 0;
  uint64_t credit_frames_sent = 0;
  // Bytes this side's own work requests moved: out, every SEND (frame header included, credit and
  // handshake frames too) and WRITE, counted as posted; in, every message and payload that
  // arrived and every payload this side READ from the peer (counted as the READ is posted). A
  // payload the peer READ from what this side exposed is counted on the peer, as received, and a
  // parked window's knock (an 8-byte WRITE into the peer's door, which the peer's application
  // never sees) on this side only.
  uint64_t bytes_sent = 0;
  uint64_t bytes_received = 0;
  // Registered (pinned) memory this connection holds now: its own arena or the piece of the
  // poller's pool lent to it, its receive slots (its own, posted or held; with a shared receive
  // queue only those holding messages not yet released), the send slots it has taken and its
  // control slot. Memory the application registered and exposes is not counted.
  uint64_t registered_bytes = 0;
  uint64_t waited = 0;  // operations that had to wait for credits, space or queue
  // Credits spent and not yet returned, the most at once; never above the peer's
  // max_recv_credits (a peer growing its window returns more than were spent, so from then on
  // this counts low).
  uint32_t max_credits_in_use = 0;
  uint32_t peer_recv_credits = 0;      // the peer's initial window
  uint32_t peer_max_recv_credits = 0;  // the most its window may reach (credits.h)
  // This side's receive window now and the largest it has been (with a shared receive queue it
  // is elastic: credits.h; otherwise recv_credits throughout).
  uint32_t recv_window = 0;
  uint32_t max_recv_window = 0;
  // Bytes of this side's arena held by payloads the application has not released yet: while
  // the peer's next payload does not fit, everything the peer sends after it waits.
  uint32_t arena_in_use = 0;
  // Sends and bulk writes accepted and not yet completed (waiting or posted): zero once all
  // that was handed over has reached the peer, so a graceful close can wait for it.
  uint32_t sends_outstanding = 0;
  // Of those, the ones not posted yet: waiting for credits (the peer holds this side's window),
  // arena space or a send-queue entry.
  uint32_t waiting = 0;
  // Bytes of bulk WRITEs and READs posted and not yet completed: what a message posted now
  // waits behind (RC keeps the send queue in order), for seconds when they are large.
  uint64_t transfer_bytes_in_flight = 0;
  uint64_t probes_sent = 0;  // Probe()s that posted a work request
  // Send-queue work requests posted, those of them signalled, and the ibv_post_send calls
  // (doorbells) that posted them: how well sends are batched and completions thinned.
  uint64_t work_requests = 0;
  uint64_t signalled = 0;
  uint64_t doorbells = 0;
  // RECVs posted, and the ibv_post_recv calls that posted them (a batch's go as one chain).
  uint64_t recvs_posted = 0;
  uint64_t recv_doorbells = 0;
  // Completion-queue entries its sends hold now (granted by its poller, given back when it is
  // idle and another connection needs them), and the times it found none free and waited.
  uint32_t cq_entries_granted = 0;
  uint64_t cq_waits = 0;
  // Arenas lent on demand (arena.h, "Loans"). This side's arena: loans made, recalled, asks that
  // found the poller's pool empty and waited, and whether one is out now. The peer's: asks sent.
  uint64_t arena_loans = 0;
  uint64_t arena_recalls = 0;
  uint64_t arena_waits = 0;
  bool arena_lent = false;
  uint64_t arena_asks = 0;
  // Parked windows (credits.h, "Parked windows"). This side's window (a server's, on a poller
  // that parks): kPark frames sent, times it parked, times a knock opened it again, and whether
  // it is parked now. Its sending (a client's): kPark frames answered, knocks sent.
  uint64_t park_asks = 0;
  uint64_t parks = 0;
  uint64_t park_grants = 0;
  bool window_parked = false;
  uint64_t parks_answered = 0;
  uint64_t knocks = 0;
  // Binds (an exposure's windows, a loan's) that waited for the send queue to go quiet first, on a
  // device whose binds do not survive a retransmission (Device::binds_survive_retry; QuietLocked).
  uint64_t binds_waited = 0;
};

class Connection : public std::enable_shared_from_this<Connection> {
 public:
  // Connects from the device's address to `addr`:`port` within `timeout`. The handler must
  // outlive the connection. Refused peers and bad handshakes give kUnavailable /
  // kFailedPrecondition with the peer's reason when it sent one. With options.auth_keys
  // (auth.h) it returns once the server has checked this side's tag and answered, which arrives
  // on `poller`'s thread: not to be called from that thread. A server whose tag does not match
  // gives kPermissionDenied, naming the key.
  static absl::StatusOr<std::shared_ptr<Connection>> Connect(Device& device, Poller& poller,
                                                             const std::string& addr, uint16_t port,
                                                             ConnectionHandler* handler,
                                                             const ConnectionOptions& options,
                                                             absl::Duration timeout);

  ~Connection();
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  // A slot for a message of up to capacity bytes; kResourceExhausted if the pool is empty, or
  // if this connection holds max_send_slots, or all but `leave_free` of them (a kind of message
  // that must leave room for another: a server's stream messages leave its answers theirs; at
  // least one slot stays available to every kind).
  absl::StatusOr<SendBuffer> AcquireSendBuffer(uint32_t leave_free = 0);
  void ReleaseSendBuffer(const SendBuffer& buffer);

  // Sends the first `length` bytes of `buffer` (taking it, even on error). OK means accepted:
  // OnSendDone(token) follows. Errors: kInvalidArgument (too long), kUnavailable (connection
  // closed or failing), kResourceExhausted (max_waiting operations already wait).
  absl::Status Send(const SendBuffer& buffer, uint32_t length, uint64_t token);
  // The same without OnSendDone: for messages nobody waits on (the RPC layer's), which then cost
  // no send completion (see the header comment). A failure after acceptance shows as OnClosed.
  absl::Status Send(const SendBuffer& buffer, uint32_t length);
  // Asks for one OnSendSlotFree, on the poller, after the next completion batch that leaves
  // this connection holding fewer than max_send_slots: for a caller on the poller that found no
  // slot and must not wait for one. Slots given back other than by completions
  // (ReleaseSendBuffer) raise none, so such a caller also looks again on a timer.
  void NotifyWhenSendSlotFree() { slot_notice_wanted_.store(true, std::memory_order_release); }

  // Writes `source` into the peer's arena; the peer gets OnBulk. Errors as for Send, and
  // kInvalidArgument when the payload is empty or larger than the peer's arena (split it).
  absl::Status WriteBulk(const BulkSource& source, uint64_t token);
  // WriteBulk, then Send(buffer, length) without a report, queued together under one lock so
  // that no other message comes between them (the peer pairs a payload with the message that
  // follows it). Both or neither: on error nothing is queued and `buffer` stays the caller's.
  absl::Status WriteBulkThenSend(const BulkSource& source, uint64_t token, const SendBuffer& buffer,
                                 uint32_t length);

  // Reads `sink.size` bytes from the peer's `remote` range into `sink` (registered here, local
  // write), by RDMA READ: no credit and no receive on the peer, whose NIC answers alone. Split
  // into READs of at most the port's max_msg_size; OnSendDone(token) follows once, when all of
  // it has landed (or failed: a bad key or range the peer gave fails the connection, as any
  // failed work request does). Queued in order with sends and writes. Errors as for Send, and
  // kInvalidArgument for an empty sink.
  absl::Status ReadBulk(const BulkSource& sink, const RemoteRange& remote, uint64_t token) {
    const ReadPart part{sink, remote};
    return ReadBulk(absl::MakeConstSpan(&part, 1), token);
  }
  // The same for several ranges as one transfer (a message whose body and payload lie apart in
  // the peer's memory): each part lands in its own sink, and OnSendDone(token) follows once,
  // after the last. Parts may be empty, but not all of them.
  struct ReadPart {
    BulkSource sink;
    RemoteRange remote;
  };
  absl::Status ReadBulk(absl::Span<const ReadPart> parts, uint64_t token);

  // Takes back the bulk write with `token` if it still waits (for credits, arena space or a
  // send-queue entry) and has not been posted, together with the message queued right behind
  // it, if any (the message that refers to the payload: its slot is freed): then neither reaches
  // the peer and OnSendDone(token) reports kCancelled ("withdrawn"). A write posted already
  // completes as it would have (OnSendDone follows either way, exactly once). For a caller whose
  // operation ended before its payload could leave (an RPC whose deadline passed while the
  // peer's arena was full): it gets its source back at OnSendDone, without waiting for the peer.
  void WithdrawBulk(uint64_t token);

  // Exposures (exposures.h): memory of this side's opened to the peer for one RDMA READ transfer,
  // through type-2 windows bound to this connection's queue pair, so that no other queue pair can
  // use the keys, and closed by the peer's own SEND_WITH_INV naming one of them.
  //
  // Expose reserves a window per range (one or two) and answers their keys, fresh and random in
  // their low byte, for the message that tells the peer; SendExposing binds them and sends that
  // message after the binds. The exposure ends exactly once, reported by OnSendDone(token): OK when
  // the peer's SEND_WITH_INV named one of its keys (every key of it is dead then), kCancelled after
  // EndExposure, the connection's error when it closed first. Until that report the ranges and
  // their regions must stay. Any thread. Errors: kUnimplemented on a device without type-2 windows
  // (Device::has_windows), kUnavailable when closed, kResourceExhausted past
  // ConnectionOptions::max_exposures open at once, kInvalidArgument for no range, more than two or
  // an empty one.
  absl::StatusOr<ExposureKeys> Expose(absl::Span<const ExposedRange> ranges, uint64_t token);
  // Binds exposure `keys`'s windows, then sends the first `length` bytes of `buffer` without a
  // report, queued together, taking `buffer` as Send does (even on error). On error nothing is
  // queued and the exposure stays open (EndExposure ends it). An exposure ended before its turn is
  // not bound: its message then names dead keys, and a peer that reads through them fails its
  // connection.
  absl::Status SendExposing(const ExposureKeys& keys, const SendBuffer& buffer, uint32_t length);
  // Send(buffer, length) without a report, as a SEND_WITH_INV of `rkey`: when it lands the peer's
  // NIC invalidates the window the peer exposed under that key. For a key the peer gave this
  // connection and not invalidated yet; any other fails the connection.
  absl::Status SendInvalidating(const SendBuffer& buffer, uint32_t length, uint32_t rkey);
  // Ends exposure `id` unless it has ended: its windows are deallocated, so its keys open nothing
  // from here on, and OnSendDone(token) reports kCancelled. Any thread.
  void EndExposure(uint64_t id);
  // Exposures open now (reserved and not yet reported), and windows they hold or keep for reuse.
  size_t exposures_open() const { return exposures_.open(); }
  size_t exposure_windows() const { return exposures_.windows(); }

  // Gives back a received message or bulk payload. Any thread, once per handle. From a handler
  // of this connection's batch (on its poller thread), its credit goes back with the batch's next
  // send, or in a credit frame at the batch's end. From another thread while the domain is held,
  // the release is left to the holder: a handle given back twice is then logged, not returned.
  absl::Status Release(uint64_t handle);
  // Release(handle), then Send(buffer, length) without a report, as one operation: for an answer
  // and the received message it answers (a server's response and its request). The release
  // comes first, so the message carries the credit it returns. The release happens whatever
  // the send's outcome; its own errors (a handle given back twice) are not reported. Errors as
  // for Send, and `buffer` is taken even on error.
  absl::Status ReleaseAndSend(uint64_t handle, const SendBuffer& buffer, uint32_t length);

  // Asks the peer's NIC for a sign of life without spending a credit, a slot or arena space: a
  // zero-length RDMA WRITE, signalled. RC acknowledges it or, when the peer's host is gone,
  // fails it after the retries, and the connection fails (OnClosed) like for any failed work
  // request. Nothing is posted while other work requests are in flight, which prove as much. For
  // liveness checks whose ordinary messages wait behind a full window (the peer's application
  // holds the receives), and nothing else: the peer's process hears nothing of it.
  // kUnavailable when the connection is not open.
  absl::Status Probe();

  // Makes sure the last work request posted is signalled, posting a zero-length WRITE (as Probe
  // does) when it is not, so that sends_outstanding falls to zero once everything posted has
  // reached the peer: unreported sends may otherwise stay counted until the next signalled one.
  // For a graceful close that waits for its last answers to leave. Cheap when nothing is owed.
  absl::Status Flush();

  // Starts an orderly close: disconnects, fails what waits, then OnClosed(kCancelled).
  void Close();

  // The poller's request while its arena pool is short (Poller::ServeArenaShortage): a waiter
  // tries again to borrow a piece; a holder recalls its loan if idle since the last request or
  // held for kLoanTurn (a peer that keeps writing must not keep a piece from the others for
  // good: it asks again, behind them), and gives up on a peer that has not returned one
  // recalled kRecallGiveUp ago (closing it).
  void AskForArena();
  static constexpr absl::Duration kLoanTurn = absl::Milliseconds(100);
  static constexpr absl::Duration kRecallGiveUp = absl::Seconds(10);

  // Runs `task` inside this connection's domain, open or closed: at once when this thread holds
  // the domain (a handler in this connection's batch, another task) or finds it free; else it
  // is left, and this returns at once. A left task runs on the connection's poller thread: in the
  // batch that holds the domain, after its handlers, or, when another thread holds it, in the
  // poller's next pass (that thread hands it over as it lets go, as it hands over events). So a
  // left task never runs on a stranger's thread, inside whatever that thread was doing: an
  // operation of the layer above that holds its own locks (and may take them again in a task), or
  // an application's call. Only once the poller's loop has ended does the thread letting go run
  // left tasks itself. A left task runs on its own, never inside another operation (a handler's
  // send), and in no set order with the connection's own operations. The caller must hold a
  // reference to the connection until this returns; the poller holds one while it runs a task.
  void RunInDomain(DomainTask& task);
  // Runs `task` inside the domain before it returns: at once, or after waiting for the thread
  // that holds it to let go (a short wait: no thread waits inside a domain). For a caller that
  // must see the task's effect at once and may be the connection's poller, to which a left task
  // would go while it waited for it (a stream destroyed in a done-callback, cancelled and waited
  // for; Shutdown's answers before it looks whether they have gone). Not from inside another
  // task or batch of this connection's that this thread does not show as its own (InDomain).
  void RunInDomainNow(DomainTask& task);
  // Whether this thread holds this connection's domain: dispatching its batch, or running a
  // task (RunInDomain).
  bool InDomain() const;
  // From inside the domain (InDomain): drops `reference` (to this connection) once this thread
  // has let go of the domain. For the layer above to give up a reference that may be the
  // connection's last from a task or handler, which must not destroy the connection under them.
  void DropAfterExit(std::shared_ptr<Connection> reference);
  // From inside the domain (InDomain): runs `task` on this thread once it has let go of the domain
  // (after the batch it dispatches, or the task it runs, and whatever that holder carries out
  // before it lets go), in the order asked. The caller keeps `task` alive until then.
  void RunAfterExit(ExitTask& task);

  // Whether it is open now: a hint, as it may fail right after. Lock-free (every call asks).
  bool open() const;
  uint32_t max_inline() const { return max_inline_; }
  // Payload bytes a Send can carry: the slot and the peer's RECVs both bound it.
  uint32_t max_message_size() const { return max_message_; }
  uint32_t peer_arena_size() const { return peer_.arena_size; }
  // Bytes each of the peer's RECVs holds (its Hello): with this side's slot size, what bounds
  // max_message_size().
  uint32_t peer_recv_size() const { return peer_.recv_size; }
  // The peer as "ip:port" (cm_util.h, PeerAddress): set before the connection is handed out and
  // never changed, so the reference lasts as long as the connection.
  const std::string& peer_address() const { return peer_address_; }
  // The bytes the server's accept reply carried after its Hello (wire.h; AcceptHandler's
  // Placement::accept_data), on the side that connected; zeros on the side that accepted, or
  // when the server gave none.
  const AcceptData& peer_accept_data() const { return peer_accept_data_; }
  // The id of the key both sides proved they hold (auth.h), or 0 for a connection without
  // authentication. Any thread, once the connection is handed out.
  uint32_t auth_key_id() const { return auth_ != nullptr ? auth_->key_id() : 0; }
  // Waits for the domain's holder, if any: a poller may hold it for as long as a handler or a
  // user's callback runs.
  ConnectionStats stats() const;
  // The same when the domain is free or the caller's (nothing waits); nullopt while another
  // thread holds it. For a thread that must not wait for a handler (the channel's timer).
  std::optional<ConnectionStats> TryStats() const;
  // The handler given at Connect or by AcceptHandler::Place: how an accept callback finds the
  // state it placed for this connection.
  ConnectionHandler* handler() const { return handler_; }
  // The queue pair's ACK timeout and retry counts as the device holds them (ibv_query_qp): what
  // ConnectionOptions asked for, on each side as cm_util.h says which side's count it takes.
  // Any thread; the queue pair lives as long as the connection.
  absl::StatusOr<RetryTiming> QueryRetryTiming() const;
  // The queue pair (null before it is made): what the device's reports name (async_events.h),
  // and how the poller tells this connection from a later one given the same number.
  ibv_qp* queue_pair() const { return qp_ != nullptr ? qp_->qp : nullptr; }
  // The flow-control state, for logs when something stalls.
  std::string DebugString() const;
  // The same without waiting: says so when another thread holds the domain.
  std::string TryDebugString() const;
  // The poller's drain watchdog (Poller::WatchDrains): the connection failed long ago and its
  // queues never came back flushed (a device that lost the flush: seen on rxe, with hundreds of
  // connections closing while others connect). The drain ends as if the flush had come (the
  // queue pair, in the error state, moves no data; see "Failure" above): what was in flight is
  // reported failed, and OnClosed follows. Logged. Nothing when another thread holds the domain
  // (the next look tries again).
  void GiveUpOnDrain();

 private:
  friend class Listener;
  friend class Poller;
  friend class ConnectionTestPeer;  // tests hold the domain to make other threads leave work

  // kVerifying: established, waiting for the peer's tag (auth.h): nothing but the handshake's
  // frames moves, and the layer above does not know the connection yet.
  enum class State { kConnecting, kVerifying, kOpen, kDraining, kClosed };

  // One entry per work request posted on the send queue, retired in order.
  struct InFlight {
    uint64_t sequence;
    uint32_t slot;  // pool slot to free when retired, or SlotPool::kNoSlot
    uint64_t token;
    bool report;           // OnSendDone owed
    uint32_t transfer;     // bytes a bulk WRITE or READ moves; 0 for messages and probes
    bool inlined = false;  // slot is freed as soon as the chain is posted (the NIC copied it)
  };
  // An operation waiting for credits, arena space or a send-queue entry.
  struct Waiting {
    // kBind: window `length` (0 or 1) of exposure `token` (exposures.h). Those that take a credit
    // first (PumpLocked compares).
    enum Kind : uint8_t { kMessage, kWrite, kRead, kBind };
    Kind kind;
    uint32_t slot;      // message
    uint32_t length;    // message payload bytes
    BulkSource source;  // write: what to send; read: where to land (data is writable then)
    uint64_t token;
    RemoteRange remote{};      // read
    bool report = true;        // read: the last piece of a ReadBulk reports OnSendDone
    bool invalidates = false;  // message: a SEND_WITH_INV of remote.rkey
  };
  // What a completion produced, dispatched after the lock is dropped.
  struct Event {
    enum Kind { kMessage, kBulk, kSendDone, kSendSlotFree, kClosed };
    explicit Event(Kind k) : kind(k) {}
    Kind kind;
    const uint8_t* data = nullptr;
    uint32_t size = 0;
    uint64_t handle_or_token = 0;
    absl::Status status;
  };

  // An operation another thread left in the domain (serial_domain.h), carried out by the thread
  // that holds it. Made only when the domain was held; taken from the connection's pool of them
  // (NewLeftOp), so that the common ones (messages, releases) allocate nothing in steady state.
  struct LeftOp : DomainOp {
    enum Kind : uint8_t {
      kEnqueue,      // ops (sends, writes, reads), in order; `release` first if has_release
      kRelease,      // release
      kWithdraw,     // token
      kEndExposure,  // token: the exposure's id
      kProbe,
      kFlush,
      kClose,
      kCmEvent,      // cm_event
      kDeviceEvent,  // device_event
      kLook,         // nothing: has the holder look at the drain again (AcceptLeft)
    };
    Kind kind = kEnqueue;
    bool has_release = false;
    uint64_t release = 0;
    uint64_t token = 0;
    rdma_cm_event_type cm_event{};
    ibv_event_type device_event{};
    absl::InlinedVector<Waiting, 2> ops;
    // In the pool: its index + 1 (0: from the heap), and the free list's link (an index + 1).
    uint32_t pool_slot = 0;
    std::atomic<uint32_t> pool_next{0};
  };
  // gate_: bit 0 is "open" (open()); the rest counts operations accepted to be left in the domain
  // and not yet carried out (kLeftOne each). The drain does not report OnClosed while any is: it
  // would otherwise owe them a report after OnClosed.
  static constexpr uint32_t kGateOpen = 1;
  static constexpr uint32_t kLeftOne = 2;

  Connection(Device& device, Poller& poller, ConnectionHandler* handler,
             const ConnectionOptions& options);
  static absl::Status ValidateOptions(const ConnectionOptions& options, const Device& device);
  // The peer's Hello from a cm event, decoded (wire.h) and checked against what this side needs
  // (min_message_size).
  static absl::StatusOr<Hello> PeerHello(const rdma_cm_event& event,
                                         const ConnectionOptions& options);
  // Frees a slot of an outgoing message and gives its place in max_send_slots back: from any
  // thread, and FreeSendSlotLocked with the domain held (its count, send_slots_in_domain_).
  void FreeSendSlot(uint32_t slot);
  void FreeSendSlotLocked(uint32_t slot);
  // A send slot, and a slot back: through the loop's cache (Poller::slot_cache) when this thread
  // runs this connection's poller, else the pool's shared stack.
  uint32_t TakeSlot();
  void GiveSlot(uint32_t slot);
  // Runs on_closed_ once: when OnClosed is dispatched, or at destruction if it never was.
  void RunOnClosed();

  // Setup (connection_setup.cc).
  absl::Status CreateResources(rdma_cm_id* id);  // arena, QP on the poller's CQ, RECVs
  Hello OwnHello() const;
  void AcceptHello(const Hello& peer);
  void OnEstablished();

  // Authentication (connection_auth.cc, auth.h). The client's check of the server's reply at
  // ESTABLISHED: `peer` back when its tag matches; else why not.
  absl::StatusOr<Hello> CheckServerAuth(const rdma_cm_event& event, Hello peer);
  // A receive while kVerifying: the peer's kAuth
  // (server) or kAuthOk (client), checked and applied; false when it failed the connection.
  bool VerifyPeerLocked(const ibv_wc& wc, const uint8_t* frame)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(domain_);
  // The frame auth_frame_owed_ stands for: kAuth (client, while kVerifying) or kAuthOk (server,
  // open, before the layer above hears of the connection), its credit spent by the caller.
  void SendAuthFrameLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(domain_);
  // The peer is verified: the handshake's outcome, unless it was settled already (the listener's
  // deadline), which fails the connection instead.
  void FinishAuthLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(domain_);

  // Datapath (connection_datapath.cc). Called by the poller for each completion of this QP.
  // One signalled completion can retire kSignalInterval sends: room for all of them inline.
  using Events = absl::InlinedVector<Event, 64>;  // a poll batch (32) and what it retires
  // A run of completions of this connection from one poll, handled in one turn of the domain.
  // False when another thread holds the domain for a moment (one operation of its own): the
  // completions are kept (stash_, the poller's alone) and handled before the next ones, and the
  // poller calls RetryStashed on its next pass instead of waiting.
  bool OnCompletions(absl::Span<const ibv_wc> wcs);
  // The poller's next try for completions OnCompletions kept: false while still held.
  bool RetryStashed();
  void HandleCompletionLocked(const ibv_wc& wc, Events& events)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(domain_);
  void HandleRecvLocked(const ibv_wc& wc, Events& events) ABSL_EXCLUSIVE_LOCKS_REQUIRED(domain_);
  // The completions that came before the handshake ended (early_), once it has: failing the
  // connection first if the peer sent past its window meanwhile (early_shared_).
  void HandleEarlyLocked(Events& events) ABSL_EXCLUSIVE_LOCKS_REQUIRED(domain_);
  // The poller's turn after Poller::Defer: completions that arrived before the handshake
  // finished (or a made-up flush), and events another thread's exit left for the poller.
  void ReplayEarly();
  void OnCmEvent(rdma_cm_event_type type);
  // The device reported `type`, an error of this connection's queue pair (async_events.h): it
  // fails, saying so. From the poller's loop.
  void OnDeviceEvent(ibv_event_type type);
  void DispatchOne(Event& e);

  // The domain (serial_domain.h). Whether this thread holds it for this connection's batch.
  bool InBatch() const;
  // A LeftOp of `kind`, reset: from the pool (a lock-free stack of indices, tagged against ABA;
  // made on first need, max_send_slots + recv_credits of them: every message and receive release
  // in flight), else from the heap. FreeLeftOp gives it back.
  LeftOp* NewLeftOp(LeftOp::Kind kind);
  void FreeLeftOp(LeftOp* op);
  // An application thread's exit: carries out what was left, then lets go; hands the poller
  // what only it may dispatch.
  void ExitLocked() ABSL_UNLOCK_FUNCTION(domain_);
  // The poller's batch, once it holds the domain: handles `wcs`, dispatches what they produced
  // (with sends corked), carries out what was left meanwhile, and lets go.
  void RunBatchLocked(absl::Span<const ibv_wc> wcs) ABSL_UNLOCK_FUNCTION(domain_);
  // Dispatches `events` inside the domain, with this batch's sends held until its last message's
  // handler sends, then posts them.
  void DispatchBatchLocked(Events& events) ABSL_EXCLUSIVE_LOCKS_REQUIRED(domain_);
  // On the batch's thread, before an operation of its own: what other threads left first.
  void RunLeftInBatchLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(domain_);
  // Carries out `left` (oldest first) and frees them; what they produce goes to `events`. Tasks
  // among them go to tasks_, for RunTasksLocked.
  void RunLeftLocked(DomainOp* left, Events& events) ABSL_EXCLUSIVE_LOCKS_REQUIRED(domain_);
  // Runs the tasks left (tasks_), oldest first, with this thread marked as the holder: on their
  // own, from the holder's loop (ExitLocked, RunBatchLocked), never inside an operation.
  void RunTasksLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(domain_);
  // Moves drops_ to the holder's `drops`, which it destroys after letting go, and the exit tasks
  // to the end of its list `exits`, which it runs after letting go (RunExits).
  void TakeDropsLocked(std::vector<std::shared_ptr<Connection>>& drops, ExitTask*& exits)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(domain_);
  // Runs the exit tasks linked from `exits`, oldest first, outside the domain.
  static void RunExits(ExitTask* exits);
  // Runs `task` with this thread marked as the domain's holder (InDomain).
  void RunTaskLocked(DomainTask& task) ABSL_EXCLUSIVE_LOCKS_REQUIRED(domain_);
  // After a change: credits may go, a slot notice may be owed, the drain may be complete.
  void AfterChangeLocked(Events& events) ABSL_EXCLUSIVE_LOCKS_REQUIRED(domain_);
  // Accepts an operation to be left: false (and nothing counted) when the connection is not open.
  bool AcceptLeft();
  // One accepted operation was carried out (or refused after all).
  void LeftDone() { gate_.fetch_sub(kLeftOne, std::memory_order_acq_rel); }
  uint32_t LeftPending() const { return gate_.load(std::memory_order_acquire) / kLeftOne; }
  // Queues `ops` in order, for an operation accepted earlier: in any state but closed (the drain
  // reports them), past max_waiting if need be.
  void EnqueueAcceptedLocked(absl::Span<const Waiting> ops, Events& events)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(domain_);
  // A left operation that queues `ops`.
  LeftOp* LeftEnqueue(absl::Span<const Waiting> ops);
  // An operation from outside: run() inside the domain (on this batch's thread, or entering it)
  // and its status returned; or, when another thread holds the domain, make() left to it and OK
  // returned. `gated`: it queues work whose report a drain would owe (AcceptLeft: kUnavailable
  // when not open).
  template <typename Run, typename Make>
  absl::Status Submit(bool gated, Run run, Make make);
  // Takes the write back if it still waits; its report goes to pending_events_.
  void WithdrawLocked(uint64_t token) ABSL_EXCLUSIVE_LOCKS_REQUIRED(domain_);
  // Ends exposure `id`, if open; its report goes to pending_events_.
  void EndExposureLocked(uint64_t id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(domain_);
  // Binds window op.length of exposure op.token (a kBind), posted at once, unless it ended.
  ABSL_ATTRIBUTE_NOINLINE void BindExposureLocked(const Waiting& op)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(domain_);
  // Appends a prepared BIND_MW (unsignalled: a later completion retires it) to the chain.
  void AppendBindLocked(const ibv_send_wr& bind) ABSL_EXCLUSIVE_LOCKS_REQUIRED(domain_);
  // Whether a bind may be appended now. Always, but where binds do not survive a retransmission
  // (rxe: Device::binds_survive_retry): there only while nothing is in flight on the send queue
  // but the binds just before it, so that no retransmission can take the requester back over it.
  // When not, the tail is signalled, and the bind waits for that completion (binds_waited).
  bool QuietLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(domain_);
  // A loan's bind is owed, could go but for a send queue that is not quiet yet (the lend it comes
  // with takes a credit): until it goes, nothing else does.
  bool LendWaitsLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(domain_) {
    return quiet_binds_ && !lend_bound_ && (arena_owed_ & kOweLend) != 0 &&
           credits_.CanSpendForData();
  }
  // Where binds wait for a quiet send queue: a run of binds is in flight with nothing behind it.
  // They are signalled there, and no other work goes behind them until their completion is polled:
  // rxe's completer, woken by a stale retransmission timer as a bind at the head of the queue
  // executes and work behind it is sent, can rewind to the bind and replay it (it reads the head's
  // state twice in one pass), so the run must be retired before anything may be retransmitted.
  bool BindsPendingLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(domain_) {
    return quiet_binds_ && !in_flight_.empty() && next_sequence_ == bind_run_end_;
  }
  // Control frames (credits, parking) wait while a bind waits for quiet or is pending: otherwise,
  // under steady traffic from the peer, a credit frame would always be in flight and the queue
  // never quiet. Holding them costs the peer at most the time its NIC takes to acknowledge what
  // is in flight.
  bool HoldsFramesLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(domain_) {
    return quiet_binds_ && (bind_waits_ || LendWaitsLocked() || BindsPendingLocked());
  }
  // The peer's SEND_WITH_INV invalidated `rkey`: the exposure it ended is reported (`events`).
  absl::Status OnInvalidatedLocked(uint32_t rkey, Events& events)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(domain_);
  void CmEventLocked(rdma_cm_event_type type) ABSL_EXCLUSIVE_LOCKS_REQUIRED(domain_);
  void DeviceEventLocked(ibv_event_type type) ABSL_EXCLUSIVE_LOCKS_REQUIRED(domain_);
  // `query_qp`: with the queue pair's state as the device reports it.
  std::string DebugStringLocked(bool query_qp = true) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(domain_);
  // Out of the poller's count of draining connections (Poller::draining_), once: the drain
  // ended, or the connection goes.
  void LeaveDrainWatch();
  // Stands in a flushed completion for the send queue's drain marker (handled from early_).
  void MakeUpMarkerLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(domain_);
  // Waits for the domain (diagnostics only: stats, DebugString, setup and teardown).
  void EnterWaiting() const ABSL_EXCLUSIVE_LOCK_FUNCTION(domain_);
  ConnectionStats StatsLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(domain_);
  void PumpLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(domain_);
  // As send_wr_ says: a SEND, or a SEND_WITH_INV for SendInvalidating (PumpLocked sets it).
  void PostMessageLocked(uint32_t slot, uint32_t length, FrameKind kind, uint64_t token,
                         bool report, bool signal) ABSL_EXCLUSIVE_LOCKS_REQUIRED(domain_);
  void PostBulkLocked(const BulkSource& source, const ArenaSpot& spot, uint64_t token)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(domain_);
  void PostReadLocked(const Waiting& op) ABSL_EXCLUSIVE_LOCKS_REQUIRED(domain_);
  // Appends a copy of `wr` (one SGE, `sge`) to the chain posted by PostChainLocked.
  void AppendLocked(const ibv_send_wr& wr, const ibv_sge& sge, uint32_t slot, uint64_t token,
                    bool report, bool inlined) ABSL_EXCLUSIVE_LOCKS_REQUIRED(domain_);
  // Rings the doorbell for the chain; a failure fails the connection (the drain reports what
  // was not posted).
  void PostChainLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(domain_);
  // Probe and Flush: a signalled zero-length WRITE unless the tail is signalled already.
  absl::Status PostTailSignalLocked(bool probe) ABSL_EXCLUSIVE_LOCKS_REQUIRED(domain_);
  // Whether this thread is dispatching this connection's batch: sends wait for its end.
  bool CorkedLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(domain_);
  // OK when the connection is open and fewer than max_waiting operations wait; else why not.
  absl::Status CanEnqueueLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(domain_);
  // A message sent without a token: nobody waits on it, so it reports nothing.
  static Waiting Unreported(const SendBuffer& buffer, uint32_t length);
  // Release's work but the pump.
  absl::Status ReleaseLocked(uint64_t handle) ABSL_EXCLUSIVE_LOCKS_REQUIRED(domain_);
  // Queues `op` and posts what can go; `checked`: the caller has run CanEnqueueLocked already.
  absl::Status EnqueueLocked(const Waiting& op, bool checked = false)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(domain_);
  void MaybeSendCreditFrameLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(domain_);
  // Receive `index` goes back: into the chain PostRecvChainNowLocked posts (or, while failing, to
  // the destructor).
  void RepostRecvLocked(uint32_t index) ABSL_EXCLUSIVE_LOCKS_REQUIRED(domain_);
  // Posts the receives RepostRecvLocked chained (recv_chain_length_ > 0), in one ibv_post_recv.
  // Before any send (whose credits they back: PostChainLocked) and before the domain's holder
  // lets go (ExitLocked).
  absl::Status PostRecvChainNowLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(domain_);
  // Posts the chain if there is one (inline: most calls find none); false when posting failed,
  // which failed the connection.
  bool RecvChainPostedLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(domain_) {
    if (recv_chain_length_ == 0) return true;
    absl::Status s = PostRecvChainNowLocked();
    if (s.ok()) return true;
    FailLocked(s);
    return false;
  }
  void RetireLocked(uint64_t up_to, const absl::Status& status, Events& events)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(domain_);
  // Gives back the pool slot of `wc` when it is a receive of the shared queue (destruction).
  void FreeSharedReceiveSlot(const ibv_wc& wc);
  void SetStateLocked(State state) ABSL_EXCLUSIVE_LOCKS_REQUIRED(domain_);
  void FailLocked(absl::Status why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(domain_);
  void FinishDrainLocked(Events& events) ABSL_EXCLUSIVE_LOCKS_REQUIRED(domain_);
  // Both queues are empty after a failure: the send-queue marker came back, and every posted
  // RECV did (nothing posts a RECV once the connection stops being open); and no operation
  // accepted for the domain is still to be carried out (it would be owed a report).
  // With a shared receive queue on a device that says so, also once the device has raised its
  // last-WQE-reached for the queue pair (shared_receive_queue.h, "Teardown").
  bool DrainedLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(domain_) {
    return sq_drained_ && recvs_posted_ == 0 && LeftPending() == 0 &&
           (!awaits_last_wqe_ || last_wqe_reached_);
  }
  uint32_t qp_num() const { return qp_num_; }
  // The window the peer starts with: the floor of an elastic one (credits.h), else all of it.
  uint32_t initial_window() const {
    if (start_parked_) return 0;
    if (auth_ != nullptr && accepted_) return 1;  // provisional: the client's kAuth
    return shared_receives_ ? options_.idle_recv_credits : options_.recv_credits;
  }
  uint32_t cq_entries() const { return CqEntriesFor(options_, shared_receives_); }
  uint32_t cq_entries_reserved() const { return CqEntriesReservedFor(options_, shared_receives_); }
  // Whether a send may be posted now: a send-queue entry is free, and a completion-queue entry
  // for it is granted (or the grant grows now; when it cannot, the connection waits for the
  // poller: GrowCqGrantLocked).
  bool SendRoomLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(domain_) {
    const size_t in_flight = in_flight_.size();
    if (in_flight >= options_.send_queue_depth) return false;
    return in_flight < cq_granted_.load(std::memory_order_relaxed) || GrowCqGrantLocked();
  }
  bool GrowCqGrantLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(domain_);
  // Gives back to the poller what the grant holds beyond `keep` entries (keep covers what is in
  // flight).
  void GiveBackCqLocked(uint32_t keep) ABSL_EXCLUSIVE_LOCKS_REQUIRED(domain_);
  // The poller's request while entries are short (Poller::ServeCqShortage, Register): a waiter
  // pumps; a holder gives back what it does not use now, and flushes its tail so that it soon
  // has nothing in flight and gives back the rest.
  void AskForCqEntries();
  void OnCqRequestLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(domain_);
  class CqRequest : public DomainTask {
   public:
    void RunInDomain(Connection& connection) override;
  };

  // Arenas lent on demand (arena.h, "Loans"; connection_datapath.cc).
  static constexpr uint32_t kNoPiece = ~uint32_t{0};
  // Borrows a piece of the poller's pool for an ask that waits, binds a window over it and owes
  // the lend; with none free, waits on the poller (WaitForArena).
  void TryLendLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(domain_);
  // The loan is back and released: the window dies, the piece goes back to the pool.
  void ReclaimArenaLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(domain_);
  // The piece goes back to the pool, its window gone already.
  void GivePieceBackLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(domain_);
  void OnArenaRequestLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(domain_);
  absl::Status HandleArenaMessageLocked(const ArenaMessage& message)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(domain_);
  // Loan messages owed (arena_owed_'s bits): one load on the send path, which looks every pump.
  enum ArenaOwed : uint8_t { kOweLend = 1, kOweRecall = 2, kOweReturned = 4, kOweAsk = 8 };
  bool ArenaOwedLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(domain_) { return arena_owed_ != 0; }
  // Sends the loan messages owed, one kArena frame each from the control slot, while the slot,
  // data credits and send-queue room allow (a lend behind its window's bind).
  void MaybeSendArenaFramesLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(domain_);
  class ArenaRequest : public DomainTask {
   public:
    void RunInDomain(Connection& connection) override;
  };

  // Parked windows (credits.h, "Parked windows"; connection_park.cc).
  // The poller's request (Poller::ServeParking): the peer of a parked window knocked, a floor it
  // waited for may be free, or, while others wait for floors, a window not parked is looked at and
  // asked to park when idle since the last look or open for kParkTurn; one that does not answer
  // within kParkGiveUp loses its connection.
  void AskForPark();
  void KnockHeard();
  static constexpr absl::Duration kParkGiveUp = absl::Seconds(10);
  static constexpr absl::Duration kParkTurn = absl::Milliseconds(100);
  void OnParkRequestLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(domain_);
  // A floor from the budget for a parked window whose peer knocked; with none free, waits on
  // the poller (WaitForFloor).
  void TryUnparkLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(domain_);
  // The window parked: the poller watches its door, and its floor may serve a waiter.
  void NoteParkedLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(domain_);
  // Something for the park exchange to send: a kPark (this side's window), a kParked answer or a
  // knock (this side's sending). One load on the send path.
  bool ParkWorkLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(domain_) {
    return credits_.park_work();
  }
  void MaybeSendParkFramesLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(domain_);
  class ParkRequest : public DomainTask {
   public:
    void RunInDomain(Connection& connection) override;
  };

  Device& device_;
  Poller& poller_;
  ConnectionHandler* handler_;
  // Keeps handler_ alive while this connection lives, when its placement said so (listener.h).
  std::shared_ptr<ConnectionHandler> handler_owner_;
  const ConnectionOptions options_;
  Hello peer_;
  std::string peer_address_;
  AcceptData peer_accept_data_{};  // set at connect, before the connection is shared
  uint32_t max_inline_ = 0;
  uint32_t max_message_ = 0;
  uint32_t qp_num_ = 0;
  // Set by the Listener before the connection is shared: gives its admission place back.
  std::function<void()> on_closed_;
  // Peer authentication (auth_session.h): set before the connection is shared when it
  // authenticates, null otherwise. auth_frame_owed_: the handshake's frame waits for room
  // (SendAuthFrameLocked; looked at only where a credit frame would go).
  std::unique_ptr<AuthSession> auth_;
  bool auth_frame_owed_ ABSL_GUARDED_BY(domain_) = false;
  // Pool slots held by outgoing messages (AcquireSendBuffer to retirement), against
  // options_.max_send_slots: the sum of two counts. The domain's holder changes the first with a
  // load and a store (no atomic instruction on the hot path: a message built in a batch, the
  // slot of a completed send); other threads change the second with read-modify-writes. Either
  // may go below zero alone (a slot taken outside the domain and freed inside). The sum is exact
  // for any one thread; when the holder and other threads take slots at the same instant, each
  // may miss the others' last take, so the quota may be passed by as many slots as threads race
  // for it there, and no further.
  std::atomic<int32_t> send_slots_in_domain_{0};
  std::atomic<int32_t> send_slots_outside_{0};
  uint32_t SendSlotsHeld() const {
    return static_cast<uint32_t>(send_slots_in_domain_.load(std::memory_order_relaxed) +
                                 send_slots_outside_.load(std::memory_order_relaxed));
  }
  std::atomic<bool> slot_notice_wanted_{false};  // NotifyWhenSendSlotFree

  // Verbs objects, in creation order (destroyed in reverse): the id, the arena and its MR, the
  // QP. The id's events go to the poller's channel once the connection is open, and the setup
  // channel (a client's, while it connects) is closed then.
  CmChannelOwner setup_channel_;
  CmIdOwner id_;
  PageBuffer arena_;
  MrOwner arena_mr_;
  CmQpOwner qp_;
  // The window over the piece lent now (on demand), destroyed before the piece goes back.
  std::unique_ptr<MemoryWindow> arena_window_;
  // Payloads exposed to the peer through windows (Expose); every window goes before the QP.
  Exposures exposures_{device_.pd()};
  // Device::invalidated_flags(), kept here for the receive path.
  const uint32_t invalidated_flags_ = device_.invalidated_flags();

  mutable SerialDomain domain_;
  // LeftOp pool (NewLeftOp): the array once made, and the free list's head (tag << 32 | index+1).
  std::atomic<LeftOp*> op_pool_{nullptr};
  std::atomic<uint64_t> op_free_{0};
  // Completions the poller found the domain held for, in order, and whether the poller has this
  // connection on its list to retry. Touched by the poller's thread only.
  std::vector<ibv_wc> stash_;
  bool stash_listed_ = false;
  // References to drop once the holder has let go (DropAfterExit), and tasks to run then
  // (RunAfterExit), oldest first.
  std::vector<std::shared_ptr<Connection>> drops_ ABSL_GUARDED_BY(domain_);
  ExitTask* exits_head_ ABSL_GUARDED_BY(domain_) = nullptr;
  ExitTask* exits_tail_ ABSL_GUARDED_BY(domain_) = nullptr;
  // Tasks left in the domain (RunInDomain), linked by DomainOp::next, oldest first.
  DomainOp* tasks_head_ ABSL_GUARDED_BY(domain_) = nullptr;
  DomainOp* tasks_tail_ ABSL_GUARDED_BY(domain_) = nullptr;
  State state_ ABSL_GUARDED_BY(domain_) = State::kConnecting;
  // kGateOpen while state_ == kOpen (written with state_, by SetStateLocked), for open() and for
  // operations left in the domain, which are counted here until carried out.
  std::atomic<uint32_t> gate_{0};
  // Events that a thread other than the poller produced while it held the domain (completions
  // the poller left it, a withdrawn write's report), for the poller to dispatch (ReplayEarly).
  Events pending_events_ ABSL_GUARDED_BY(domain_);
  absl::Status error_ ABSL_GUARDED_BY(domain_);
  CreditAccount credits_ ABSL_GUARDED_BY(domain_){kMinCredits, kMinCredits};
  ArenaWriter arena_writer_ ABSL_GUARDED_BY(domain_){0};
  ArenaReader arena_reader_ ABSL_GUARDED_BY(domain_){0};
  // recv_slots_[i] is the pool slot of RECV i; recv_state_[i] where it is.
  // kPosted: posted, or in recv_chain_ to be posted before this thread leaves the domain.
  // With the poller's shared receive queue (shared_receives_) the table holds the messages
  // delivered and not yet released instead: recv_slots_[i] is the slot message i arrived in
  // (kHeld) or kNoSlot (kIdle), and recv_free_ the indices free for the next (at most
  // recv_credits messages are held at once: each took a credit, returned on its Release).
  // early_shared_: the shared queue's receives that came before the handshake ended, which a
  // peer keeping to its window cannot send more of than initial_window(). receive_share_: what
  // the window claims of the shared queue's budget (the poller opens it at Register and closes
  // it at Unregister; credits_ grows and shrinks it between).
  enum class RecvState : uint8_t { kPosted, kHeld, kIdle };
  std::vector<uint32_t> recv_slots_;
  const bool shared_receives_;
  // Oldest first, so that a handle is reused as late as possible: a second Release of one
  // (the application's bug) is refused rather than giving back a newer message's slot.
  Ring<uint32_t> recv_free_ ABSL_GUARDED_BY(domain_);
  uint32_t early_shared_ ABSL_GUARDED_BY(domain_) = 0;
  ReceiveShare receive_share_;
  // A slot of the connection's own for credit frames, and whether one is in flight from it.
  uint32_t control_slot_ = SlotPool::kNoSlot;
  bool control_busy_ ABSL_GUARDED_BY(domain_) = false;
  uint64_t control_sequence_ ABSL_GUARDED_BY(domain_) = ~uint64_t{0};
  std::vector<RecvState> recv_state_ ABSL_GUARDED_BY(domain_);
  uint32_t recvs_posted_ ABSL_GUARDED_BY(domain_) = 0;
  std::deque<ibv_wc> early_ ABSL_GUARDED_BY(domain_);
  Ring<InFlight> in_flight_ ABSL_GUARDED_BY(domain_);
  uint64_t transfer_bytes_in_flight_ ABSL_GUARDED_BY(domain_) = 0;  // sum of InFlight::transfer
  Ring<Waiting> waiting_ ABSL_GUARDED_BY(domain_);
  uint64_t next_sequence_ ABSL_GUARDED_BY(domain_) = 0;
  uint32_t unsignaled_ ABSL_GUARDED_BY(domain_) = 0;
  // An unsignalled work request someone waits on (an OnSendDone, a held slot) has no signalled
  // one behind it yet: the next message must be signalled before a pause.
  bool owe_signal_ ABSL_GUARDED_BY(domain_) = false;
  bool sq_drained_ ABSL_GUARDED_BY(domain_) = false;
  // A queue pair of a shared receive queue on a device that raises last-WQE-reached: its drain
  // waits for the event (DrainedLocked), which sets last_wqe_reached_ (DeviceEventLocked).
  const bool awaits_last_wqe_;
  bool last_wqe_reached_ ABSL_GUARDED_BY(domain_) = false;
  bool drain_given_up_ ABSL_GUARDED_BY(domain_) = false;  // GiveUpOnDrain, once
  // !Device::binds_survive_retry: a bind goes only on a quiet send queue (QuietLocked). The
  // sequence after the last bind appended: while it is next_sequence_, a bind came last.
  const bool quiet_binds_;
  uint64_t bind_run_end_ ABSL_GUARDED_BY(domain_) = 0;
  bool bind_waits_ ABSL_GUARDED_BY(domain_) = false;  // counted in binds_waited, not yet posted
  // When the drain began (SteadyNanos, steady_clock.h), 0 when not draining: read by the poller's
  // watchdog.
  std::atomic<int64_t> draining_since_ns_{0};
  // Completion-queue entries granted to the sends (SendRoomLocked): written inside the domain,
  // read by the poller (which takes them back at Unregister, and asks holders while short).
  std::atomic<uint32_t> cq_granted_{0};
  bool cq_waiting_ ABSL_GUARDED_BY(domain_) = false;  // on the poller's list of waiters
  bool probe_owed_ ABSL_GUARDED_BY(domain_) = false;  // a Probe that found no entry: on its pass
  CqRequest cq_request_;
  std::atomic<bool> cq_request_queued_{false};
  // This side's arena: its own (arena_) or the piece lent now (arena_piece_ of the poller's
  // pool), where payloads land; arena_lent_ tells the poller this connection holds a piece.
  uint8_t* arena_base_ ABSL_GUARDED_BY(domain_) = nullptr;
  uint32_t arena_piece_ ABSL_GUARDED_BY(domain_) = kNoPiece;
  std::atomic<bool> arena_lent_{false};
  bool arena_waiting_ ABSL_GUARDED_BY(domain_) = false;  // on the poller's list of waiters
  // A payload arrived since the poller's last request: the loan is not idle (second chance).
  bool arena_used_ ABSL_GUARDED_BY(domain_) = false;
  int64_t arena_recalled_ns_ ABSL_GUARDED_BY(domain_) = 0;  // SteadyNanos of the recall
  int64_t arena_lent_ns_ ABSL_GUARDED_BY(domain_) = 0;      // SteadyNanos of the loan
  // Loan messages owed (ArenaOwed bits, MaybeSendArenaFramesLocked); lend_bound_: the lend's
  // bind is posted, under lend_rkey_.
  uint8_t arena_owed_ ABSL_GUARDED_BY(domain_) = 0;
  bool lend_bound_ ABSL_GUARDED_BY(domain_) = false;
  uint32_t lend_rkey_ ABSL_GUARDED_BY(domain_) = 0;
  ArenaRequest arena_request_;
  std::atomic<bool> arena_request_queued_{false};
  // Parked windows. This side's window: accepted_ and start_parked_ are set before the
  // connection is shared (Listener, Poller::Register), door_ there too (kept to Unregister).
  bool accepted_ = false;
  bool start_parked_ = false;
  std::optional<ParkDoors::Lease> door_;
  std::atomic<bool> knock_heard_{false};                   // the poller saw the door change
  std::atomic<bool> window_parked_{false};                 // for the poller and its stats
  bool knock_pending_ ABSL_GUARDED_BY(domain_) = false;    // heard, not answered yet
  bool floor_waiting_ ABSL_GUARDED_BY(domain_) = false;    // on the poller's list of waiters
  bool park_used_ ABSL_GUARDED_BY(domain_) = false;        // a receive since the last look
  int64_t park_asked_ns_ ABSL_GUARDED_BY(domain_) = 0;     // SteadyNanos of the kPark
  int64_t window_opened_ns_ ABSL_GUARDED_BY(domain_) = 0;  // and of the last grant
  ParkRequest park_request_;
  std::atomic<bool> park_request_queued_{false};
  // This side's sending: the server's door (from its accept reply) and the knocks sent.
  ParkDoor peer_door_{};
  uint32_t knocks_ ABSL_GUARDED_BY(domain_) = 0;
  bool knocked_ ABSL_GUARDED_BY(domain_) = false;  // since this side last parked
  ConnectionStats stats_ ABSL_GUARDED_BY(domain_);
  // Of stats_.bytes_sent (every work request's bytes, counted once in AppendLocked), the READs':
  // bytes that came in (StatsLocked moves them across).
  uint64_t bytes_read_ ABSL_GUARDED_BY(domain_) = 0;
  // Work-request templates: invariant fields filled once in CreateResources.
  ibv_send_wr send_wr_ ABSL_GUARDED_BY(domain_){};
  ibv_send_wr write_wr_ ABSL_GUARDED_BY(domain_){};
  ibv_send_wr read_wr_ ABSL_GUARDED_BY(domain_){};
  // The receives to post (RepostRecvLocked), as one chain (PostRecvChainNowLocked): at most one
  // entry per receive slot, so sized for all of them (CreateResources).
  std::vector<ibv_recv_wr> recv_chain_ ABSL_GUARDED_BY(domain_);
  uint32_t recv_chain_length_ ABSL_GUARDED_BY(domain_) = 0;
  std::vector<ibv_sge> recv_sges_;  // receive i's scatter entry: its slot, fixed at setup
  // The chain being built (AppendLocked) and posted (PostChainLocked) within one locked section.
  ibv_send_wr chain_wrs_[kPostBatch] ABSL_GUARDED_BY(domain_){};
  ibv_sge chain_sges_[kPostBatch] ABSL_GUARDED_BY(domain_){};
  uint32_t chain_length_ ABSL_GUARDED_BY(domain_) = 0;
  // The cork (DispatchBatchLocked), touched only by the thread dispatching this connection's batch:
  // a pump skipped while corked; the last message's handler is running (its first send opens the
  // cork); the cork is open.
  bool cork_pending_ = false;
  bool cork_opens_ = false;
  bool cork_open_ = false;
};

}  // namespace zrpc::transport

#endif  // ZRPC_TRANSPORT_CONNECTION_H_
