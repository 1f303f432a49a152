// The runtime's own clock: monotonic, as absl::Time values on an arbitrary epoch (the host's
// boot). Deadlines enter through the API on the wall clock (CallOptions::deadline) and are
// converted once, when the call starts; from then on a step of the wall clock (NTP, a VM
// resumed, an operator's `date`) neither fires nor extends them, as in gRPC. Never compare these
// values with absl::Now(): only with each other and with durations.
//
// A call's own times on the hot path (its start, the call clock's readings, a server call's
// deadline) are kept as integer nanoseconds on the same epoch (MonotonicNanos): their arithmetic
// is an integer's, where absl::Time's and absl::Duration's is a call into Debian's shared Abseil
// (about 20 instructions for each subtraction or conversion; eight of them per round trip
// before: benchmarks/CALL_PATH_LOG.md).
#ifndef ZRPC_RPC_COMMON_MONOTONIC_H_
#define ZRPC_RPC_COMMON_MONOTONIC_H_

#include <chrono>
#include <cstdint>

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace zrpc::internal {

// Nanoseconds, as a steady_clock reading.
inline int64_t MonotonicNanos() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// No deadline, in nanoseconds.
inline constexpr int64_t kNoDeadlineNanos = INT64_MAX;

inline absl::Time MonotonicNow() { return absl::FromUnixNanos(MonotonicNanos()); }

// A MonotonicNanos() value as steady_clock's time point.
inline std::chrono::steady_clock::time_point SteadyFromNanos(int64_t nanos) {
  return std::chrono::steady_clock::time_point(
      std::chrono::duration_cast<std::chrono::steady_clock::duration>(
          std::chrono::nanoseconds(nanos)));
}

// `wall_deadline` (absl::Now()'s clock; InfiniteFuture for none) as a monotonic deadline, given
// both clocks read now.
inline absl::Time ToMonotonic(absl::Time wall_deadline, absl::Time monotonic_now,
                              absl::Time wall_now) {
  if (wall_deadline == absl::InfiniteFuture()) return absl::InfiniteFuture();
  return monotonic_now + (wall_deadline - wall_now);
}
// The same, reading the wall clock only when there is a deadline.
inline absl::Time ToMonotonic(absl::Time wall_deadline, absl::Time monotonic_now) {
  if (wall_deadline == absl::InfiniteFuture()) return absl::InfiniteFuture();
  return ToMonotonic(wall_deadline, monotonic_now, absl::Now());
}

}  // namespace zrpc::internal

#endif  // ZRPC_RPC_COMMON_MONOTONIC_H_
