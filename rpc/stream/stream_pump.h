// StreamPump: the asynchronous form of one end of a stream (rpc/streaming.h, "Asynchronous
// streams"), shared by the client's streams (client_stream.h) and the server's (an AsyncService's
// handlers: server_connection.h). Only the sending differs between the two, and a Sender supplies
// it.
//
// Each operation (Read, Write, CloseWrites, Finish) is recorded, and Pump carries out whatever is
// ready, on the thread that starts an operation or on the one that brings what it waited for
// (the poller with a message, a credit or a freed send slot, whichever thread ends the call, the
// timer retrying a frame that found no send slot). One thread pumps a stream at a time, and an
// operation started from a callback is carried out by the same loop after the callback returns, so
// callbacks never nest and a stream read to its end takes no stack. A write waiting for the peer's
// room holds only a pointer to the message: it is serialized into a send slot when the room comes,
// so a stalled stream holds no slot. What is sent from a runtime thread never waits for a slot or
// the staging quota (that thread is the one that frees them): a frame that finds none stays,
// unsent, and the pump runs again when quota comes back (Sender::QuotaOrWait) or a slot does
// (Sender::RetryLater).
//
// The two sides' ends differ:
//  - a client closes its writes with a half-close frame and then waits (Finish) for the
//    server's status, which ends the state;
//  - a server's CloseWrites is its final answer (ServerCall::Finish): it ends the call and the
//    state, after which the Sender must not be used, and nothing more is sent.
// Abandon (the owner's destruction) drops every callback not run and the outstanding write
// (its message may die with the owner); with `close` the writes are closed still (the server
// answers a dropped call), without it nothing more is sent (the client cancels instead).
#ifndef ZRPC_RPC_STREAM_STREAM_PUMP_H_
#define ZRPC_RPC_STREAM_STREAM_PUMP_H_

#include <google/protobuf/message_lite.h>

#include <cstdint>
#include <memory>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "rpc/generated_api.h"
#include "rpc/stream/stream_state.h"

namespace zrpc::internal {

class StreamPump final : public StreamListener, public std::enable_shared_from_this<StreamPump> {
 public:
  // What one of the pump's sends came to. kNoSlot: every send slot is taken and this is a
  // runtime thread; the pump asks the Sender to run it again later (RetryLater).
  enum class Sent { kSent, kNoSlot, kFailed };

  // One end's sending. Called by the pump's one running thread, never two at a time.
  class Sender {
   public:
    virtual ~Sender() = default;
    // A stream message (`quota_taken`: QuotaOrWait took the staging quota it needs), with the
    // bulk payload in `*bulk` beside it if that is not empty: taken unless the send found no
    // slot (kNoSlot), when it stays for the next try.
    virtual Sent SendMessage(const google::protobuf::MessageLite& message, OutgoingBulk* bulk,
                             bool quota_taken) = 0;
    // `messages` more the peer may send.
    virtual Sent SendCredit(uint16_t messages) = 0;
    // The end of this side's writes (see the top of this file).
    virtual Sent CloseWrites() = 0;
    // Whether CloseWrites ends the call (the server): nothing is sent after it, and the Sender is
    // not used again.
    virtual bool CloseEndsCall() const = 0;
    // Whether a message of `size` bytes (`has_bulk`: with a bulk payload) may be sent now: true,
    // with `*quota_taken` set when the staging quota it needs was taken here; false when it
    // waits for the quota (a runtime thread, which must not wait: `waiter` is told when it comes
    // back).
    virtual bool QuotaOrWait(size_t size, bool has_bulk, bool* quota_taken,
                             std::weak_ptr<StreamListener> waiter) = 0;
    // A send found no slot (kNoSlot): `pump` runs again once one may have come back (the
    // connection's next completion batch that frees one; the channel's timer or the server's
    // sweeper, within a millisecond, as the fallback).
    virtual void RetryLater(std::weak_ptr<StreamListener> pump) = 0;
    // A write the owner dropped (Abandon) was not sent (called under the pump's lock: must not
    // call back).
    virtual void OnWriteDropped() {}
  };

  // `sender`: its sending (its own until CloseWrites when that ends the call). `writes`: this side
  // may write (else its writes count as closed from the start; a server's always pass true:
  // their CloseWrites is the answer).
  StreamPump(std::unique_ptr<Sender> sender, std::shared_ptr<StreamState> state, bool writes)
      : sender_(std::move(sender)), state_(std::move(state)), writes_closed_(!writes) {}

  void OnStreamEvent() override { Pump(); }

  // Each records its operation and pumps. Refused at once, on the calling thread: a second
  // Read or Write while one is outstanding, a Write after the writes closed (misuse: their
  // callbacks are the one exception to "never nested, never overlapping"). Once abandoned,
  // nothing is recorded and the callback is dropped unrun.
  // `bulk` (when set, alive until `done` runs) takes the message's bulk payload.
  void Read(ClientStreamCall::ReadDone done, IncomingBulk* bulk = nullptr);
  // `bulk` goes beside the message; released unsent when the write is refused or dropped.
  void Write(const google::protobuf::MessageLite& message, ClientStreamCall::WriteDone done,
             OutgoingBulk bulk = OutgoingBulk());
  // Closes the writes, after the outstanding write if any.
  void CloseWrites();
  // Closes the writes, drops what comes unread from then on (credited back while the call
  // lasts) and runs `done` (if set) with the final status once the call has ended and the
  // outstanding read and write have completed. A second Finish's `done` gets
  // FAILED_PRECONDITION at once.
  void Finish(DoneCallback done);
  // No callback runs from now on (one running now finishes: WaitIdle); see the top of this file.
  // A write still outstanding is dropped and the Sender told (OnWriteDropped).
  void Abandon(bool close);
  // Returns once no thread but this one runs the pump: a callback running on another thread
  // has returned.
  void WaitIdle();

 private:
  // Carries out what is ready, until nothing is.
  void Pump();
  // One ready operation carried out (true), or the loop stopped (false).
  bool Step();
  // `sent`, after asking for a retry when it found no slot. Without the lock.
  Sent Retried(Sent sent) {
    if (sent == Sent::kNoSlot) sender_->RetryLater(weak_from_this());
    return sent;
  }
  // Writes are over for the Sender (a server that answered): nothing more is sent.
  bool SideGone() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return writes_closed_ && sender_->CloseEndsCall();
  }

  const std::unique_ptr<Sender> sender_;
  const std::shared_ptr<StreamState> state_;

  absl::Mutex mu_;  // before the state's and the quota's (Step polls and takes under it)
  absl::CondVar idle_;
  ClientStreamCall::ReadDone read_ ABSL_GUARDED_BY(mu_);
  IncomingBulk* read_bulk_ ABSL_GUARDED_BY(mu_) = nullptr;  // where read_'s payload goes
  ClientStreamCall::WriteDone write_ ABSL_GUARDED_BY(mu_);
  const google::protobuf::MessageLite* write_message_ ABSL_GUARDED_BY(mu_) = nullptr;
  OutgoingBulk write_bulk_ ABSL_GUARDED_BY(mu_);     // beside write_message_
  bool write_credit_ ABSL_GUARDED_BY(mu_) = false;   // taken for write_, which waits for more
  bool write_sending_ ABSL_GUARDED_BY(mu_) = false;  // write_ is in the Sender's SendMessage
  uint32_t owed_credit_ ABSL_GUARDED_BY(mu_) = 0;    // read (or dropped), not yet granted back
  bool close_writes_ ABSL_GUARDED_BY(mu_) = false;   // asked for (CloseWrites, Finish)
  bool writes_closed_ ABSL_GUARDED_BY(mu_);          // done (or the stream has no writes)
  DoneCallback finish_ ABSL_GUARDED_BY(mu_);
  bool finish_started_ ABSL_GUARDED_BY(mu_) = false;
  bool running_ ABSL_GUARDED_BY(mu_) = false;  // a thread is in Pump's loop
  bool again_ ABSL_GUARDED_BY(mu_) = false;    // an event or an operation came meanwhile
  bool no_slot_ ABSL_GUARDED_BY(mu_) = false;  // a send found no slot: none until an event
  bool abandoned_ ABSL_GUARDED_BY(mu_) = false;
  std::thread::id runner_ ABSL_GUARDED_BY(mu_);
};

}  // namespace zrpc::internal

#endif  // ZRPC_RPC_STREAM_STREAM_PUMP_H_
