// InterceptedCall: a call going through its channel's client interceptors (rpc/interceptor.h):
// the options it goes with (its metadata as the interceptors left it, its trailing metadata
// landing here), how many interceptors started, and the chain's end, which runs before the
// caller hears of the call's end.
#ifndef ZRPC_RPC_CLIENT_INTERCEPTED_CALL_H_
#define ZRPC_RPC_CLIENT_INTERCEPTED_CALL_H_

#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "rpc/call_options.h"
#include "rpc/interceptor.h"
#include "rpc/metadata.h"
#include "rpc/service.h"

namespace zrpc::internal {

class InterceptedCall {
 public:
  using Chain = std::vector<std::shared_ptr<ClientInterceptor>>;

  // Runs `chain`'s OnCallStart for a call to `method` with `options`, in order. The first refusal
  // ends the call: those started see their end (with it), and it is returned.
  static absl::StatusOr<std::unique_ptr<InterceptedCall>> Start(const Chain& chain,
                                                                const MethodInfo& method,
                                                                const CallOptions& options);

  // What the call goes with: the caller's options, with the interceptors' metadata, and its
  // trailing metadata landing here (End copies it to the caller's).
  const CallOptions& options() const { return options_; }

  // The call ended with `status`: the trailing metadata goes to where the caller asked, and the
  // started interceptors' OnCallEnd run, in reverse. Once.
  void End(const absl::Status& status);

  // `done` with the chain's end run first; the call is the callback's from here on (deleted once
  // it ran).
  static DoneCallback Wrap(std::unique_ptr<InterceptedCall> call, DoneCallback done);

 private:
  InterceptedCall(const Chain& chain, const MethodInfo& method, const CallOptions& options);

  const Chain& chain_;  // the channel's options', which outlive its calls
  const MethodInfo& method_;
  CallOptions options_;
  Metadata trailing_;
  Metadata* const caller_trailing_;
  size_t started_ = 0;
  bool ended_ = false;
  DoneCallback done_;
};

}  // namespace zrpc::internal

#endif  // ZRPC_RPC_CLIENT_INTERCEPTED_CALL_H_
