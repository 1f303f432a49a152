// TraceInterceptor: a call's trace from its traceparent, or a new one; a fresh span id per call.

#include "rpc/trace_interceptor.h"

#include <cstring>
#include <optional>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "transport/log.h"

namespace zrpc {

namespace {

// Span and trace ids: unique, not secret (W3C Trace Context asks for randomness, not for
// unpredictability), so a generator per thread, seeded once from the kernel.
uint64_t RandomId() {
  thread_local std::mt19937_64 generator{std::random_device{}()};
  uint64_t id;
  do {
    id = generator();
  } while (id == 0);  // all zero is invalid
  return id;
}

template <size_t N>
void Fill(std::array<uint8_t, N>* bytes) {
  for (size_t i = 0; i < N; i += 8) {
    const uint64_t id = RandomId();
    std::memcpy(bytes->data() + i, &id, 8);
  }
}

}  // namespace

absl::Status TraceInterceptor::Propagate(const ServerContext& context, CallOptions* options) {
  const TraceContext* trace = context.trace();
  if (trace == nullptr || options->metadata.Find(kKey) != nullptr) return absl::OkStatus();
  return options->metadata.Add(kKey, trace->traceparent());
}

absl::Status TraceInterceptor::OnCallStart(const MethodInfo& method, Metadata& metadata) {
  static_cast<void>(method);
  if (!options_.start_traces || metadata.Find(kKey) != nullptr) return absl::OkStatus();
  TraceContext trace;
  Fill(&trace.trace_id);
  Fill(&trace.span_id);  // the caller's span: the server's parent
  return metadata.Add(kKey, trace.traceparent());
}

absl::Status TraceInterceptor::OnCallStart(ServerContext& context, const MethodInfo& method) {
  static_cast<void>(method);
  std::optional<TraceContext> trace;
  // More than one traceparent: which is meant cannot be told (W3C: treat it as none).
  const std::vector<absl::string_view> values = context.client_metadata().FindAll(kKey);
  if (values.size() == 1) trace = TraceContext::Parse(values[0]);
  if (!trace) {
    if (!options_.start_traces) return absl::OkStatus();
    trace.emplace();
    Fill(&trace->trace_id);  // parent_id stays zero: this call is the trace's root
  }
  Fill(&trace->span_id);
  context.SetTrace(*trace);
  return absl::OkStatus();
}

void TraceInterceptor::OnCallEnd(ServerContext& context, const MethodInfo& method,
                                 const absl::Status& status) {
  if (!options_.log_calls) return;
  const TraceContext* trace = context.trace();
  if (trace == nullptr) return;
  ZRPC_LOG(kInfo, "trace", method.full_name, " trace=", trace->trace_id_hex(),
           " span=", trace->span_id_hex(), " parent=", trace->parent_id_hex(), " from ",
           context.peer(), ": ", status.ok() ? "OK" : status.ToString());
}

}  // namespace zrpc
