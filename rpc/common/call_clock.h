// The clock calls are timed by: one reading per completion batch on a poller, one per call
// start on an application thread.
//
// A round trip used to read the clock ten times (the call's start, its deadline, the wire
// timeout, the server's arrival, its deadline, its checks, both sides' metrics), each a vDSO
// call and absl::Time arithmetic: about 800 of the RPC layer's instructions per round trip
// (benchmarks/count_instructions). gRPC's ExecCtx answers the same way: work done for one batch
// of events shares one "now". Here:
//   - On a poller, everything one completion batch runs (responses, done callbacks, the calls
//     they start, inline handlers, their answers) shares the reading taken at the batch's first
//     CallClockNow(). transport::Poller::CurrentBatch() says which batch that is.
//   - A call started on an application thread reads once, at its start: its deadline, its
//     metrics' start and (through a CallClockScope) its wire timeout are that one reading.
//   - CallClockRefresh() reads anew and makes the rest of the batch (or scope) use it: after an
//     inline handler ran, whose time the server's latency must include.
// Elsewhere (timers, pool threads, anything outside a batch or scope) each CallClockNow() reads.
//
// What this costs: a reading is up to one batch old. A deadline computed from it starts that
// early, so a call started late in a long batch (inline handlers that run long, which they must
// not) may expire by that much early, never late. Monotonic values (monotonic.h).
#ifndef ZRPC_RPC_COMMON_CALL_CLOCK_H_
#define ZRPC_RPC_COMMON_CALL_CLOCK_H_

#include <cstdint>

#include "absl/time/time.h"

namespace zrpc::internal {

// MonotonicNanos(), read at most once per completion batch or CallClockScope.
int64_t CallClockNanos();
// Reads MonotonicNanos() and makes it the batch's (or scope's) reading from here on.
int64_t CallClockRefreshNanos();

// The same as absl::Time (monotonic.h), for what keeps its times so (deadlines).
inline absl::Time CallClockNow() { return absl::FromUnixNanos(CallClockNanos()); }
inline absl::Time CallClockRefresh() { return absl::FromUnixNanos(CallClockRefreshNanos()); }

// On an application thread, `now_nanos` (a reading the caller took) is what CallClockNanos()
// returns inside the scope, until a CallClockRefreshNanos(). A scope inside another, or on a
// poller in a batch, changes nothing: the outer reading (the batch's) stays.
class CallClockScope {
 public:
  explicit CallClockScope(int64_t now_nanos);
  ~CallClockScope();
  CallClockScope(const CallClockScope&) = delete;
  CallClockScope& operator=(const CallClockScope&) = delete;

 private:
  bool outermost_;
};

}  // namespace zrpc::internal

#endif  // ZRPC_RPC_COMMON_CALL_CLOCK_H_
