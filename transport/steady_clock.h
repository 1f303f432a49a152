// SteadyNanos: the steady clock in nanoseconds, for times kept in an atomic or compared without
// absl::Time (a step of the wall clock must not move a retry or a watchdog). Read without a
// system call (vDSO).
#ifndef ZRPC_TRANSPORT_STEADY_CLOCK_H_
#define ZRPC_TRANSPORT_STEADY_CLOCK_H_

#include <chrono>
#include <cstdint>

namespace zrpc::transport {

inline int64_t SteadyNanos() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace zrpc::transport

#endif  // ZRPC_TRANSPORT_STEADY_CLOCK_H_
