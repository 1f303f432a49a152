// ServerCallImpl, a unary call: running its handler (or ending it unrun when the caller gave
// up), its response slot, Finish and the response it sends, and the runtime answering for it.

#include "rpc/server/server_call.h"

#include <thread>
#include <utility>

#include "absl/base/optimization.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "rpc/bulk/registration.h"
#include "rpc/common/call_clock.h"
#include "rpc/common/monotonic.h"
#include "rpc/server/server_connection.h"
#include "rpc/server/server_impl.h"
#include "rpc/stream/stream_pump.h"
#include "transport/log.h"

namespace zrpc::internal {

ServerCallImpl::ServerCallImpl(ServerConnection& owner, transport::Connection& connection,
                               Service* service, const MethodInfo& method, MethodMetrics& metrics,
                               const IncomingMessage& request, int64_t arrival_nanos,
                               uint16_t stream_window)
    : owner_(&owner),
      connection_(&connection),
      service_(service),
      method_(method),
      metrics_(metrics),
      start_nanos_(arrival_nanos),
      request_(request) {
  if (stream_window > 0) {
    // The client granted request.header.window messages in its open; this side grants its own
    // window when the handler starts (OpenStream).
    stream_ = std::make_shared<StreamState>(nullptr, stream_window, request.header.window);
  }
  // From the arrival's reading: no second clock read.
  deadline_nanos_ = DeadlineNanosFromWire(request.header.timeout_us, arrival_nanos);
  context_.monotonic_deadline_ =
      deadline_nanos_ == kNoDeadlineNanos ? ServerContext::kNone : SteadyFromNanos(deadline_nanos_);
  // The transport connection outlives the call (server_call.h), and its address never changes.
  context_.SetPeer(connection.peer_address(), connection.auth_key_id());
  metrics_.OnStart();
  metrics_.AddMessageBytes(0, request.body.size());
  metrics_.AddBulkBytes(0, request.bulk ? request.bulk->size : 0);
}

bool ServerCallImpl::GivenUp() const {
  return context_.cancel_requested() ||
         (deadline_nanos_ != kNoDeadlineNanos && CallClockNanos() >= deadline_nanos_);
}

void ServerCallImpl::Run() {
  if (GivenUp()) {
    const bool late = CallClockNanos() >= deadline_nanos_;
    owner_->server().CountSkipped();
    Finish(late ? absl::DeadlineExceededError(absl::StrCat(
                      method_.full_name, ": the deadline passed before the handler ran"))
                : absl::CancelledError(
                      absl::StrCat(method_.full_name, ": given up before the handler ran")),
           nullptr, OutgoingBulk());
    return;
  }
  if (ABSL_PREDICT_FALSE(owner_->intercepted()) && !StartInterceptors()) return;
  handler_ran_ = true;
  service_->Dispatch(method_.index, this);
}

bool ServerCallImpl::StartInterceptors() {
  const auto& chain = owner_->server().options().interceptors;
  for (const std::shared_ptr<ServerInterceptor>& interceptor : chain) {
    absl::Status started = interceptor->OnCallStart(context_, method_);
    if (!started.ok()) {
      // The one that refused is told no end: it answered the call itself.
      Finish(std::move(started), nullptr, OutgoingBulk());
      return false;
    }
    ++intercepted_;
  }
  return true;
}

void ServerCallImpl::EndInterceptors(const absl::Status& status) {
  const auto& chain = owner_->server().options().interceptors;
  for (uint32_t i = intercepted_; i > 0; --i) chain[i - 1]->OnCallEnd(context_, method_, status);
}

bool ServerCallImpl::InterceptMessage(StreamDirection direction,
                                      const google::protobuf::MessageLite& message) {
  const auto& chain = owner_->server().options().interceptors;
  absl::Status status;
  for (uint32_t i = 0; i < intercepted_ && status.ok(); ++i) {
    const uint32_t at = direction == StreamDirection::kReceived ? i : intercepted_ - 1 - i;
    status = chain[at]->OnStreamMessage(context_, method_, direction, message);
  }
  if (status.ok()) return true;
  FailStream(std::move(status));  // the client hears it, whatever the handler returns
  return false;
}

IncomingBulk ServerCallImpl::TakeRequestBulk() {
  if (!request_.bulk) return IncomingBulk();
  transport::ReceivedBulk bulk = *std::exchange(request_.bulk, std::nullopt);
  return ReceiveReleaser::Wrap(*owner_, connection_->shared_from_this(), bulk);
}

absl::StatusOr<SendSlot> ServerCallImpl::AcquireResponseSlot(size_t size) {
  // The trailing metadata goes first in the SEND (WIRE.md, "Metadata"), the response after it.
  const Metadata* trailing = context_.trailing_metadata();
  const size_t block = trailing == nullptr ? 0 : MetadataBlockSize(trailing, nullptr);
  const size_t entries = trailing == nullptr ? 0 : trailing->encoded_size();
  if (absl::Status fits = owner_->limits().CheckMessage(size + entries, "response"); !fits.ok()) {
    return absl::ResourceExhaustedError(absl::StrCat(method_.full_name, ": ", fits.message()));
  }
  if (block > 0) {
    if (absl::Status fits = RpcConnection::MetadataFits(*connection_, block); !fits.ok()) {
      return absl::Status(fits.code(),
                          absl::StrCat(method_.full_name, ": trailing metadata: ", fits.message()));
    }
  }
  if (response_buffer_) connection_->ReleaseSendBuffer(*std::exchange(response_buffer_, {}));
  large_response_.reset();
  absl::StatusOr<transport::SendBuffer> buffer = connection_->AcquireSendBuffer();
  if (!buffer.ok()) return buffer.status();
  response_buffer_ = *buffer;
  response_block_ = block;
  if (block > 0) EncodeMetadataBlock(trailing, nullptr, RpcConnection::Body(*buffer));
  if (RpcConnection::FitsSlot(*connection_, block + size)) {
    return SendSlot{RpcConnection::Body(*buffer) + block, size, buffer->slot};
  }
  // Larger than a slot: serialized into memory of its own, sent at the front of the payload.
  large_response_.reset(static_cast<uint8_t*>(std::malloc(size)));
  if (large_response_ == nullptr) {
    return absl::ResourceExhaustedError(
        absl::StrCat(method_.full_name, ": out of memory for a ", size, "-byte response"));
  }
  return SendSlot{large_response_.get(), size, buffer->slot};
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
  if (ClaimAnswer()) {
    // A declared method the service left unimplemented (its generated default answered) counts
    // as an unknown one does (ServerStats::unimplemented), as does a handler's own UNIMPLEMENTED.
    if (!status.ok() && status.code() == absl::StatusCode::kUnimplemented) {
      owner_->server().CountUnimplemented();
    }
    // ok() is inline; code() is a call into Abseil's library.
    const absl::Status sent = SendResponse(std::move(status), response, std::move(response_bulk));
    code = sent.ok() ? absl::StatusCode::kOk : sent.code();
    // Here, before the call is retired (RunInDomain may destroy it): the context is the call's.
    if (ABSL_PREDICT_FALSE(intercepted_ > 0)) EndInterceptors(sent);
  } else {
    response_bulk.Reset();  // answered already (Shutdown): this answer is discarded
    if (intercepted_ > 0) {
      EndInterceptors(absl::UnavailableError(
          absl::StrCat(method_.full_name,
                       ": answered by the runtime (the connection failed, or the server's "
                       "shutdown grace ran out)")));
    }
  }
  // A fresh reading: the handler's time is the server's latency (call_clock.h), and the rest of
  // the batch goes on from it.
  metrics_.OnFinishNanos(code, CallClockRefreshNanos() - start_nanos_);
  if (response_buffer_) connection_->ReleaseSendBuffer(*std::exchange(response_buffer_, {}));
  if (!request_released_) static_cast<void>(connection_->Release(request_.handle));
  if (request_.bulk) RpcConnection::ReleasePayload(*connection_, request_.bulk->handle);
  if (request_.body_payload) {
    RpcConnection::ReleasePayload(*connection_, request_.body_payload->handle);
  }
  // The call leaves its connection's map and is destroyed in place, in the connection's domain
  // (RunInDomain, Retire), where a cancel, the close or Shutdown's answers find it: never half
  // gone; its memory stays for the next call. In the domain already (an inline handler, in its
  // batch), that is now; else at once or, when another thread holds the domain, by that thread,
  // and this returns. Nothing here touches the call after: it may be gone.
  ServerImpl& server = owner_->server();
  connection_->RunInDomain(*this);
  server.CallDone();
}

absl::Status ServerCallImpl::SendResponse(absl::Status status, SendSlot* response,
                                          OutgoingBulk response_bulk) {
  if (GivenUp()) {
    // Nobody waits for this answer (the client's deadline passed or it cancelled, and it sent
    // a cancel or will drop the answer as late): stage, write and send nothing.
    response_bulk.Reset();
    if (handler_ran_) owner_->server().CountAnswerDropped();
    return CallClockNanos() >= deadline_nanos_
               ? absl::DeadlineExceededError("the caller's deadline passed")
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
    size_t body_size = response_block_ + response->size;
    if (uint8_t* large = large_response_.release()) {
      large_body = OutgoingBulk(large, response->size, [large] { std::free(large); });
      body_size = response_block_;
    }
    RpcHeader header = RpcHeader::Response(call_id());
    if (response_block_ > 0) header.flags |= kRpcFlagMetadata;
    if (bulk_size == 0 && large_body.empty() && !request_released_) {
      // The common answer: the request's slot goes back and the response goes out under one
      // transport lock, the response carrying the slot's credit.
      request_released_ = true;
      status = owner_->SendAnswer(*connection_, buffer, header, body_size, request_.handle);
    } else {
      status =
          owner_->SendMessage(*connection_, buffer, header, body_size, std::move(response_bulk),
                              std::move(large_body), absl::InfiniteFuture(), nullptr, expose);
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
  if (absl::Status sent =
          owner_->SendError(*connection_, call_id(), status, context_.trailing_metadata());
      !sent.ok()) {
    if (connection_->open()) {
      // No send slot for the error: the client would wait for its deadline without a word. Fail
      // its connection instead, which fails its calls at once.
      ZRPC_LOG(kError, "server", "cannot answer call ", call_id(), " from ",
               connection_->peer_address(), " (", sent.ToString(), "); closing");
      owner_->NoteError(
          absl::StrCat("call ", call_id(), ": cannot answer (", sent.ToString(), "); closing"));
      connection_->Close();
    }
    // What the client gets is its connection's failure, not this answer.
    return absl::UnavailableError(absl::StrCat(method_.full_name, ": the answer (",
                                               status.ToString(),
                                               ") could not be sent: ", sent.message()));
  }
  return status;
}

void ServerCallImpl::RunInDomain(transport::Connection& /*connection*/) { owner_->Retire(this); }

bool ServerCallImpl::ClaimAnswer() {
  // The other claimant, AnswerFor, runs only in the connection's domain. A Finish there too (an
  // inline handler) cannot overlap it: a load and a store settle the race, no atomic exchange.
  // A Finish elsewhere (a pool thread) may, and exchanges.
  if (connection_->InDomain()) {
    if (answered_.load(std::memory_order_relaxed)) return false;
    answered_.store(true, std::memory_order_relaxed);
    return true;
  }
  return !answered_.exchange(true, std::memory_order_acq_rel);
}

bool ServerCallImpl::AnswerFor(const absl::Status& status, StreamEndings* later) {
  // In the connection's domain (AnswerAll), so Finish cannot retire the call meanwhile; the
  // answer is claimed before the handler is woken.
  const bool answer = !answered_.exchange(true, std::memory_order_acq_rel);
  GiveUp(later);
  if (!answer) return false;
  if (absl::Status sent = owner_->SendError(*connection_, call_id(), status); !sent.ok()) {
    owner_->NoteError(
        absl::StrCat("call ", call_id(), ": cannot answer (", sent.ToString(), "); closing"));
    connection_->Close();
  }
  return true;
}

}  // namespace zrpc::internal
