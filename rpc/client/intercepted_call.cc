// InterceptedCall: a channel's client interceptors around one call.

#include "rpc/client/intercepted_call.h"

#include <utility>

namespace zrpc::internal {

InterceptedCall::InterceptedCall(const Chain& chain, const MethodInfo& method,
                                 const CallOptions& options)
    : chain_(chain),
      method_(method),
      options_(options),
      caller_trailing_(options.trailing_metadata) {
  options_.trailing_metadata = &trailing_;
  if (caller_trailing_ != nullptr) caller_trailing_->Clear();
}

absl::StatusOr<std::unique_ptr<InterceptedCall>> InterceptedCall::Start(
    const Chain& chain, const MethodInfo& method, const CallOptions& options) {
  std::unique_ptr<InterceptedCall> call(new InterceptedCall(chain, method, options));
  for (const std::shared_ptr<ClientInterceptor>& interceptor : chain) {
    absl::Status started = interceptor->OnCallStart(method, call->options_.metadata);
    if (!started.ok()) {
      call->End(started);
      return started;
    }
    ++call->started_;
  }
  return call;
}

void InterceptedCall::End(const absl::Status& status) {
  if (ended_) return;
  ended_ = true;
  if (caller_trailing_ != nullptr) *caller_trailing_ = trailing_;
  for (size_t i = started_; i > 0; --i) chain_[i - 1]->OnCallEnd(method_, status, trailing_);
}

DoneCallback InterceptedCall::Wrap(std::unique_ptr<InterceptedCall> call, DoneCallback done) {
  call->done_ = std::move(done);
  return [call = call.release()](absl::Status status) {
    call->End(status);
    DoneCallback done = std::move(call->done_);
    delete call;
    done(std::move(status));
  };
}

}  // namespace zrpc::internal
