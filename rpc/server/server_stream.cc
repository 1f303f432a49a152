// A server's streams: ServerCallImpl as the handler's StreamCall (blocking Read and Write, on the
// stream's own thread), its asynchronous form (AsyncServerStream over a StreamPump), giving up
// and failing a stream, and the connection's handling of the client's stream frames.

#include <atomic>
#include <thread>
#include <utility>

#include "absl/base/optimization.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "rpc/bulk/registration.h"
#include "rpc/common/monotonic.h"
#include "rpc/server/server_call.h"
#include "rpc/server/server_connection.h"
#include "rpc/server/server_impl.h"
#include "rpc/stream/stream_pump.h"
#include "transport/log.h"

namespace zrpc::internal {

StreamCall* ServerCallImpl::OpenStream(const google::protobuf::MessageLite* read_prototype) {
  if (stream_ == nullptr) return nullptr;
  // The request was parsed: its receive slot goes back now, since a stream may last long and
  // the connection's slots are every call's.
  if (!request_released_) {
    request_released_ = true;
    static_cast<void>(connection_->Release(request_.handle));
  }
  if (request_.body_payload) {
    RpcConnection::ReleasePayload(*connection_, request_.body_payload->handle);
    request_.body_payload.reset();
  }
  request_.body = {};
  if (read_prototype != nullptr) {
    const uint16_t window = stream_->Grant(read_prototype);
    SendOnStream(RpcHeader::StreamCredit(call_id(), window), nullptr);
  }
  return this;
}

bool ServerCallImpl::Write(const google::protobuf::MessageLite& message, OutgoingBulk bulk) {
  if (stream_ == nullptr) return false;
  if (ABSL_PREDICT_FALSE(!bulk.empty()) && RefusedBulk(bulk)) return false;
  if (ABSL_PREDICT_FALSE(intercepted_ > 0) && !InterceptMessage(StreamDirection::kSent, message)) {
    return false;
  }
  if (!stream_->TakeSendCredit(deadline())) return false;
  return SendOnStream(RpcHeader::StreamMessage(call_id()), &message, /*quota_taken=*/false,
                      /*no_slot=*/nullptr, /*abandoned=*/nullptr, &bulk);
}

bool ServerCallImpl::RefusedBulk(const OutgoingBulk& bulk) {
  if (bulk.empty() || method_.response_bulk) return false;
  FailStream(absl::InvalidArgumentError(absl::StrCat(
      method_.full_name, ": a ", bulk.size(),
      "-byte bulk payload on a stream message of a method whose responses carry none (mark it "
      "(zrpc.method).response_bulk in its .proto)")));
  return true;
}

google::protobuf::MessageLite* ServerCallImpl::Read(IncomingBulk* bulk) {
  if (stream_ == nullptr) {
    if (bulk != nullptr) bulk->Reset();
    return nullptr;
  }
  uint16_t grant = 0;
  google::protobuf::MessageLite* message = stream_->Read(deadline(), &grant, bulk);
  if (grant > 0) SendOnStream(RpcHeader::StreamCredit(call_id(), grant), nullptr);
  if (ABSL_PREDICT_FALSE(intercepted_ > 0) && message != nullptr &&
      !InterceptMessage(StreamDirection::kReceived, *message)) {
    if (bulk != nullptr) bulk->Reset();
    return nullptr;
  }
  return message;
}

// The asynchronous form's sending: through the call until its answer (CloseWrites), which
// retires it. The pump runs one of these at a time, on one thread.
class AsyncServerSender final : public StreamPump::Sender {
 public:
  explicit AsyncServerSender(ServerCallImpl* call)
      : call_(call), method_(call->method_info().full_name) {}

  // The owner is gone: a send waiting for a slot or the quota gives up.
  void Abandon() { abandoned_.store(true, std::memory_order_release); }
  // What CloseWrites answers: the first one given (the handler's Finish, or the owner's
  // destruction without one). False when one was given already.
  bool SetAnswer(absl::Status status, std::optional<SendSlot> response) {
    absl::MutexLock lock(&answer_mu_);
    if (answer_set_) return false;
    answer_set_ = true;
    answer_ = std::move(status);
    response_ = response;
    return true;
  }
  // The owner was destroyed: its answer, unless it finished.
  void AnswerDropped() {
    SetAnswer(absl::InternalError(
                  absl::StrCat(method_, ": handler dropped the stream without finishing it")),
              std::nullopt);
  }
  // A Write the owner dropped (destroyed before its callback ran) was not sent: an OK answer
  // would tell the client it has every message.
  void OnWriteDropped() override {
    absl::MutexLock lock(&answer_mu_);
    if (answer_set_ && !answer_.ok()) return;
    answer_set_ = true;
    answer_ = absl::AbortedError(absl::StrCat(
        method_, ": the handler dropped its stream with a Write outstanding, which was not sent"));
    response_.reset();
  }

  StreamPump::Sent SendMessage(const google::protobuf::MessageLite& message, OutgoingBulk* bulk,
                               bool quota_taken) override {
    return Send(RpcHeader::StreamMessage(call_->call_id()), &message, quota_taken, bulk);
  }
  StreamPump::Sent SendCredit(uint16_t messages) override {
    return Send(RpcHeader::StreamCredit(call_->call_id(), messages), nullptr, false);
  }
  StreamPump::Sent CloseWrites() override {
    absl::Status answer;
    std::optional<SendSlot> response;
    {
      absl::MutexLock lock(&answer_mu_);
      answer = std::move(answer_);
      response = response_;
    }
    ServerCallImpl* call = std::exchange(call_, nullptr);
    call->Finish(std::move(answer), response ? &*response : nullptr, OutgoingBulk());
    return StreamPump::Sent::kSent;
  }
  bool CloseEndsCall() const override { return true; }
  bool QuotaOrWait(size_t size, bool has_bulk, bool* quota_taken,
                   std::weak_ptr<StreamListener> waiter) override {
    return call_->owner_->StreamQuotaOrWait(*call_->connection_, size, OnRuntimeThread(),
                                            std::move(waiter), quota_taken, has_bulk);
  }
  void RetryLater(std::weak_ptr<StreamListener> pump) override {
    // Told by the connection's next completion batch that frees a slot; the server's sweeper is
    // the fallback (a slot given back without a completion). Told twice, a pump just looks again.
    call_->owner_->WaitForSendSlot(*call_->connection_, pump);
    call_->owner_->server().WaitForSlot(std::move(pump));
  }

 private:
  StreamPump::Sent Send(const RpcHeader& header, const google::protobuf::MessageLite* message,
                        bool quota_taken, OutgoingBulk* bulk = nullptr) {
    bool no_slot = false;
    if (call_->SendOnStream(header, message, quota_taken, &no_slot, &abandoned_, bulk)) {
      return StreamPump::Sent::kSent;
    }
    // Every send slot is taken and this is a runtime thread, which does not wait for one.
    return no_slot ? StreamPump::Sent::kNoSlot : StreamPump::Sent::kFailed;
  }

  ServerCallImpl* call_;  // null once answered (retired)
  const char* const method_;
  std::atomic<bool> abandoned_{false};
  absl::Mutex answer_mu_;  // a leaf: OnWriteDropped runs under the pump's lock
  bool answer_set_ ABSL_GUARDED_BY(answer_mu_) = false;
  absl::Status answer_ ABSL_GUARDED_BY(answer_mu_);
  std::optional<SendSlot> response_ ABSL_GUARDED_BY(answer_mu_);
};

namespace {

class AsyncServerStream final : public ServerAsyncStream {
 public:
  AsyncServerStream(ServerCallImpl* call, std::shared_ptr<StreamState> state)
      : intercepted_(call->intercepted()), call_(call) {
    auto sender = std::make_unique<AsyncServerSender>(call);
    sender_ = sender.get();
    pump_ = std::make_shared<StreamPump>(std::move(sender), state, /*writes=*/true);
    state->SetListener(pump_);
  }
  // In this order: the answer a dropped call gets (unless the handler gave one); no callback
  // from now on, and an outstanding write dropped (its message may die with the owner) before
  // anything could try it again; the close, now or from the loop running elsewhere; then the
  // end of any wait of a send of that loop, and the wait for it.
  ~AsyncServerStream() override {
    sender_->AnswerDropped();
    pump_->Abandon(/*close=*/true);
    sender_->Abandon();
    pump_->WaitIdle();
  }

  void StartRead(StreamCall::ReadDone done, IncomingBulk* bulk) override {
    if (ABSL_PREDICT_TRUE(!intercepted_)) return pump_->Read(std::move(done), bulk);
    // The interceptors see the message where the read completes, before the handler does. A
    // read completes with a message only before the handler's Finish (the pump drains what is
    // outstanding before it closes), while the call lives.
    pump_->Read(
        [this, bulk, done = std::move(done)](google::protobuf::MessageLite* message) {
          ServerCallImpl* call = call_.load(std::memory_order_acquire);
          if (message != nullptr &&
              (call == nullptr || !call->InterceptMessage(StreamDirection::kReceived, *message))) {
            message = nullptr;
            if (bulk != nullptr) bulk->Reset();
          }
          done(message);
        },
        bulk);
  }
  void StartWrite(const google::protobuf::MessageLite& message, OutgoingBulk bulk,
                  StreamCall::WriteDone done) override {
    // A message an interceptor refuses, or a payload the method does not carry, fails the
    // stream (FailStream ends it), and the pump then completes this write with false, unsent.
    // After the handler's Finish the call may be gone (retired once its answer went): the pump
    // refuses such a write anyway.
    if (ABSL_PREDICT_FALSE(intercepted_ || !bulk.empty())) {
      if (ServerCallImpl* call = call_.load(std::memory_order_acquire); call != nullptr) {
        if (!call->RefusedBulk(bulk) && intercepted_) {
          static_cast<void>(call->InterceptMessage(StreamDirection::kSent, message));
        }
      }
    }
    pump_->Write(message, std::move(done), std::move(bulk));
  }
  void StartFinish(absl::Status status, std::optional<SendSlot> response) override {
    call_.store(nullptr, std::memory_order_release);  // the call is the pump's to finish now
    if (sender_->SetAnswer(std::move(status), response)) pump_->Finish(nullptr);
  }

 private:
  const bool intercepted_;  // the server's interceptors see the stream's messages
  // The call until the handler's Finish, for the interceptors; null from then on.
  std::atomic<ServerCallImpl*> call_;
  AsyncServerSender* sender_;  // the pump's
  std::shared_ptr<StreamPump> pump_;
};

}  // namespace

std::unique_ptr<ServerAsyncStream> ServerCallImpl::OpenAsyncStream(
    const google::protobuf::MessageLite* read_prototype) {
  if (OpenStream(read_prototype) == nullptr) return nullptr;
  if (deadline_nanos_ != kNoDeadlineNanos) owner_->server().WatchDeadline(deadline(), stream_);
  return std::make_unique<AsyncServerStream>(this, stream_);
}

bool ServerCallImpl::SendOnStream(const RpcHeader& header,
                                  const google::protobuf::MessageLite* message, bool quota_taken,
                                  bool* no_slot, const std::atomic<bool>* abandoned,
                                  OutgoingBulk* bulk) {
  const size_t size = message == nullptr ? 0 : message->ByteSizeLong();
  const size_t bulk_size = bulk == nullptr ? 0 : bulk->size();
  auto gone = [this, abandoned] {
    return stream_->ended() || context_.IsCancelled() ||
           (abandoned != nullptr && abandoned->load(std::memory_order_acquire));
  };
  // Stream frames leave the slots answers need free (ServerImpl::AnswerSlots).
  const absl::Status sent =
      owner_->SendStreamFrame(*connection_, header, message, size, gone,
                              owner_->server().answer_slots(), quota_taken, no_slot, bulk);
  if (sent.ok()) {
    if (message != nullptr) metrics_.AddMessageBytes(size, 0);
    if (bulk_size > 0) metrics_.AddBulkBytes(bulk_size, 0);
    return true;
  }
  if ((no_slot != nullptr && *no_slot) || sent.code() == absl::StatusCode::kCancelled) {
    return false;  // tried again later; or the stream ended, and its end says why
  }
  // The stream fails with the reason; a connection that is failing gives the call up through its
  // OnClosed as well, which may come a little later (the transport drains first): the call is
  // given up already, so a handler that stops at this failed Write sees IsCancelled() as it would
  // a moment later. Never GiveUp here: that would also drop the answer a failed stream owes its
  // client.
  if (!connection_->open()) context_.Cancel();
  FailStream(absl::Status(sent.code(), absl::StrCat(method_.full_name, ": ", sent.message())));
  return false;
}

void ServerCallImpl::EndStream(absl::Status why, StreamEndings* later) {
  if (stream_ == nullptr) return;
  if (later == nullptr) return stream_->End(std::move(why));
  later->push_back({stream_, std::move(why)});
}

void ServerCallImpl::GiveUp(StreamEndings* later) {
  context_.Cancel();
  EndStream(absl::CancelledError("the caller gave up"), later);
}

void ServerCallImpl::FailStream(absl::Status status, StreamEndings* later) {
  {
    absl::MutexLock lock(&failure_mu_);
    if (stream_failure_.ok()) stream_failure_ = status;
  }
  EndStream(std::move(status), later);
}

void ServerConnection::HandleStreamFrame(transport::Connection& connection,
                                         const IncomingMessage& frame) {
  const uint64_t id = frame.header.call_id;
  std::shared_ptr<StreamState> stream;
  MethodMetrics* metrics = nullptr;  // the server's: outlives the call
  bool bulk_allowed = false;
  if (auto it = streams_.find(id); it != streams_.end()) {  // in the domain: the poller's batch
    stream = it->second->stream();
    metrics = &it->second->metrics_;
    bulk_allowed = it->second->method_info().request_bulk;
  } else if (ServerCallImpl* scanned = FindScanned(id); scanned != nullptr) {
    bulk_allowed = scanned->method_info().request_bulk;
  } else {
    // The call finished while the frame travelled (the client learns with the call's status).
    return DiscardUnread(connection, frame);
  }
  if (const char* wrong = StreamFrameError(stream != nullptr, bulk_allowed, frame)) {
    Discard(connection, frame);
    return Violation(connection, absl::StrCat("call ", id, ": ", wrong));
  }
  absl::Status status = limits().CheckMessage(frame.body_size(), "stream message");
  if (!status.ok()) {
    DiscardUnread(connection, frame);
    return FailStreamUnless(connection, id, status);  // RESOURCE_EXHAUSTED: the stream fails
  }
  switch (frame.header.kind) {
    case RpcKind::kStreamCredit:
      status = stream->OnCredit(frame.header.window);
      break;
    case RpcKind::kHalfClose:
      status = stream->OnHalfClose();
      break;
    default:
      if (frame.pulls()) {
        // Larger than this side's arena: its place is kept in the stream (nothing behind it
        // overtakes it) while it is pulled; StreamPulled fills it.
        bool wanted = false;
        status = stream->OnPulling(&wanted).status();
        if (status.ok() && wanted) {
          status = StartPull(connection, frame);
          if (status.ok()) return;  // the pull has the frame now
        }
        if (status.code() != absl::StatusCode::kFailedPrecondition) {
          static_cast<void>(SendPulledWord(connection, frame));  // not read: never will be
        }
        break;
      }
      // Parsed straight from the receive slot, which goes back right after (stream_state.h).
      // Counted on arrival, whichever form of handler reads it (or none: a drained stream).
      status = stream->OnMessage(frame.body).status();
      if (status.ok()) metrics->AddMessageBytes(0, frame.body.size());
      break;
  }
  Discard(connection, frame);
  FailStreamUnless(connection, id, status);
}

void ServerConnection::StreamPulled(transport::Connection& connection, IncomingMessage& message) {
  // The client may stop exposing it now.
  static_cast<void>(SendPulledWord(connection, message));
  absl::Status status;
  if (auto it = streams_.find(message.header.call_id); it != streams_.end()) {
    // Taken first: the stream's listener may run an asynchronous handler's callbacks here,
    // which may finish the call (retired at once, in this domain).
    MethodMetrics* metrics = &it->second->metrics_;  // the server's: outlives the call
    std::shared_ptr<StreamState> stream = it->second->stream();
    const uint32_t bulk_size = message.bulk_size();
    status = stream->OnPulledMessage(message.body, RpcConnection::TakePulledBody(message),
                                     TakeBulk(connection, message));
    if (status.ok()) {
      metrics->AddMessageBytes(0, message.body.size());
      if (bulk_size > 0) metrics->AddBulkBytes(0, bulk_size);
    }
  }
  Discard(connection, message);
  FailStreamUnless(connection, message.header.call_id, status);
}

void ServerConnection::FailStreamUnless(transport::Connection& connection, uint64_t id,
                                        const absl::Status& status) {
  if (status.ok()) return;
  if (status.code() == absl::StatusCode::kFailedPrecondition) {
    return Violation(connection, absl::StrCat("call ", id, ": ", status.message()));
  }
  StreamEndings later;
  // Found again: the stream's callbacks may have finished the call (retired at once, in this
  // domain). A message that does not parse answers INVALID_ARGUMENT; one that could not be
  // pulled, why not (RESOURCE_EXHAUSTED: a limit, memory).
  if (auto it = streams_.find(id); it != streams_.end()) {
    it->second->FailStream(
        absl::Status(status.code(),
                     absl::StrCat(it->second->method_info().full_name, ": ", status.message())),
        &later);
  }
  EndStreams(later);
}

}  // namespace zrpc::internal
