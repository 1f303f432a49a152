#include "rpc/client_stream.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace zrpc::internal {

class ClientStream::Async final : public StreamListener,
                                  public std::enable_shared_from_this<Async> {
 public:
  Async(std::shared_ptr<ClientConnection> connection, uint64_t id,
        std::shared_ptr<StreamCore> core, bool writes)
      : connection_(std::move(connection)), id_(id), core_(std::move(core)),
        writes_closed_(!writes) {}

  void OnStreamEvent() override { Pump(); }

  // Each records its operation and pumps. Refused at once, on the calling thread: a second
  // Read or Write while one is outstanding, a Write after the writes closed, a second Finish
  // (misuse: their callbacks are the one exception to "never nested, never overlapping").
  // Once abandoned, nothing is recorded and the callback is dropped unrun.
  void Read(ReadDone done) {
    {
      absl::MutexLock lock(&mu_);
      if (abandoned_) return;
      if (!read_) read_ = std::move(done);
    }
    if (done) return done(nullptr);
    Pump();
  }
  void Write(const google::protobuf::MessageLite& message, WriteDone done) {
    {
      absl::MutexLock lock(&mu_);
      if (abandoned_) return;
      if (!write_ && !close_writes_) {
        write_ = std::move(done);
        write_message_ = &message;
      }
    }
    if (done) return done(false);
    Pump();
  }
  void WritesDone() {
    {
      absl::MutexLock lock(&mu_);
      close_writes_ = true;
    }
    Pump();
  }
  void Finish(DoneCallback done) {
    {
      absl::MutexLock lock(&mu_);
      if (abandoned_) return;
      if (!finish_started_) {
        finish_started_ = true;
        close_writes_ = true;
        finish_ = std::move(done);
        // Messages nobody will read are dropped and credited back, so a server still writing
        // is not held on a full window while the call waits for its status.
        owed_credit_ += core_->Drain();
      }
    }
    if (done) {
      return done(absl::FailedPreconditionError("Finish called twice on one stream"));
    }
    Pump();
  }
  // No callback runs from now on (one running now finishes: WaitIdle).
  void Abandon() {
    absl::MutexLock lock(&mu_);
    abandoned_ = true;
  }
  // Returns once no thread but this one runs the pump: a callback running on another thread
  // has returned. Its sends do not wait for long: after Abandon, the call's end (its cancel)
  // ends their waits.
  void WaitIdle() {
    absl::MutexLock lock(&mu_);
    while (running_ && runner_ != std::this_thread::get_id()) idle_.Wait(&mu_);
  }

 private:
  // What one of the pump's sends came to.
  enum class Sent { kSent, kNoSlot, kFailed };
  Sent Send(const RpcHeader& header, const google::protobuf::MessageLite* message,
            bool quota_taken = false) {
    bool no_slot = false;
    if (connection_->SendOnStream(id_, header, message, *core_, quota_taken, &no_slot)) {
      return Sent::kSent;
    }
    if (!no_slot) return Sent::kFailed;
    // Every send slot is taken and this is a runtime thread, which does not wait for one: the
    // timer's next pass (within a millisecond) pumps again.
    connection_->WaitForSlot(weak_from_this());
    return Sent::kNoSlot;
  }

  // Whether a callback may still run: one that the pump's own send made (another stream's
  // callback run by quota coming back, say) may have dropped this stream.
  bool Live() {
    absl::MutexLock lock(&mu_);
    return !abandoned_;
  }

  // Carries out what is ready, until nothing is (see the top of client_stream.h).
  void Pump() {
    const std::shared_ptr<Async> self = shared_from_this();  // a callback may drop the stream
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

  // One ready operation carried out (true), or the loop stopped (false). The lock is held from
  // the look at each operation until the loop stops, so an event that comes meanwhile either
  // is seen here or pumps again after (lost wake-ups cannot happen).
  bool Step() {
    mu_.Lock();
    if (again_) {
      again_ = false;
      no_slot_ = false;
    }
    if (!abandoned_) {
      if (owed_credit_ > 0 && !no_slot_) {
        const uint16_t grant = static_cast<uint16_t>(std::min<uint32_t>(owed_credit_, 0xffff));
        mu_.Unlock();
        const Sent sent = core_->ended() ? Sent::kFailed : Send(RpcHeader::StreamCredit(id_, grant), nullptr);
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
        google::protobuf::MessageLite* message = core_->TryRead(&grant, &finished);
        if (message != nullptr || finished) {
          ReadDone done = std::move(read_);
          read_ = nullptr;
          owed_credit_ += grant;  // sent by the next step, before anything waits on it
          mu_.Unlock();
          done(message);  // the message stays valid until the next TryRead, after this
          return true;
        }
      }
      if (write_ && !no_slot_) {
        const StreamCore::Credit credit =
            write_credit_ ? StreamCore::Credit::kTaken : core_->TryTakeSendCredit();
        bool go = credit == StreamCore::Credit::kEnded;
        bool quota_taken = false;
        if (credit == StreamCore::Credit::kTaken) {
          write_credit_ = true;
          // Larger than a slot, from a runtime thread: the staging quota is not waited for here
          // (only this kind of thread frees it); the write waits, its credit in hand, to be told.
          const size_t size = write_message_->ByteSizeLong();
          const transport::Connection& c = connection_->connection();
          go = !OnRuntimeThread() || RpcConnection::FitsSlot(c, size) ||
               size > c.peer_arena_size() || core_->ended() ||
               (quota_taken = connection_->TakeQuotaOrWait(c, size, weak_from_this()));
        }
        if (go) {
          const google::protobuf::MessageLite* message = write_message_;
          mu_.Unlock();
          const Sent sent = credit == StreamCore::Credit::kTaken
                                ? Send(RpcHeader::StreamMessage(id_), message, quota_taken)
                                : Sent::kFailed;
          mu_.Lock();
          if (sent == Sent::kNoSlot) {  // the write stays, its credit in hand
            no_slot_ = true;
            mu_.Unlock();
            return true;
          }
          WriteDone done = std::move(write_);
          write_ = nullptr;
          write_credit_ = false;
          const bool live = !abandoned_;
          mu_.Unlock();
          if (live) done(sent == Sent::kSent);
          return true;
        }
      }
      if (close_writes_ && !writes_closed_ && !write_ && !no_slot_) {
        mu_.Unlock();
        const Sent sent = core_->ended() ? Sent::kFailed : Send(RpcHeader::HalfClose(id_), nullptr);
        absl::MutexLock lock(&mu_);
        if (sent == Sent::kNoSlot) {
          no_slot_ = true;
        } else {
          writes_closed_ = true;
        }
        return true;
      }
      if (finish_ && !read_ && !write_ && writes_closed_ && core_->ended()) {
        DoneCallback done = std::move(finish_);
        finish_ = nullptr;
        mu_.Unlock();
        if (Live()) done(core_->status());
        return true;
      }
    }
    running_ = false;
    idle_.SignalAll();
    mu_.Unlock();
    return false;
  }

  const std::shared_ptr<ClientConnection> connection_;
  const uint64_t id_;
  const std::shared_ptr<StreamCore> core_;

  absl::Mutex mu_;  // before the core's and the quota's (Step polls and takes under it)
  absl::CondVar idle_;
  ReadDone read_ ABSL_GUARDED_BY(mu_);
  WriteDone write_ ABSL_GUARDED_BY(mu_);
  const google::protobuf::MessageLite* write_message_ ABSL_GUARDED_BY(mu_) = nullptr;
  bool write_credit_ ABSL_GUARDED_BY(mu_) = false;  // taken for write_, which waits for more
  uint32_t owed_credit_ ABSL_GUARDED_BY(mu_) = 0;   // read (or dropped), not yet granted back
  bool close_writes_ ABSL_GUARDED_BY(mu_) = false;  // asked for (WritesDone, Finish)
  bool writes_closed_ ABSL_GUARDED_BY(mu_);         // done (or the stream has no writes)
  DoneCallback finish_ ABSL_GUARDED_BY(mu_);
  bool finish_started_ ABSL_GUARDED_BY(mu_) = false;
  bool running_ ABSL_GUARDED_BY(mu_) = false;  // a thread is in Pump's loop
  bool again_ ABSL_GUARDED_BY(mu_) = false;    // an event or an operation came meanwhile
  bool no_slot_ ABSL_GUARDED_BY(mu_) = false;  // a send found no slot: none until an event
  bool abandoned_ ABSL_GUARDED_BY(mu_) = false;
  std::thread::id runner_ ABSL_GUARDED_BY(mu_);
};

ClientStream::~ClientStream() {
  if (async_ != nullptr) async_->Abandon();  // no callback runs from here on
  // On this thread: it ends the call here unless another thread is ending it, and with it any
  // wait of a send (for a slot, or the quota) that a pump running elsewhere is in.
  if (!core_->ended()) Cancel();
  if (async_ != nullptr) async_->WaitIdle();
  static_cast<void>(core_->WaitEnded());
}

ClientStream::Async& ClientStream::async() {
  std::call_once(async_once_, [this] {
    async_ = std::make_shared<Async>(connection_, id_, core_, !writes_done_.load());
    core_->SetListener(async_);
  });
  return *async_;
}

void ClientStream::StartRead(ReadDone done) { async().Read(std::move(done)); }
void ClientStream::StartWrite(const google::protobuf::MessageLite& message, WriteDone done) {
  async().Write(message, std::move(done));
}
void ClientStream::StartWritesDone() { async().WritesDone(); }
void ClientStream::StartFinish(DoneCallback done) { async().Finish(std::move(done)); }

bool ClientStream::RefusedOnRuntimeThread(const char* what) {
  if (!OnRuntimeThread()) return false;
  if (id_ != 0) {
    connection_->AbortCall(id_, absl::FailedPreconditionError(absl::StrCat(
        what, " called on a runtime thread (a poller or the timer, in a DoneCallback): a "
              "blocking stream waits for those threads; use it from a thread of your own")));
  }
  return true;
}

bool ClientStream::Write(const google::protobuf::MessageLite& message) {
  if (writes_done_.load(std::memory_order_acquire) || id_ == 0) return false;
  if (RefusedOnRuntimeThread("Write")) return false;
  // The server grants room as its handler reads; the call's end (deadline, cancel, failure)
  // wakes this wait.
  if (!core_->TakeSendCredit(absl::InfiniteFuture())) return false;
  absl::MutexLock lock(&send_mu_);
  if (writes_done_.load(std::memory_order_acquire)) return false;  // closed while it waited
  return connection_->SendOnStream(id_, RpcHeader::StreamMessage(id_), &message, *core_);
}

google::protobuf::MessageLite* ClientStream::Read() {
  if (RefusedOnRuntimeThread("Read")) return nullptr;
  uint16_t grant = 0;
  google::protobuf::MessageLite* message = core_->Read(absl::InfiniteFuture(), &grant);
  if (grant > 0) {
    static_cast<void>(
        connection_->SendOnStream(id_, RpcHeader::StreamCredit(id_, grant), nullptr, *core_));
  }
  return message;
}

bool ClientStream::WritesDone() {
  if (id_ == 0 || RefusedOnRuntimeThread("WritesDone")) return false;
  absl::MutexLock lock(&send_mu_);
  if (writes_done_.exchange(true, std::memory_order_acq_rel)) return false;
  return connection_->SendOnStream(id_, RpcHeader::HalfClose(id_), nullptr, *core_);
}

absl::Status ClientStream::Finish() {
  RefusedOnRuntimeThread("Finish");  // ends the call: the wait below returns at once
  // A server reading the client's messages waits for the half-close: one that was not sent
  // goes now rather than leaving both ends waiting for the deadline.
  if (!writes_done_.load(std::memory_order_acquire)) static_cast<void>(WritesDone());
  if (!core_->ended() && id_ != 0) {
    // Messages nobody will read are dropped and credited back, so a server still writing is
    // not held on a full window while this waits for its status.
    if (const uint16_t grant = core_->Drain(); grant > 0) {
      static_cast<void>(
          connection_->SendOnStream(id_, RpcHeader::StreamCredit(id_, grant), nullptr, *core_));
    }
  }
  return core_->WaitEnded();
}

void ClientStream::Cancel() {
  if (id_ != 0) connection_->CancelCall(id_);
}

}  // namespace zrpc::internal
