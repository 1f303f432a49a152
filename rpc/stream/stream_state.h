// StreamState: one end of one stream (WIRE.md, "Streams"): the peer's messages waiting to be
// read, and the per-stream flow control in both directions. Shared by the client's and the
// server's stream objects, which add the sending.
//
// Flow control, per stream, counted in messages. A receiver grants its peer a window of W
// messages (the client in its stream open, the server in a credit frame when its handler starts)
// and grants more as its application reads: each message read frees one, and once W/2 are free
// (at least 1) a credit frame gives them back. So a stream holds at most W unread messages on
// the receiver, whatever the sender does, and a slow reader holds back its own stream's sender
// and nothing else. A sender past its grant breaks the protocol: OnMessage refuses it and the
// runtime closes the connection.
//
// Why parsed on arrival. A received message is parsed straight from the registered receive
// buffer it arrived in (no copy), on the poller thread, into a message object the stream keeps,
// and the buffer goes back at once. Holding the buffer until the application reads would let a
// slow reader keep the connection's receive slots, which every call on it shares (32 by
// default); parsed messages cost heap memory of the stream's own, bounded by its window. The
// message objects are recycled: Read hands one out, the typed reader swaps it with the caller's,
// and the next Read reuses it, so a stream in steady state allocates nothing per message
// beyond what parsing its fields needs.
//
// Threads: the poller delivers (OnMessage, OnHalfClose, OnCredit); the application reads and
// writes, one reader and one writer at a time; End comes from whichever thread ends the call.
// Every wait wakes on End. The asynchronous form (client_stream.h) does not wait: it polls
// (TryRead, TryTakeSendCredit) and is told of each event by its StreamListener.
#ifndef ZRPC_RPC_STREAM_STREAM_STATE_H_
#define ZRPC_RPC_STREAM_STREAM_STATE_H_

#include <google/protobuf/message_lite.h>

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "rpc/bulk.h"

namespace zrpc::internal {

// Told of each event an asynchronous user of a stream may be waiting for: a message queued, the
// peer's half-close, a credit, the end. Called on the thread of the event, with no lock held.
class StreamListener {
 public:
  virtual ~StreamListener() = default;
  virtual void OnStreamEvent() = 0;
};

// Streams waiting to be told that something came back (a send slot, staging quota): each once,
// however often it asks meanwhile (a stream pumped again while it waits asks again). Guarded by
// its owner's lock; the waiters are told after that lock is let go (Take, then Tell).
class StreamWaiters {
 public:
  // False when `waiter` waits already.
  bool Add(std::weak_ptr<StreamListener> waiter) {
    for (const std::weak_ptr<StreamListener>& known : waiters_) {
      if (!known.owner_before(waiter) && !waiter.owner_before(known)) return false;
    }
    waiters_.push_back(std::move(waiter));
    return true;
  }
  bool empty() const { return waiters_.empty(); }
  std::vector<std::weak_ptr<StreamListener>> Take() { return std::exchange(waiters_, {}); }
  // Tells those still alive.
  static void Tell(const std::vector<std::weak_ptr<StreamListener>>& waiters) {
    for (const std::weak_ptr<StreamListener>& weak : waiters) {
      if (std::shared_ptr<StreamListener> waiter = weak.lock()) waiter->OnStreamEvent();
    }
  }

 private:
  std::vector<std::weak_ptr<StreamListener>> waiters_;
};

class StreamState {
 public:
  // `read_prototype`: the type of the peer's messages, granted a window at once (the client's
  // end: its stream open carries the grant); null when nothing is granted yet (the server's end:
  // see Grant). `window`: the window this side grants (>= 1). `send_credit`: messages this side
  // may send before the peer grants more.
  StreamState(const google::protobuf::MessageLite* read_prototype, uint16_t window,
              uint32_t send_credit);
  // Lets go of what is held for messages still queued (OnPulledMessage's `hold`).
  ~StreamState();
  StreamState(const StreamState&) = delete;
  StreamState& operator=(const StreamState&) = delete;

  // ---- The poller.
  // A message of the peer's arrived: parsed from `body` (which the caller gives back after).
  // Returns the credit to send now (nonzero only while the stream drains: see Drain).
  // kFailedPrecondition when the peer broke the protocol (past its window, or on a stream that
  // takes no messages, or after its half-close); kInvalidArgument when it does not parse (the
  // stream fails: End follows from the caller). A message after End is dropped.
  absl::StatusOr<uint16_t> OnMessage(absl::Span<const uint8_t> body);
  // A message of the peer's too large for this side's arena, which the caller pulls: it takes
  // its place in the queue now, as OnMessage's would, and reads wait there until
  // OnPulledMessage fills it, so the stream's later messages and its half-close never overtake
  // it. Errors as OnMessage's. `*wanted` false: nobody reads it any more (the stream ended or
  // drains), so the caller need not pull it; the credit to send then is returned as OnMessage's.
  absl::StatusOr<uint16_t> OnPulling(bool* wanted);
  // The oldest message being pulled has landed: parsed from `body`. `hold` (if any) runs once
  // the message is read or dropped: the memory its bytes were pulled into, kept until then so
  // that what a stream's unread messages hold counts against the receive budget
  // (max_pulled_bytes), not only their number. kInvalidArgument when it does not parse (the
  // stream fails). Dropped when its place is gone (the stream drained meanwhile). `bulk`: the
  // bulk payload that came beside it (a method that carries them: rpc/streaming.h), for its
  // reader, or released as the message is dropped.
  absl::Status OnPulledMessage(absl::Span<const uint8_t> body, std::function<void()> hold,
                               IncomingBulk bulk = IncomingBulk());
  // The peer sends no more messages: reads end once the queue is empty.
  absl::Status OnHalfClose();
  // The peer grants `messages` more. kFailedPrecondition past 2^31 outstanding.
  absl::Status OnCredit(uint16_t messages);
  // The stream is over for this side: reads give what is queued, then end; writes fail. The
  // first status stays (OK: the call finished normally). Wakes every wait.
  void End(absl::Status status);

  // ---- The application.
  // The peer's messages are of `read_prototype`'s type from now on, and it may send a window of
  // them: returns the window, for the credit frame that tells it so. Once, before any message
  // (until then a message breaks the protocol).
  uint16_t Grant(const google::protobuf::MessageLite* read_prototype);
  // Waits for End; its status.
  absl::Status WaitEnded();
  // The next message, waiting for one until `deadline` (monotonic); null when the peer sends no
  // more, the stream ended with nothing queued, or the deadline passed. Valid until the next
  // Read. `*grant` is the credit to send the peer now (0: none yet). `*bulk` (when set) takes
  // the message's bulk payload (empty when it has none, or no message is returned); without
  // it, a payload is released here.
  google::protobuf::MessageLite* Read(absl::Time deadline, uint16_t* grant,
                                      IncomingBulk* bulk = nullptr);
  // Read without waiting: the next message if one is queued; else null, with `*finished` true
  // when none will come (the peer sent no more, or the stream ended) and false when one may.
  google::protobuf::MessageLite* TryRead(uint16_t* grant, bool* finished,
                                         IncomingBulk* bulk = nullptr);
  // Waits until this side may send one more message (taking that credit), until `deadline`
  // (monotonic); false when the stream ended or the deadline passed.
  bool TakeSendCredit(absl::Time deadline);
  enum class Credit { kTaken, kNone, kEnded };
  // TakeSendCredit without waiting.
  Credit TryTakeSendCredit();
  // From now on `listener` hears of every event (see StreamListener); it is told once now too,
  // for what came before. Held weakly.
  void SetListener(std::weak_ptr<StreamListener> listener);
  // From now on the peer's messages are dropped as they come, and credited back at once: the
  // application stopped reading (it finishes the call) but the peer may still be sending.
  // Returns the credit to send for those already queued. Those that come later are credited
  // back by OnMessage's return, or, once a listener is set, kept for TakeDrainedCredit (the
  // listener is told).
  uint16_t Drain();
  // The credit owed for messages dropped while draining, for the asynchronous form to send.
  uint32_t TakeDrainedCredit();

  // This side stops reading and writing (an interceptor refused a message) with `status`, while
  // the call's end, which the runtime brings about, is still to come: reads return nothing,
  // writes, credits and the half-close are not sent from now on (sends_over), and WaitEnded
  // still waits for End, then returns `status` whatever the end's (the call may have ended
  // otherwise first: the refusal is what the caller must hear). Wakes every wait. Once.
  void Stop(absl::Status status);
  // Nothing more is sent on the stream by this side: it ended, or was stopped.
  bool sends_over() const;

  bool ended() const;
  // ---- A client's stream: its opening request has been handed to the transport (in the
  // connection's domain, perhaps by another thread: ClientConnection::Start). Its frames must
  // not go before it. Set once; wakes WaitOpened and the listener.
  void MarkOpened();
  bool opened() const { return opened_.load(std::memory_order_acquire); }
  // Waits until the stream is opened (true) or has ended (false).
  bool WaitOpened();
  // Why it ended (OK while it has not, or when it finished normally; Stop's status once it has,
  // if it was stopped).
  absl::Status status() const;
  // The peer said it sends no more (half-close), or the stream ended.
  bool peer_done() const;
  // Messages of the peer's being pulled whose places wait in the queue (OnPulling): a client
  // keeps its call's end behind them.
  bool pulling() const;

 private:
  // Counts a message of the peer's against its window; kFailedPrecondition for a violation.
  absl::Status AdmitLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // When nobody reads an admitted message (ended, or draining): the credit to send for it (a
  // listener to tell in `*listener`); nullopt when it is to be queued.
  std::optional<uint16_t> DropLocked(std::shared_ptr<StreamListener>* listener)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Parses `body` into a message object (a spare one if any).
  absl::Status ParseLocked(absl::Span<const uint8_t> body,
                           std::unique_ptr<google::protobuf::MessageLite>* out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A message consumed (read or dropped): the credit to send, if a frame's worth is owed.
  uint16_t Consumed() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Takes the front of the queue as current_ (the message Read returns); `*hold` takes what was
  // held for it, for the caller to run once it lets go of the lock, and `*bulk` its payload
  // (released by the caller, outside the lock, when nobody takes it).
  google::protobuf::MessageLite* PopFront(uint16_t* grant, std::function<void()>* hold,
                                          IncomingBulk* bulk) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Wakes the waits, and returns the listener to tell once the lock is let go (Notify).
  std::shared_ptr<StreamListener> Changed() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  static void Notify(const std::shared_ptr<StreamListener>& listener) {
    if (listener != nullptr) listener->OnStreamEvent();
  }

  const google::protobuf::MessageLite* prototype_ ABSL_GUARDED_BY(mu_);
  const uint16_t window_;
  mutable absl::Mutex mu_;
  absl::CondVar changed_;
  // The peer's messages in order; a null message: the place of one being pulled (OnPulling).
  struct Queued {
    std::unique_ptr<google::protobuf::MessageLite> message;
    std::function<void()> hold;  // runs as the message is read or dropped
    IncomingBulk bulk;           // the payload beside it, if any: its reader's
  };
  std::deque<Queued> queue_ ABSL_GUARDED_BY(mu_);
  uint32_t pulling_ ABSL_GUARDED_BY(mu_) = 0;  // places in queue_ still empty
  std::weak_ptr<StreamListener> listener_ ABSL_GUARDED_BY(mu_);
  bool has_listener_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::unique_ptr<google::protobuf::MessageLite>> spare_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<google::protobuf::MessageLite> current_ ABSL_GUARDED_BY(mu_);  // last Read
  uint32_t receivable_ ABSL_GUARDED_BY(mu_);  // granted to the peer and not yet received
  uint32_t owed_ ABSL_GUARDED_BY(mu_) = 0;    // consumed and not yet granted back
  uint32_t send_credit_ ABSL_GUARDED_BY(mu_);
  bool peer_done_ ABSL_GUARDED_BY(mu_) = false;
  bool draining_ ABSL_GUARDED_BY(mu_) = false;
  uint32_t drained_credit_ ABSL_GUARDED_BY(mu_) = 0;  // TakeDrainedCredit's
  bool ended_ ABSL_GUARDED_BY(mu_) = false;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;  // Stop
  absl::Status stop_status_ ABSL_GUARDED_BY(mu_);
  absl::Status status_ ABSL_GUARDED_BY(mu_);
  std::atomic<bool> opened_{false};  // written under mu_, read without it
};

}  // namespace zrpc::internal

#endif  // ZRPC_RPC_STREAM_STREAM_STATE_H_
