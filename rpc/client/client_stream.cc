// ClientStream: the client's end of one stream, blocking and asynchronous.

#include "rpc/client/client_stream.h"

#include <algorithm>
#include <utility>

#include "absl/base/optimization.h"
#include "absl/strings/str_cat.h"

namespace zrpc::internal {

// The client's sending, for its asynchronous form.
class ClientStream::Sender final : public StreamPump::Sender {
 public:
  Sender(std::shared_ptr<ClientConnection> connection, uint64_t id,
         std::shared_ptr<StreamState> state)
      : connection_(std::move(connection)), id_(id), state_(std::move(state)) {}
  StreamPump::Sent SendMessage(const google::protobuf::MessageLite& message, OutgoingBulk* bulk,
                               bool quota_taken) override {
    return Send(RpcHeader::StreamMessage(id_), &message, quota_taken, bulk);
  }
  StreamPump::Sent SendCredit(uint16_t messages) override {
    return Send(RpcHeader::StreamCredit(id_, messages), nullptr, false);
  }
  StreamPump::Sent CloseWrites() override {
    return Send(RpcHeader::HalfClose(id_), nullptr, false);
  }
  bool CloseEndsCall() const override { return false; }
  bool QuotaOrWait(size_t size, bool has_bulk, bool* quota_taken,
                   std::weak_ptr<StreamListener> waiter) override {
    return connection_->StreamQuotaOrWait(connection_->connection(), size, OnRuntimeThread(),
                                          std::move(waiter), quota_taken, has_bulk);
  }
  void RetryLater(std::weak_ptr<StreamListener> pump) override {
    connection_->WaitForSlot(std::move(pump));
  }

 private:
  StreamPump::Sent Send(const RpcHeader& header, const google::protobuf::MessageLite* message,
                        bool quota_taken, OutgoingBulk* bulk = nullptr) {
    bool no_slot = false;
    if (connection_->SendOnStream(id_, header, message, *state_, quota_taken, &no_slot, bulk)) {
      return StreamPump::Sent::kSent;
    }
    // Every send slot is taken and this is a runtime thread, which does not wait for one.
    return no_slot ? StreamPump::Sent::kNoSlot : StreamPump::Sent::kFailed;
  }

  const std::shared_ptr<ClientConnection> connection_;
  const uint64_t id_;
  const std::shared_ptr<StreamState> state_;
};

ClientStream::~ClientStream() {
  if (async_ != nullptr) async_->Abandon(/*close=*/false);  // no callback runs from here on
  // On this thread: it ends the call here unless another thread is ending it, and with it any
  // wait of a send (for a slot, or the quota) that a pump running elsewhere is in.
  if (!state_->ended()) Cancel();
  if (async_ != nullptr) async_->WaitIdle();
  static_cast<void>(state_->WaitEnded());
}

StreamPump& ClientStream::async() {
  std::call_once(async_once_, [this] {
    async_ = std::make_shared<StreamPump>(std::make_unique<Sender>(connection_, id_, state_),
                                          state_, !writes_done_.load());
    state_->SetListener(async_);
  });
  return *async_;
}

void ClientStream::StartRead(ReadDone done, IncomingBulk* bulk) {
  if (ABSL_PREDICT_TRUE(chain_ == nullptr)) return async().Read(std::move(done), bulk);
  // The interceptors see the message where the read completes, before the caller does.
  async().Read(
      [this, bulk, done = std::move(done)](google::protobuf::MessageLite* message) {
        if (message != nullptr && !Intercept(StreamDirection::kReceived, *message)) {
          message = nullptr;
          if (bulk != nullptr) bulk->Reset();
        }
        done(message);
      },
      bulk);
}
void ClientStream::StartWrite(const google::protobuf::MessageLite& message, OutgoingBulk bulk,
                              WriteDone done) {
  // A message an interceptor refuses, or a payload the method does not carry, ends the stream,
  // and the pump then completes this write with false, unsent.
  const bool refused = ABSL_PREDICT_FALSE(!bulk.empty()) && RefusedBulk(bulk);
  if (ABSL_PREDICT_FALSE(chain_ != nullptr) && !refused) {
    static_cast<void>(Intercept(StreamDirection::kSent, message));
  }
  async().Write(message, std::move(done), std::move(bulk));
}

bool ClientStream::RefusedBulk(const OutgoingBulk& bulk) {
  if (bulk.empty() || method_->request_bulk) return false;
  const absl::Status refused = absl::InvalidArgumentError(
      absl::StrCat("a ", bulk.size(),
                   "-byte bulk payload on a stream message of a method whose requests carry none "
                   "(mark it (zrpc.method).request_bulk in its .proto)"));
  state_->Stop(
      absl::Status(refused.code(), absl::StrCat(method_->full_name, ": ", refused.message())));
  if (id_ != 0) connection_->AbortCall(id_, refused);
  return true;
}

bool ClientStream::Intercept(StreamDirection direction,
                             const google::protobuf::MessageLite& message) {
  if (chain_ == nullptr) return true;
  const size_t count = chain_->size();
  absl::Status status;
  for (size_t i = 0; i < count && status.ok(); ++i) {
    const size_t at = direction == StreamDirection::kSent ? i : count - 1 - i;
    status = (*chain_)[at]->OnStreamMessage(*method_, direction, message);
  }
  if (status.ok()) return true;
  // Stopped here first, so that nothing more is sent or read (the abort below may run later,
  // in the domain); the stream ends with the call, after its interceptors' end, which is what
  // Finish waits for.
  state_->Stop(
      absl::Status(status.code(), absl::StrCat(method_->full_name, ": ", status.message())));
  if (id_ != 0) connection_->AbortCall(id_, std::move(status));
  return false;
}

void ClientStream::StartWritesDone() { async().CloseWrites(); }
void ClientStream::StartFinish(DoneCallback done) { async().Finish(std::move(done)); }

bool ClientStream::RefusedOnRuntimeThread(const char* what) {
  if (!OnRuntimeThread()) return false;
  if (id_ != 0) {
    connection_->AbortCall(
        id_, absl::FailedPreconditionError(absl::StrCat(
                 what,
                 " called on a runtime thread (a poller or the timer, in a DoneCallback): a "
                 "blocking stream waits for those threads; use it from a thread of your own")));
  }
  return true;
}

bool ClientStream::Write(const google::protobuf::MessageLite& message, OutgoingBulk bulk) {
  if (writes_done_.load(std::memory_order_acquire) || id_ == 0) return false;
  if (RefusedOnRuntimeThread("Write")) return false;
  if (ABSL_PREDICT_FALSE(!bulk.empty()) && RefusedBulk(bulk)) return false;
  if (ABSL_PREDICT_FALSE(chain_ != nullptr) && !Intercept(StreamDirection::kSent, message)) {
    return false;
  }
  // The server grants room as its handler reads; the call's end (deadline, cancel, failure)
  // wakes this wait.
  if (!state_->TakeSendCredit(absl::InfiniteFuture())) return false;
  absl::MutexLock lock(&send_mu_);
  if (writes_done_.load(std::memory_order_acquire)) return false;  // closed while it waited
  return connection_->SendOnStream(id_, RpcHeader::StreamMessage(id_), &message, *state_,
                                   /*quota_taken=*/false, /*no_slot=*/nullptr, &bulk);
}

google::protobuf::MessageLite* ClientStream::Read(IncomingBulk* bulk) {
  if (RefusedOnRuntimeThread("Read")) {
    if (bulk != nullptr) bulk->Reset();
    return nullptr;
  }
  uint16_t grant = 0;
  google::protobuf::MessageLite* message = state_->Read(absl::InfiniteFuture(), &grant, bulk);
  if (grant > 0) {
    static_cast<void>(
        connection_->SendOnStream(id_, RpcHeader::StreamCredit(id_, grant), nullptr, *state_));
  }
  if (ABSL_PREDICT_FALSE(chain_ != nullptr) && message != nullptr &&
      !Intercept(StreamDirection::kReceived, *message)) {
    if (bulk != nullptr) bulk->Reset();
    return nullptr;
  }
  return message;
}

bool ClientStream::WritesDone() {
  if (id_ == 0 || RefusedOnRuntimeThread("WritesDone")) return false;
  absl::MutexLock lock(&send_mu_);
  if (writes_done_.exchange(true, std::memory_order_acq_rel)) return false;
  return connection_->SendOnStream(id_, RpcHeader::HalfClose(id_), nullptr, *state_);
}

absl::Status ClientStream::Finish() {
  RefusedOnRuntimeThread("Finish");  // ends the call: the wait below returns at once
  // A server reading the client's messages waits for the half-close: one that was not sent
  // goes now rather than leaving both ends waiting for the deadline.
  if (!writes_done_.load(std::memory_order_acquire)) static_cast<void>(WritesDone());
  // Messages nobody will read are dropped (their pulled memory and payloads released) and, while
  // the call lasts, credited back, so a server still writing is not held on a full window while
  // this waits for its status.
  const bool ended = state_->ended();
  if (const uint16_t grant = state_->Drain(); grant > 0 && !ended && id_ != 0) {
    static_cast<void>(
        connection_->SendOnStream(id_, RpcHeader::StreamCredit(id_, grant), nullptr, *state_));
  }
  return state_->WaitEnded();
}

void ClientStream::Cancel() {
  if (id_ != 0) connection_->CancelCall(id_);
}

}  // namespace zrpc::internal
