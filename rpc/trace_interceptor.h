// TraceInterceptor: W3C Trace Context (https://www.w3.org/TR/trace-context/) for a server's
// calls. Each call whose `traceparent` metadata is valid joins that trace, under a span of its
// own (a fresh span id, the caller's as its parent); with none, or one that does not parse,
// the call starts a trace of its own (Options::start_traces). The handler reads it as
// ServerContext::trace() and passes trace()->traceparent() on with the calls it makes, so they
// join the trace too. With Options::log_calls each call's end is logged with its trace and span
// ids, so a trace found in a tracing system leads to the server's log lines and back.
//
//   zrpc::ServerOptions options;
//   options.interceptors.push_back(std::make_shared<zrpc::TraceInterceptor>());
//
// Contract: as every ServerInterceptor (rpc/interceptor.h); holds no state per call.
#ifndef ZRPC_RPC_TRACE_INTERCEPTOR_H_
#define ZRPC_RPC_TRACE_INTERCEPTOR_H_

#include "absl/status/status.h"
#include "rpc/interceptor.h"
#include "rpc/server_context.h"
#include "rpc/service.h"

namespace zrpc {

class TraceInterceptor : public ServerInterceptor {
 public:
  struct Options {
    // A call without a valid traceparent starts a trace (a random trace id, unsampled); false:
    // such a call has no trace (ServerContext::trace() is null).
    bool start_traces = true;
    // Log each traced call's end (info): method, trace id, span id, parent span id, status.
    bool log_calls = false;
  };
  TraceInterceptor() = default;
  explicit TraceInterceptor(Options options) : options_(options) {}

  // The metadata key W3C Trace Context names: "traceparent".
  static constexpr const char* kKey = "traceparent";

  ::absl::Status OnCallStart(ServerContext& context, const MethodInfo& method) override;
  void OnCallEnd(ServerContext& context, const MethodInfo& method,
                 const ::absl::Status& status) override;

 private:
  const Options options_;
};

}  // namespace zrpc

#endif  // ZRPC_RPC_TRACE_INTERCEPTOR_H_
