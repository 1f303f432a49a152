// TraceInterceptor: W3C Trace Context (https://www.w3.org/TR/trace-context/) propagation, on
// both sides of a call.
//  - As a server's interceptor: each call whose `traceparent` metadata is valid joins that trace,
//    under a span of its own (a fresh span id, the caller's as its parent); with none, or one
//    that does not parse, the call starts a trace of its own (Options::start_traces). The
//    handler reads it as ServerContext::trace(), and Propagate(context, &options) passes it on
//    with the calls it makes, so they join the trace too. With Options::log_calls each call's end
//    is logged with its trace and span ids, so a trace found in a tracing system leads to the
//    server's log lines and back.
//  - As a channel's interceptor: a call that carries no traceparent (none set, none
//    propagated) gets one that starts a trace (Options::start_traces), so every call a client
//    makes can be followed through the servers it reaches.
//
//   auto tracing = std::make_shared<zrpc::TraceInterceptor>();
//   server_options.interceptors.push_back(tracing);
//   channel_options.interceptors.push_back(tracing);
//   // In a handler calling on: zrpc::TraceInterceptor::Propagate(context, &call_options);
//
// Contract: as every ServerInterceptor (rpc/interceptor.h); holds no state per call.
#ifndef ZRPC_RPC_TRACE_INTERCEPTOR_H_
#define ZRPC_RPC_TRACE_INTERCEPTOR_H_

#include "absl/status/status.h"
#include "rpc/call_options.h"
#include "rpc/interceptor.h"
#include "rpc/metadata.h"
#include "rpc/server_context.h"
#include "rpc/service.h"

namespace zrpc {

class TraceInterceptor : public ServerInterceptor, public ClientInterceptor {
 public:
  struct Options {
    // A call without a valid traceparent starts a trace (a random trace id, unsampled): on a
    // server, the handler's; on a channel, the one the call sends. False: a server's call without
    // one has no trace (ServerContext::trace() is null), and a channel sends none of its own.
    bool start_traces = true;
    // Log each traced call's end (info): method, trace id, span id, parent span id, status.
    bool log_calls = false;
  };
  TraceInterceptor() = default;
  explicit TraceInterceptor(Options options) : options_(options) {}

  // The metadata key W3C Trace Context names: "traceparent".
  static constexpr const char* kKey = "traceparent";

  // Adds the trace of the call `context` serves to `options`' metadata, as its traceparent, so
  // that a call a handler makes joins its caller's trace under the handler's span. Nothing when
  // the call has no trace or `options` carries a traceparent already; Metadata::Add's error when
  // there is no room for it.
  static ::absl::Status Propagate(const ServerContext& context, CallOptions* options);

  // ServerInterceptor.
  ::absl::Status OnCallStart(ServerContext& context, const MethodInfo& method) override;
  void OnCallEnd(ServerContext& context, const MethodInfo& method,
                 const ::absl::Status& status) override;
  // ClientInterceptor.
  ::absl::Status OnCallStart(const MethodInfo& method, Metadata& metadata) override;

 private:
  const Options options_;
};

}  // namespace zrpc

#endif  // ZRPC_RPC_TRACE_INTERCEPTOR_H_
