// TraceInterceptor: a call's trace from its traceparent, or a new one; a fresh span id per call.

#include "rpc/trace_interceptor.h"

#include <atomic>
#include <cstring>
#include <optional>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "transport/log.h"

namespace zrpc {

namespace {

// Span and trace ids: W3C Trace Context asks for ids that are unique and random, not secret.
// SplitMix64's finalizer over a counter: a bijection, so no two ids of this process are alike
// until 2^64 have been made, and random across processes (a start and a key read from the
// kernel once). One relaxed atomic add per id, on any thread, with no seeding per thread (a
// stream's handler runs on a thread of its own).
uint64_t RandomId() {
  struct Seed {
    uint64_t start, key;
  };
  static const Seed seed = [] {
    std::random_device device;
    auto word = [&device] { return uint64_t{device()} << 32 | device(); };
    return Seed{word(), word()};
  }();
  static std::atomic<uint64_t> counter{0};
  for (;;) {
    uint64_t z = seed.start + counter.fetch_add(1, std::memory_order_relaxed) * 0x9e3779b97f4a7c15;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9;
    z = (z ^ (z >> 27)) * 0x94d049bb133111eb;
    const uint64_t id = (z ^ (z >> 31)) ^ seed.key;
    if (id != 0) return id;  // all zero is invalid
  }
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
