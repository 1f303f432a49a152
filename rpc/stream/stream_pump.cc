// StreamPump: the asynchronous form of one end of a stream, shared by client and server.

#include "rpc/stream/stream_pump.h"

#include <algorithm>
#include <utility>

namespace zrpc::internal {

void StreamPump::Read(ClientStreamCall::ReadDone done, IncomingBulk* bulk) {
  {
    absl::MutexLock lock(&mu_);
    if (abandoned_) return;
    if (!read_) {
      read_ = std::move(done);
      read_bulk_ = bulk;
    }
  }
  if (done) return done(nullptr);
  Pump();
}

void StreamPump::Write(const google::protobuf::MessageLite& message,
                       ClientStreamCall::WriteDone done, OutgoingBulk bulk) {
  {
    absl::MutexLock lock(&mu_);
    if (abandoned_) return;  // `bulk` is released on the way out
    if (!write_ && !close_writes_) {
      write_ = std::move(done);
      write_message_ = &message;
      write_bulk_ = std::move(bulk);
    }
  }
  if (done) return done(false);
  Pump();
}

void StreamPump::CloseWrites() {
  {
    absl::MutexLock lock(&mu_);
    close_writes_ = true;
  }
  Pump();
}

void StreamPump::Finish(DoneCallback done) {
  {
    absl::MutexLock lock(&mu_);
    if (abandoned_) return;
    if (!finish_started_) {
      finish_started_ = true;
      close_writes_ = true;
      finish_ = std::move(done);
      // Messages nobody will read are dropped and credited back, so a peer still writing is not
      // held on a full window while the call waits for its status (or, on a server, while its
      // answer waits for the outstanding write: the credit goes before the answer).
      owed_credit_ += state_->Drain();
    } else if (!done) {
      return;
    }
  }
  if (done) return done(absl::FailedPreconditionError("Finish called twice on one stream"));
  Pump();
}

void StreamPump::Abandon(bool close) {
  // Destroyed outside the lock: a callback may own what drops this stream.
  ClientStreamCall::ReadDone read;
  ClientStreamCall::WriteDone write;
  DoneCallback finish;
  OutgoingBulk bulk;  // released outside the lock: its release is the application's
  {
    absl::MutexLock lock(&mu_);
    abandoned_ = true;
    // A write being sent now is settled by the loop sending it (Step), once it knows.
    if (write_ && !write_sending_) sender_->OnWriteDropped();
    read = std::move(read_);
    write = std::move(write_);
    finish = std::move(finish_);
    read_ = nullptr;
    write_ = nullptr;
    finish_ = nullptr;
    write_message_ = nullptr;  // may die with the owner: never sent from here on
    if (!write_sending_) bulk = std::move(write_bulk_);
    read_bulk_ = nullptr;
    write_credit_ = false;
    if (close) close_writes_ = true;
  }
  if (close) Pump();
}

void StreamPump::WaitIdle() {
  absl::MutexLock lock(&mu_);
  while (running_ && runner_ != std::this_thread::get_id()) idle_.Wait(&mu_);
}

void StreamPump::Pump() {
  const std::shared_ptr<StreamPump> self = shared_from_this();  // a callback may drop the owner
  {
    absl::MutexLock lock(&mu_);
    if (running_) {
      again_ = true;  // the loop running elsewhere looks again, slot waits included
      return;
    }
    running_ = true;
    runner_ = std::this_thread::get_id();
    no_slot_ = false;  // an event: worth another try
  }
  while (Step()) {
  }
}

// The lock is held from the look at each operation until the loop stops, so an event that comes
// meanwhile either is seen here or pumps again after (lost wake-ups cannot happen).
bool StreamPump::Step() {
  mu_.Lock();
  if (again_) {
    again_ = false;
    no_slot_ = false;
  }
  if (!abandoned_) {
    if (finish_started_) owed_credit_ += state_->TakeDrainedCredit();
    // A server's answer ends the call: credit is worth sending before it only while a write
    // still holds the answer back (the client may be blocked writing into a full window).
    const bool answer_next = sender_->CloseEndsCall() && close_writes_ && !write_;
    if (owed_credit_ > 0 && !no_slot_ && !SideGone() && !answer_next) {
      const uint16_t grant = static_cast<uint16_t>(std::min<uint32_t>(owed_credit_, 0xffff));
      mu_.Unlock();
      const Sent sent = state_->sends_over() ? Sent::kFailed : Retried(sender_->SendCredit(grant));
      absl::MutexLock lock(&mu_);
      if (sent == Sent::kNoSlot) {
        no_slot_ = true;
      } else {
        owed_credit_ = sent == Sent::kSent ? owed_credit_ - grant : 0;
      }
      return true;
    }
    if (read_) {
      uint16_t grant = 0;
      bool finished = false;
      google::protobuf::MessageLite* message = state_->TryRead(&grant, &finished, read_bulk_);
      if (message != nullptr || finished) {
        ClientStreamCall::ReadDone done = std::move(read_);
        read_ = nullptr;
        read_bulk_ = nullptr;
        if (!SideGone()) owed_credit_ += grant;  // sent by the next step, before anything waits
        mu_.Unlock();
        done(message);  // the message stays valid until the next TryRead, after this
        return true;
      }
    }
    if (write_ && !no_slot_) {
      const StreamState::Credit credit =
          write_credit_ ? StreamState::Credit::kTaken : state_->TryTakeSendCredit();
      bool go = credit == StreamState::Credit::kEnded;
      bool quota_taken = false;
      if (credit == StreamState::Credit::kTaken) {
        write_credit_ = true;
        // Larger than a slot, from a runtime thread: the staging quota is not waited for here
        // (only this kind of thread frees it); the write waits, its credit in hand, to be told.
        go = state_->ended() ||
             sender_->QuotaOrWait(write_message_->ByteSizeLong(), !write_bulk_.empty(),
                                  &quota_taken, weak_from_this());
      }
      if (go) {
        const google::protobuf::MessageLite* message = write_message_;
        OutgoingBulk bulk = std::move(write_bulk_);  // the Sender's while it sends
        write_sending_ = true;
        mu_.Unlock();
        const Sent sent = credit == StreamState::Credit::kTaken
                              ? Retried(sender_->SendMessage(*message, &bulk, quota_taken))
                              : Sent::kFailed;
        mu_.Lock();
        write_sending_ = false;
        if (!write_) {  // abandoned while it was sent: the owner is told only if it did not go
          if (sent != Sent::kSent) sender_->OnWriteDropped();
          mu_.Unlock();
          return true;  // `bulk`, if still here, is released without the lock
        }
        if (sent == Sent::kNoSlot) {  // the write stays, its credit and its payload in hand
          write_bulk_ = std::move(bulk);
          no_slot_ = true;
          mu_.Unlock();
          return true;
        }
        ClientStreamCall::WriteDone done = std::move(write_);
        write_ = nullptr;
        write_credit_ = false;
        const bool live = !abandoned_;
        mu_.Unlock();
        bulk.Reset();  // not sent: released before the callback says so
        if (live && done) done(sent == Sent::kSent);
        return true;
      }
    }
  }
  // A dropped server call is still answered (Abandon with `close`): only that goes on.
  const bool may_close = !abandoned_ || sender_->CloseEndsCall();
  if (close_writes_ && !writes_closed_ && !write_ && !no_slot_ && may_close) {
    const bool ends_call = sender_->CloseEndsCall();
    mu_.Unlock();
    const Sent sent =
        state_->sends_over() && !ends_call ? Sent::kFailed : Retried(sender_->CloseWrites());
    absl::MutexLock lock(&mu_);
    if (sent == Sent::kNoSlot) {
      no_slot_ = true;
    } else {
      writes_closed_ = true;
    }
    return true;
  }
  if (!abandoned_ && finish_ && !read_ && !write_ && writes_closed_ && state_->ended()) {
    DoneCallback done = std::move(finish_);
    finish_ = nullptr;
    mu_.Unlock();
    // The pump's own send may have run another stream's callback, which dropped this one.
    bool live;
    {
      absl::MutexLock lock(&mu_);
      live = !abandoned_;
    }
    if (live) done(state_->status());
    return true;
  }
  running_ = false;
  idle_.SignalAll();
  mu_.Unlock();
  return false;
}

}  // namespace zrpc::internal
