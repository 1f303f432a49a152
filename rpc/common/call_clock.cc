#include "rpc/common/call_clock.h"

#include <cstdint>

#include "rpc/common/monotonic.h"
#include "transport/poller.h"

namespace zrpc::internal {
namespace {

struct ThreadClock {
  uint64_t batch = 0;  // the poller batch `batch_now` was read in (0: none)
  int64_t batch_now = 0;
  bool scoped = false;  // inside a CallClockScope, whose reading is `scope_now`
  int64_t scope_now = 0;
};
thread_local ThreadClock thread_clock;

}  // namespace

int64_t CallClockNanos() {
  ThreadClock& c = thread_clock;
  if (const uint64_t batch = transport::Poller::CurrentBatch(); batch != 0) {
    if (c.batch != batch) {
      c.batch = batch;
      c.batch_now = MonotonicNanos();
    }
    return c.batch_now;
  }
  if (c.scoped) return c.scope_now;
  return MonotonicNanos();
}

int64_t CallClockRefreshNanos() {
  ThreadClock& c = thread_clock;
  const int64_t now = MonotonicNanos();
  if (const uint64_t batch = transport::Poller::CurrentBatch(); batch != 0) {
    c.batch = batch;
    c.batch_now = now;
  } else if (c.scoped) {
    c.scope_now = now;
  }
  return now;
}

CallClockScope::CallClockScope(int64_t now) : outermost_(!thread_clock.scoped) {
  if (outermost_) {
    thread_clock.scoped = true;
    thread_clock.scope_now = now;
  }
}

CallClockScope::~CallClockScope() {
  if (outermost_) thread_clock.scoped = false;
}

}  // namespace zrpc::internal
