// ServerConnection and ServerCallImpl: the server's side of one connection and of each call on it,
// streams included.

#include "rpc/server/server_connection.h"

#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "rpc/bulk/registration.h"
#include "rpc/common/monotonic.h"
#include "rpc/server/server_impl.h"
#include "rpc/stream/stream_pump.h"
#include "transport/log.h"

namespace zrpc::internal {

ServerCallImpl::ServerCallImpl(std::shared_ptr<ServerConnection> owner,
                               std::shared_ptr<transport::Connection> connection, Service* service,
                               const MethodInfo& method, MethodMetrics& metrics,
                               const IncomingMessage& request, absl::Time monotonic_now,
                               uint16_t stream_window)
    : owner_(std::move(owner)),
      connection_(std::move(connection)),
      service_(service),
      method_(method),
      metrics_(metrics),
      start_(monotonic_now),
      request_(request) {
  if (stream_window > 0) {
    // The client granted request.header.window messages in its open; this side grants its own
    // window when the handler starts (OpenStream).
    stream_ = std::make_shared<StreamState>(nullptr, stream_window, request.header.window);
  }
  const absl::Duration remaining = RemainingFromWire(request.header.timeout_us);
  context_.SetRemaining(remaining);
  deadline_ = monotonic_now + remaining;
  metrics_.OnStart();
  metrics_.AddMessageBytes(0, request.body.size());
  metrics_.AddBulkBytes(0, request.bulk ? request.bulk->size : 0);
}

void ServerCallImpl::Run() {
  if (context_.IsCancelled()) {
    const bool late = MonotonicNow() >= deadline_;
    owner_->server().CountSkipped();
    Finish(late ? absl::DeadlineExceededError(absl::StrCat(
                      method_.full_name, ": the deadline passed before the handler ran"))
                : absl::CancelledError(
                      absl::StrCat(method_.full_name, ": given up before the handler ran")),
           nullptr, OutgoingBulk());
    return;
  }
  handler_ran_ = true;
  service_->Dispatch(method_.index, this);
}

IncomingBulk ServerCallImpl::TakeRequestBulk() {
  if (!request_.bulk) return IncomingBulk();
  transport::ReceivedBulk bulk = *std::exchange(request_.bulk, std::nullopt);
  return ReceiveReleaser::Wrap(*owner_, connection_, bulk);
}

absl::StatusOr<SendSlot> ServerCallImpl::AcquireResponseSlot(size_t size) {
  if (absl::Status fits = owner_->limits().CheckMessage(size, "response"); !fits.ok()) {
    return absl::ResourceExhaustedError(absl::StrCat(method_.full_name, ": ", fits.message()));
  }
  if (response_buffer_) connection_->ReleaseSendBuffer(*std::exchange(response_buffer_, {}));
  large_response_.reset();
  absl::StatusOr<transport::SendBuffer> buffer = connection_->AcquireSendBuffer();
  if (!buffer.ok()) return buffer.status();
  response_buffer_ = *buffer;
  if (RpcConnection::FitsSlot(*connection_, size)) {
    return SendSlot{RpcConnection::Body(*buffer), size, buffer->slot};
  }
  // Larger than a slot: serialized into memory of its own, sent at the front of the payload.
  large_response_.reset(static_cast<uint8_t*>(std::malloc(size)));
  if (large_response_ == nullptr) {
    return absl::ResourceExhaustedError(
        absl::StrCat(method_.full_name, ": out of memory for a ", size, "-byte response"));
  }
  return SendSlot{large_response_.get(), size, buffer->slot};
}

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

bool ServerCallImpl::Write(const google::protobuf::MessageLite& message) {
  if (stream_ == nullptr || !stream_->TakeSendCredit(deadline_)) return false;
  return SendOnStream(RpcHeader::StreamMessage(call_id()), &message);
}

google::protobuf::MessageLite* ServerCallImpl::Read() {
  if (stream_ == nullptr) return nullptr;
  uint16_t grant = 0;
  google::protobuf::MessageLite* message = stream_->Read(deadline_, &grant);
  if (grant > 0) SendOnStream(RpcHeader::StreamCredit(call_id(), grant), nullptr);
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

  StreamPump::Sent SendMessage(const google::protobuf::MessageLite& message,
                               bool quota_taken) override {
    return Send(RpcHeader::StreamMessage(call_->call_id()), &message, quota_taken);
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
  bool QuotaOrWait(size_t size, bool* quota_taken, std::weak_ptr<StreamListener> waiter) override {
    return call_->owner_->StreamQuotaOrWait(*call_->connection_, size, OnRuntimeThread(),
                                            std::move(waiter), quota_taken);
  }
  void RetryLater(std::weak_ptr<StreamListener> pump) override {
    call_->owner_->server().WaitForSlot(std::move(pump));
  }

 private:
  StreamPump::Sent Send(const RpcHeader& header, const google::protobuf::MessageLite* message,
                        bool quota_taken) {
    bool no_slot = false;
    if (call_->SendOnStream(header, message, quota_taken, &no_slot, &abandoned_)) {
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
  AsyncServerStream(ServerCallImpl* call, std::shared_ptr<StreamState> state) {
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

  void StartRead(StreamCall::ReadDone done) override { pump_->Read(std::move(done)); }
  void StartWrite(const google::protobuf::MessageLite& message,
                  StreamCall::WriteDone done) override {
    pump_->Write(message, std::move(done));
  }
  void StartFinish(absl::Status status, std::optional<SendSlot> response) override {
    if (sender_->SetAnswer(std::move(status), response)) pump_->Finish(nullptr);
  }

 private:
  AsyncServerSender* sender_;  // the pump's
  std::shared_ptr<StreamPump> pump_;
};

}  // namespace

std::unique_ptr<ServerAsyncStream> ServerCallImpl::OpenAsyncStream(
    const google::protobuf::MessageLite* read_prototype) {
  if (OpenStream(read_prototype) == nullptr) return nullptr;
  if (deadline_ != absl::InfiniteFuture()) owner_->server().WatchDeadline(deadline_, stream_);
  return std::make_unique<AsyncServerStream>(this, stream_);
}

bool ServerCallImpl::SendOnStream(const RpcHeader& header,
                                  const google::protobuf::MessageLite* message, bool quota_taken,
                                  bool* no_slot, const std::atomic<bool>* abandoned) {
  const size_t size = message == nullptr ? 0 : message->ByteSizeLong();
  auto gone = [this, abandoned] {
    return stream_->ended() || context_.IsCancelled() ||
           (abandoned != nullptr && abandoned->load(std::memory_order_acquire));
  };
  // Stream frames leave the slots answers need free (ServerImpl::AnswerSlots).
  const absl::Status sent =
      owner_->SendStreamFrame(*connection_, header, message, size, gone,
                              owner_->server().answer_slots(), quota_taken, no_slot);
  if (sent.ok()) {
    if (message != nullptr) metrics_.AddMessageBytes(size, 0);
    return true;
  }
  if ((no_slot != nullptr && *no_slot) || sent.code() == absl::StatusCode::kCancelled) {
    return false;  // tried again later; or the stream ended, and its end says why
  }
  // The stream fails with the reason; a connection that is failing gives the call up through its
  // OnClosed as well. Never GiveUp here: that would also drop the answer a failed stream owes its
  // client.
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

void ServerCallImpl::Finish(absl::Status status, SendSlot* response, OutgoingBulk response_bulk) {
  if (stream_ != nullptr) {
    absl::Status failure;
    {
      absl::MutexLock lock(&failure_mu_);
      failure = stream_failure_;
    }
    if (!failure.ok()) {
      // What broke the stream is what the client hears, whatever the handler returned.
      status = std::move(failure);
      response = nullptr;
      response_bulk.Reset();
    }
    stream_->End(absl::OkStatus());  // messages arriving from now on are dropped
  }
  absl::StatusCode code = absl::StatusCode::kUnavailable;  // what AnswerFor sent
  if (!answered_.exchange(true, std::memory_order_acq_rel)) {
    code = SendResponse(std::move(status), response, std::move(response_bulk)).code();
  } else {
    response_bulk.Reset();  // answered already (Shutdown): this answer is discarded
  }
  metrics_.OnFinish(code, MonotonicNow() - start_);
  if (response_buffer_) connection_->ReleaseSendBuffer(*std::exchange(response_buffer_, {}));
  if (!request_released_) static_cast<void>(connection_->Release(request_.handle));
  if (request_.bulk) RpcConnection::ReleasePayload(*connection_, request_.bulk->handle);
  if (request_.body_payload) {
    RpcConnection::ReleasePayload(*connection_, request_.body_payload->handle);
  }
  // The call leaves its connection's map and is destroyed in place under one lock (Retire), so
  // a cancel or Shutdown's answer (which uses owner_ and connection_ under that lock, and may
  // run while this handler finishes: AnswerFor wakes a stream's handler) never finds it half
  // gone; its memory stays for the next call. The references that may be the last (the
  // connections) are dropped after that lock.
  std::shared_ptr<ServerConnection> owner;
  std::shared_ptr<transport::Connection> connection;
  ServerConnection* const retiring = owner_.get();
  ServerImpl& server = retiring->server();
  retiring->Retire(this, &owner, &connection);
  connection.reset();
  owner.reset();
  server.CallDone();
}

absl::Status ServerCallImpl::SendResponse(absl::Status status, SendSlot* response,
                                          OutgoingBulk response_bulk) {
  if (context_.IsCancelled()) {
    // Nobody waits for this answer (the client's deadline passed or it cancelled, and it sent
    // a cancel or will drop the answer as late): stage, write and send nothing.
    response_bulk.Reset();
    if (handler_ran_) owner_->server().CountAnswerDropped();
    return MonotonicNow() >= deadline_ ? absl::DeadlineExceededError("the caller's deadline passed")
                                       : absl::CancelledError("the caller gave up");
  }
  if (status.ok() && (response == nullptr || !response_buffer_)) {
    status = absl::InternalError(
        absl::StrCat(method_.full_name, ": finished OK without a response slot"));
  }
  if (status.ok() && !response_bulk.empty() && !method_.response_bulk) {
    status = absl::InternalError(
        absl::StrCat(method_.full_name,
                     ": the handler set a response payload, but the method is not "
                     "marked response_bulk"));
  }
  if (status.ok()) {
    const transport::SendBuffer buffer = *std::exchange(response_buffer_, {});
    const size_t bulk_size = response_bulk.size();
    // A caller that gave its payload a destination pulls it there, whatever its size.
    const bool expose = (request_.header.flags & kRpcFlagPullResponse) != 0;
    OutgoingBulk large_body;
    size_t body_size = response->size;
    if (uint8_t* large = large_response_.release()) {
      large_body = OutgoingBulk(large, response->size, [large] { std::free(large); });
      body_size = 0;
    }
    if (bulk_size == 0 && large_body.empty() && !request_released_) {
      // The common answer: the request's slot goes back and the response goes out under one
      // transport lock, the response carrying the slot's credit.
      request_released_ = true;
      status = owner_->SendAnswer(*connection_, buffer, RpcHeader::Response(call_id()), body_size,
                                  request_.handle);
    } else {
      status = owner_->SendMessage(*connection_, buffer, RpcHeader::Response(call_id()), body_size,
                                   std::move(response_bulk), std::move(large_body),
                                   absl::InfiniteFuture(), nullptr, expose);
    }
    if (status.ok()) {
      metrics_.AddMessageBytes(response->size, 0);
      metrics_.AddBulkBytes(bulk_size, 0);
      return status;
    }
    if (!connection_->open()) return absl::UnavailableError(status.message());
    // The response could not go (its payload is larger than the client's arena, or no staging
    // memory): the client hears why instead of waiting for its deadline.
  }
  response_bulk.Reset();
  if (absl::Status sent = owner_->SendError(*connection_, call_id(), status);
      !sent.ok() && connection_->open()) {
    // No send slot for the error: the client would wait for its deadline without a word. Fail
    // its connection instead, which fails its calls at once.
    ZRPC_LOG(kError, "server", "cannot answer call ", call_id(), " from ",
             connection_->peer_address(), " (", sent.ToString(), "); closing");
    connection_->Close();
  }
  return status;
}

bool ServerCallImpl::AnswerFor(const absl::Status& status, StreamEndings* later) {
  // Under the connection's lock (AnswerAll), so Finish cannot retire the call meanwhile; the
  // answer is claimed before the handler is woken.
  const bool answer = !answered_.exchange(true, std::memory_order_acq_rel);
  GiveUp(later);
  if (!answer) return false;
  if (!owner_->SendError(*connection_, call_id(), status).ok()) connection_->Close();
  return true;
}

ServerConnection::ServerConnection(ServerImpl& server, std::shared_ptr<transport::Poller> poller)
    : RpcConnection("server", server.staging(), server.receive_limits(), server.device(),
                    std::move(poller)),
      server_(server) {}

void ServerConnection::Attach(std::shared_ptr<transport::Connection> connection) {
  absl::MutexLock lock(&mu_);
  if (!closed_ && connection_ == nullptr) connection_ = std::move(connection);
}

void ServerConnection::OnMessage(transport::Connection& connection,
                                 const transport::ReceivedMessage& message) {
  absl::StatusOr<IncomingMessage> incoming = Receive(connection, message);
  if (!incoming.ok()) return;
  switch (incoming->header.kind) {
    case RpcKind::kRequest:
      HandleRequest(connection, *incoming);
      return;
    case RpcKind::kCancel:
      HandleCancel(connection, *incoming);
      return;
    case RpcKind::kPulled:
      Discard(connection, *incoming);
      Unexpose(incoming->header.call_id);
      return;
    case RpcKind::kStreamMessage:
    case RpcKind::kHalfClose:
    case RpcKind::kStreamCredit:
      HandleStreamFrame(connection, *incoming);
      return;
    default:
      Discard(connection, *incoming);
      Violation(connection,
                absl::StrCat("a client sent message kind ", static_cast<int>(incoming->header.kind),
                             "; a server takes requests, cancels, pulled and stream "
                             "messages, half-closes and credits"));
  }
}

void ServerConnection::HandleRequest(transport::Connection& connection,
                                     const IncomingMessage& request) {
  const RpcHeader& header = request.header;
  auto answer_error = [&](const absl::Status& status) {
    Discard(connection, request);
    if (absl::Status sent = SendError(connection, header.call_id, status); !sent.ok()) {
      // Refusals answered at once may outrun their way back (the client's credits): past the
      // connection's send slots, it is cut off rather than left waiting without a word.
      ZRPC_LOG(kError, "server", "cannot answer call ", header.call_id, " from ",
               connection.peer_address(), " (", sent.ToString(), "); closing");
      connection.Close();
    }
  };
  if (header.service_id == kKeepaliveServiceId) {
    // Answered here, on the poller thread, so that busy handlers never delay it: a keepalive
    // asks whether this process and its connection are alive, not whether it has spare threads.
    Discard(connection, request);
    server_.CountKeepalive();
    absl::StatusOr<transport::SendBuffer> buffer = connection.AcquireSendBuffer();
    if (buffer.ok()) {
      static_cast<void>(
          SendMessage(connection, *buffer, RpcHeader::Response(header.call_id), 0, OutgoingBulk()));
    }
    return;
  }
  if (server_.draining()) {
    return answer_error(absl::UnavailableError("the server is shutting down"));
  }
  const ServerImpl::ServiceEntry* entry = server_.FindService(header.service_id);
  if (entry == nullptr) {
    server_.CountUnimplemented();
    return answer_error(absl::UnimplementedError(absl::StrFormat(
        "this server has no service with id 0x%08x (the FNV-1a hash of the service's full "
        "name): the client and server were built from different .proto files",
        header.service_id)));
  }
  const ServiceInfo& info = entry->service->service_info();
  if (header.method_index >= info.method_count) {
    server_.CountUnimplemented();
    return answer_error(absl::UnimplementedError(
        absl::StrCat(info.full_name, " has no method with index ", header.method_index,
                     " on this server (it has ", info.method_count, ")")));
  }
  const MethodInfo& method = info.methods[header.method_index];
  if (request.bulk_size() > 0 && !method.request_bulk) {
    Discard(connection, request);
    return Violation(connection, absl::StrCat("call ", header.call_id, " to ", method.full_name,
                                              " carries a bulk payload the method does not take"));
  }
  if (method.streaming() != header.opens_stream()) {
    // A client built from another version of the .proto: not a violation, as for a method
    // this server lacks.
    server_.CountUnimplemented();
    return answer_error(absl::UnimplementedError(absl::StrCat(
        method.full_name, method.streaming()
                              ? " is a streaming method on this server; the client called it "
                                "as a unary one"
                              : " is a unary method on this server; the client opened a stream")));
  }
  if (absl::Status fits = limits().CheckMessage(request.body_size(), "request"); !fits.ok()) {
    return answer_error(
        absl::Status(fits.code(), absl::StrCat(method.full_name, ": ", fits.message())));
  }
  if (request.pulls()) {
    // Larger than this side's arena: pulled first, then served like any request (OnPulled).
    const auto& place = server_.options().place_request_payload;
    {
      absl::MutexLock lock(&mu_);
      pulled_requests_[header.call_id] = false;
    }
    absl::Status pulling = place && request.bulk_size() > 0
                               ? PullPlaced(connection, request, method, place)
                               : StartPull(connection, request);
    if (!pulling.ok()) {
      {
        absl::MutexLock lock(&mu_);
        pulled_requests_.erase(header.call_id);
      }
      return answer_error(absl::Status(
          pulling.code(), absl::StrCat(method.full_name, ": request: ", pulling.message())));
    }
    return;
  }
  ServerCallImpl* call = nullptr;
  bool duplicate = false;
  const bool stream = header.opens_stream();
  {
    absl::MutexLock lock(&mu_);
    if (calls_.contains(header.call_id)) {
      duplicate = true;
    } else if (stream && streams_ >= server_.options().max_streams_per_connection) {
      // Refused below, outside the lock.
    } else {
      void* memory;
      if (call_memory_.empty()) {
        memory = ::operator new(sizeof(ServerCallImpl));
      } else {
        memory = call_memory_.back();
        call_memory_.pop_back();
      }
      call = new (memory)
          ServerCallImpl(shared_from_this(), connection.shared_from_this(), entry->service, method,
                         *entry->metrics[method.index], request, MonotonicNow(),
                         stream ? server_.options().stream_window : uint16_t{0});
      calls_.emplace(header.call_id, call);
      if (stream) ++streams_;
    }
  }
  if (duplicate) {
    // Answering either call would complete both on the client: refuse the peer.
    Discard(connection, request);
    return Violation(connection, absl::StrCat("call id ", header.call_id,
                                              " is already in flight on this connection"));
  }
  if (call == nullptr) {
    server_.CountStreamRefused();
    return answer_error(absl::ResourceExhaustedError(absl::StrCat(
        method.full_name, ": this connection has ", server_.options().max_streams_per_connection,
        " streams open already (ServerOptions::max_streams_per_connection)")));
  }
  server_.CallStarted();
  if (stream && entry->async_streams) {
    // An AsyncService's handler returns at once and owns the stream: no thread of its own, and
    // never inline (it parses the request and may set up work of its own).
    server_.CountAsyncStream();
    server_.pool().Submit(pool_queue_, call);
    return;
  }
  if (stream) {
    absl::Status started = server_.stream_threads().Start([call] { call->Run(); });
    if (!started.ok()) {
      server_.CountStreamRefused();
      call->Finish(
          absl::Status(started.code(), absl::StrCat(method.full_name, ": ", started.message())),
          nullptr, OutgoingBulk());
    }
    return;
  }
  if (entry->inline_methods[method.index]) {
    call->Run();
  } else {
    server_.pool().Submit(pool_queue_, call);
  }
}

absl::Status ServerConnection::PullPlaced(
    transport::Connection& connection, const IncomingMessage& request, const MethodInfo& method,
    const std::function<absl::StatusOr<PayloadPlacement>(const MethodInfo&, size_t)>& place) {
  const uint32_t size = request.bulk_size();
  if (absl::Status fits = limits().CheckBulk(size); !fits.ok()) return fits;
  absl::StatusOr<PayloadPlacement> placed = place(method, size);
  if (!placed.ok()) return placed.status();
  // Given back on every path from here: by the runtime once done, or now.
  PayloadPlacement placement = *std::move(placed);
  const BulkDestination& destination = placement.destination;
  absl::Status refused;
  if (destination.size() < size) {
    refused = absl::ResourceExhaustedError(
        absl::StrCat("ServerOptions::place_request_payload gave ", destination.size(),
                     " bytes for a ", size, "-byte payload"));
  } else if (BulkAccess::registration(destination) == nullptr ||
             BulkAccess::registration(destination)->device() != server_.device().get()) {
    refused = absl::FailedPreconditionError(
        "ServerOptions::place_request_payload gave memory not registered on this server "
        "(Server::RegisterMemory)");
  }
  if (!refused.ok()) {
    if (placement.release) placement.release();
    return refused;
  }
  return StartPullInto(
      connection, request, destination, nullptr,
      placement.release ? std::move(placement.release) : [] {});
}

void ServerConnection::OnPulled(transport::Connection& connection, IncomingMessage& message) {
  // The client may stop exposing the payload now (its call may have ended meanwhile: it kept
  // the payload exposed for this READ, and waits for this word).
  static_cast<void>(SendHeaderOnly(connection, RpcHeader::Pulled(message.header.call_id)));
  bool cancelled = false;
  {
    absl::MutexLock lock(&mu_);
    auto it = pulled_requests_.find(message.header.call_id);
    if (it != pulled_requests_.end()) {
      cancelled = it->second;
      pulled_requests_.erase(it);
    }
  }
  if (cancelled) {  // given up while it was pulled: never served, nothing to answer
    server_.CountSkipped();
    Discard(connection, message);
    return;
  }
  HandleRequest(connection, message);
}

void ServerConnection::HandleCancel(transport::Connection& connection,
                                    const IncomingMessage& cancel) {
  Discard(connection, cancel);
  server_.CountCancel();
  StreamEndings later;
  {
    absl::MutexLock lock(&mu_);
    auto it = calls_.find(cancel.header.call_id);
    if (it != calls_.end()) {
      it->second->GiveUp(&later);
    } else if (auto pulled = pulled_requests_.find(cancel.header.call_id);
               pulled != pulled_requests_.end()) {
      // Still being pulled: dropped when the pull is done. (Neither: the call finished while
      // the cancel travelled, and there is nothing to do.)
      pulled->second = true;
    }
  }
  EndStreams(later);
}

void ServerConnection::HandleStreamFrame(transport::Connection& connection,
                                         const IncomingMessage& frame) {
  const uint64_t id = frame.header.call_id;
  std::shared_ptr<StreamState> stream;
  MethodMetrics* metrics = nullptr;  // the server's: outlives the call
  bool found = false;
  {
    absl::MutexLock lock(&mu_);
    auto it = calls_.find(id);
    if (it != calls_.end()) {
      found = true;
      stream = it->second->stream();
      metrics = &it->second->metrics_;
    }
  }
  if (!found) {
    // The call finished while the frame travelled (the client learns with the call's status).
    Discard(connection, frame);
    return;
  }
  if (stream == nullptr || frame.bulk || frame.pulls()) {
    Discard(connection, frame);
    return Violation(connection,
                     absl::StrCat("call ", id,
                                  stream == nullptr ? ": a stream frame for a unary call"
                                                    : ": a stream message with a bulk payload "
                                                      "or pulled"));
  }
  absl::Status status = limits().CheckMessage(frame.body.size(), "stream message");
  if (!status.ok()) {
    Discard(connection, frame);
    StreamEndings later;
    {
      absl::MutexLock lock(&mu_);
      auto it = calls_.find(id);
      if (it != calls_.end()) {
        it->second->FailStream(
            absl::Status(status.code(),
                         absl::StrCat(it->second->method_info().full_name, ": ", status.message())),
            &later);
      }
    }
    EndStreams(later);
    return;
  }
  switch (frame.header.kind) {
    case RpcKind::kStreamCredit:
      status = stream->OnCredit(frame.header.window);
      break;
    case RpcKind::kHalfClose:
      status = stream->OnHalfClose();
      break;
    default:
      // Parsed straight from the receive slot, which goes back right after (stream_state.h).
      // Counted on arrival, whichever form of handler reads it (or none: a drained stream).
      status = stream->OnMessage(frame.body).status();
      if (status.ok()) metrics->AddMessageBytes(0, frame.body.size());
      break;
  }
  Discard(connection, frame);
  if (status.code() == absl::StatusCode::kFailedPrecondition) {
    return Violation(connection, absl::StrCat("call ", id, ": ", status.message()));
  }
  if (!status.ok()) {
    StreamEndings later;
    {
      absl::MutexLock lock(&mu_);  // the call stays alive under it (Retire takes it)
      auto it = calls_.find(id);
      if (it != calls_.end()) {
        it->second->FailStream(absl::InvalidArgumentError(absl::StrCat(
                                   it->second->method_info().full_name, ": ", status.message())),
                               &later);
      }
    }
    EndStreams(later);
  }
}

void ServerConnection::Retire(ServerCallImpl* call, std::shared_ptr<ServerConnection>* owner,
                              std::shared_ptr<transport::Connection>* connection) {
  absl::MutexLock lock(&mu_);
  *owner = std::move(call->owner_);
  *connection = std::move(call->connection_);
  calls_.erase(call->call_id());
  if (call->stream() != nullptr) --streams_;
  call->~ServerCallImpl();
  call_memory_.push_back(call);
}

ServerConnection::~ServerConnection() {
  absl::MutexLock lock(&mu_);
  for (void* memory : call_memory_) ::operator delete(memory);
}

void ServerConnection::OnDeferredFailed(transport::Connection& connection, const RpcHeader& header,
                                        const absl::Status& status) {
  // An answer whose payload waited for this connection's staging quota could not go when its
  // turn came (no staging memory, say): the client hears why instead of waiting.
  if (!SendError(connection, header.call_id, status).ok()) connection.Close();
}

void ServerConnection::SweepPass(absl::Time now, absl::Duration idle, absl::Duration probe) {
  std::shared_ptr<transport::Connection> connection;
  bool holds_calls;
  {
    absl::MutexLock lock(&mu_);
    connection = connection_;
    // A payload being pulled (before its call starts) or exposed (after its call answered) is
    // work in progress too: probed if silent, never idle.
    holds_calls = !calls_.empty() || Transferring();
  }
  if (connection == nullptr || !connection->open()) return;
  const transport::ConnectionStats stats = connection->stats();
  const uint64_t arrivals = stats.messages_received + stats.bulk_received;
  if (arrivals != arrivals_seen_ || quiet_since_ == absl::InfinitePast()) {
    arrivals_seen_ = arrivals;
    quiet_since_ = now;
    idle_since_ = now;
    return;
  }
  const absl::Duration quiet = now - quiet_since_;
  if (holds_calls) {
    // Idle counts from the last call, not from the last request: a client whose long call was
    // just answered is not idle, however long ago it last sent something.
    idle_since_ = now;
    if (probe <= absl::ZeroDuration() || quiet < probe || now - last_probe_ < probe) return;
    last_probe_ = now;
    server_.CountProbe();
    static_cast<void>(connection->Probe());
    return;
  }
  const absl::Duration idle_for = now - idle_since_;
  if (idle <= absl::ZeroDuration() || idle_for < idle) return;
  server_.CountIdleClosed();  // before the close, which the peer may see at once
  ZRPC_LOG(kInfo, "server", "closing the connection to ", connection->peer_address(),
           ": nothing received and no calls for ", absl::FormatDuration(idle_for),
           " (ServerOptions::idle_timeout)");
  connection->Close();
}

bool ServerConnection::SendsDrained() {
  std::shared_ptr<transport::Connection> connection;
  {
    absl::MutexLock lock(&mu_);
    connection = connection_;
  }
  if (connection == nullptr || !connection->open()) return true;
  if (deferred() > 0) return false;
  if (connection->stats().sends_outstanding == 0) return true;
  // The last answers may have gone unsignalled (transport::Connection::Send without a token):
  // ask for a completion behind them, or they would stay counted until traffic that never comes.
  static_cast<void>(connection->Flush());
  return false;
}

void ServerConnection::Close() {
  std::shared_ptr<transport::Connection> connection;
  {
    absl::MutexLock lock(&mu_);
    connection = connection_;
  }
  if (connection != nullptr) connection->Close();
}

int ServerConnection::AnswerAll(const absl::Status& status) {
  // Under the lock: a call's Finish forgets its id and destroys it under the same lock
  // (Retire), so every call seen here is alive until the lock is dropped.
  StreamEndings later;
  int answered = 0;
  {
    absl::MutexLock lock(&mu_);
    for (auto& [id, call] : calls_) answered += call->AnswerFor(status, &later) ? 1 : 0;
  }
  EndStreams(later);
  return answered;
}

void ServerConnection::OnClosed(transport::Connection& connection, const absl::Status& why) {
  DropPending(connection);
  // A client going away (it closed, or its process died) is ordinary; anything else the
  // transport reports (a failed completion, a peer beyond its credits, a bad frame) is a fault
  // the operator needs to see, with its reason. Violations of the RPC protocol were logged when
  // they were found; this side's own closes (kCancelled) need no word.
  if (why.code() != absl::StatusCode::kCancelled && !transport::IsPeerDisconnect(why) &&
      violations() == 0) {
    ZRPC_LOG(kError, "server", "the connection to ", connection.peer_address(),
             " failed: ", why.ToString());
  }
  std::shared_ptr<transport::Connection> attached;  // dropped after the lock
  StreamEndings later;
  {
    absl::MutexLock lock(&mu_);
    closed_ = true;
    attached = std::move(connection_);
    // The client is gone: its calls are no longer wanted. Their handlers still Finish them,
    // which gives their memory back (sends fail quietly on a closed connection).
    for (auto& [id, call] : calls_) call->GiveUp(&later);
  }
  EndStreams(later);
  if (violations() > 0) server_.CountViolation();
  server_.ConnectionClosed(this);  // may destroy `this`: nothing after it
}

}  // namespace zrpc::internal
