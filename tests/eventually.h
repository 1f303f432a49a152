// Eventually: polls a condition until it holds or a timeout passes, for tests that wait on state
// they can only observe (stats, counters), never forever.
#ifndef ZRPC_TESTS_EVENTUALLY_H_
#define ZRPC_TESTS_EVENTUALLY_H_

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace zrpc::testing {

// True once `done()` holds, checked every `poll`; false if `timeout` passes first.
template <typename F>
bool Eventually(F done, absl::Duration timeout = absl::Seconds(30),
                absl::Duration poll = absl::Milliseconds(5)) {
  const absl::Time until = absl::Now() + timeout;
  while (!done()) {
    if (absl::Now() > until) return false;
    absl::SleepFor(poll);
  }
  return true;
}

}  // namespace zrpc::testing

#endif  // ZRPC_TESTS_EVENTUALLY_H_
