#include "rpc/client_stream.h"

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

  void Read(ReadDone done) {
    {
      absl::MutexLock lock(&mu_);
      if (!read_) read_ = std::move(done);
    }
    if (done) return done(nullptr);  // one outstanding already: a misuse, refused
    Pump();
  }
  void Write(const google::protobuf::MessageLite& message, WriteDone done) {
    {
      absl::MutexLock lock(&mu_);
      if (!write_ && !close_writes_) {
        write_ = std::move(done);
        write_message_ = &message;
      }
    }
    if (done) return done(false);  // one outstanding already, or the writes closed
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
      if (!finish_started_) {
        finish_started_ = true;
        close_writes_ = true;
        finish_ = std::move(done);
      }
    }
    if (done) {
      return done(absl::FailedPreconditionError("Finish called twice on one stream"));
    }
    // Messages nobody will read are dropped and credited back, so a server still writing is not
    // held on a full window while the call waits for its status.
    if (const uint16_t grant = core_->Drain(); grant > 0) SendCredit(grant);
    Pump();
  }
  // No callback runs from now on; one running on another thread has returned when this does.
  void Abandon() {
    absl::MutexLock lock(&mu_);
    abandoned_ = true;
    if (!running_ || runner_ == std::this_thread::get_id()) return;
    while (running_) idle_.Wait(&mu_);
  }

 private:
  void SendCredit(uint16_t grant) {
    static_cast<void>(
        connection_->SendOnStream(id_, RpcHeader::StreamCredit(id_, grant), nullptr, *core_));
  }

  // Carries out what is ready, until nothing is (see the top of client_stream.h).
  void Pump() {
    const std::shared_ptr<Async> self = shared_from_this();  // a callback may drop the stream
    {
      absl::MutexLock lock(&mu_);
      if (running_) {
        again_ = true;  // the loop running elsewhere looks again before it stops
        return;
      }
      running_ = true;
      runner_ = std::this_thread::get_id();
    }
    while (Step()) {
    }
  }

  // One ready operation carried out (true), or the loop stopped (false).
  bool Step() {
    mu_.Lock();
    again_ = false;
    if (!abandoned_) {
      if (read_) {
        uint16_t grant = 0;
        bool finished = false;
        google::protobuf::MessageLite* message = core_->TryRead(&grant, &finished);
        if (message != nullptr || finished) {
          ReadDone done = std::move(read_);
          read_ = nullptr;
          mu_.Unlock();
          if (grant > 0) SendCredit(grant);
          done(message);  // the message stays valid until the next TryRead, after this
          return true;
        }
      }
      if (write_) {
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
          WriteDone done = std::move(write_);
          write_ = nullptr;
          write_credit_ = false;
          const google::protobuf::MessageLite* message = write_message_;
          mu_.Unlock();
          const bool sent = credit == StreamCore::Credit::kTaken &&
                            connection_->SendOnStream(id_, RpcHeader::StreamMessage(id_),
                                                      message, *core_, quota_taken);
          done(sent);
          return true;
        }
      }
      if (close_writes_ && !writes_closed_ && !write_) {
        writes_closed_ = true;
        mu_.Unlock();
        if (!core_->ended()) {
          static_cast<void>(connection_->SendOnStream(id_, RpcHeader::HalfClose(id_), nullptr,
                                                      *core_));
        }
        return true;
      }
      if (finish_ && !read_ && !write_ && writes_closed_ &&
          core_->ended()) {
        DoneCallback done = std::move(finish_);
        finish_ = nullptr;
        mu_.Unlock();
        done(core_->status());
        return true;
      }
      if (again_) {  // something came while this looked: look again
        mu_.Unlock();
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

  absl::Mutex mu_;  // before the core's (Step polls the core under it)
  absl::CondVar idle_;
  ReadDone read_ ABSL_GUARDED_BY(mu_);
  WriteDone write_ ABSL_GUARDED_BY(mu_);
  const google::protobuf::MessageLite* write_message_ ABSL_GUARDED_BY(mu_) = nullptr;
  bool write_credit_ ABSL_GUARDED_BY(mu_) = false;  // taken for write_, which waits for quota
  bool close_writes_ ABSL_GUARDED_BY(mu_) = false;  // asked for (WritesDone, Finish)
  bool writes_closed_ ABSL_GUARDED_BY(mu_);         // done (or the stream has no writes)
  DoneCallback finish_ ABSL_GUARDED_BY(mu_);
  bool finish_started_ ABSL_GUARDED_BY(mu_) = false;
  bool running_ ABSL_GUARDED_BY(mu_) = false;  // a thread is in Pump's loop
  bool again_ ABSL_GUARDED_BY(mu_) = false;    // an event or an operation came meanwhile
  bool abandoned_ ABSL_GUARDED_BY(mu_) = false;
  std::thread::id runner_ ABSL_GUARDED_BY(mu_);
};

ClientStream::~ClientStream() {
  if (async_ != nullptr) async_->Abandon();
  if (core_->ended()) return;
  Cancel();  // on this thread: it ends the call here unless another thread is ending it
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
