#include "rpc/client_stream.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace zrpc::internal {

ClientStream::~ClientStream() {
  if (core_->ended()) return;
  Cancel();  // on this thread: it ends the call here unless another thread is ending it
  static_cast<void>(core_->WaitEnded());
}

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
