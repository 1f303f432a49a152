// ChannelTimer (channel_timer.h): the loop that runs its members' passes.

#include "rpc/client/channel_timer.h"

#include <algorithm>
#include <chrono>
#include <limits>

#include "rpc/common/monotonic.h"
#include "rpc/connection/rpc_connection.h"

namespace zrpc::internal {
namespace {

// The loop's wake_at_ while it runs passes: a WakeBy then needs no notice, since the loop looks
// at every member again after its round.
constexpr int64_t kAwake = std::numeric_limits<int64_t>::min();

int64_t Nanos(absl::Time t) {
  return t == absl::InfiniteFuture() ? std::numeric_limits<int64_t>::max() : absl::ToUnixNanos(t);
}

}  // namespace

void ChannelTimer::Member::WakeBy(absl::Time at) {
  const int64_t ns = Nanos(at);
  int64_t current = wake_at_.load(std::memory_order_acquire);
  if (ns >= current) return;  // a pass that early is asked for already
  while (ns < current && !wake_at_.compare_exchange_weak(current, ns, std::memory_order_acq_rel)) {
  }
  // Lowered by this call (else another lowered it further, and told the loop).
  if (ns < current) timer_->Wake(ns);
}

ChannelTimer::ChannelTimer() : thread_([this] { Loop(); }) {}

ChannelTimer::~ChannelTimer() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_one();
  thread_.join();
}

void ChannelTimer::Join(Member* member, absl::Time first) {
  std::lock_guard<std::mutex> lock(mu_);
  member->timer_ = this;
  member->next_ = first;
  members_.push_back(member);
  if (Nanos(first) < wake_at_) cv_.notify_one();
}

void ChannelTimer::Leave(Member* member) {
  std::unique_lock<std::mutex> lock(mu_);
  members_.erase(std::remove(members_.begin(), members_.end(), member), members_.end());
  // Out of the loop's current round too (by value, not position: the loop walks it by index).
  std::replace(due_.begin(), due_.end(), member, static_cast<Member*>(nullptr));
  left_cv_.wait(lock, [member] { return !member->running_; });
}

uint64_t ChannelTimer::rounds() const {
  std::lock_guard<std::mutex> lock(mu_);
  return rounds_;
}

size_t ChannelTimer::members() const {
  std::lock_guard<std::mutex> lock(mu_);
  return members_.size();
}

absl::Time ChannelTimer::OnGrid(absl::Time t, absl::Duration grid) {
  const int64_t g = absl::ToInt64Nanoseconds(grid);
  if (g <= 0 || t == absl::InfiniteFuture()) return t;
  // Monotonic times count from the host's boot: never negative.
  const int64_t ns = absl::ToUnixNanos(t);
  return absl::FromUnixNanos((ns + g - 1) / g * g);
}

void ChannelTimer::Wake(int64_t at) {
  std::lock_guard<std::mutex> lock(mu_);
  if (at < wake_at_) cv_.notify_one();
}

void ChannelTimer::Loop() {
  MarkRuntimeTimerThread();  // the members' callbacks (deadlines, keepalives) run here
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    if (stop_) return;
    // Every member's next time: its keepalive pass (next_) or an earlier WakeBy.
    const int64_t now = MonotonicNanos();
    int64_t earliest = Member::kNever;
    due_.clear();
    for (Member* member : members_) {
      const int64_t at =
          std::min(member->wake_at_.load(std::memory_order_acquire), Nanos(member->next_));
      if (at <= now) {
        due_.push_back(member);
      } else {
        earliest = std::min(earliest, at);
      }
    }
    if (due_.empty()) {
      // Asleep until then, or until a member asks for earlier (Wake), joins, or the timer stops.
      // A std::condition_variable waits on the steady clock: a step of the wall clock moves no
      // pass (monotonic.h).
      wake_at_ = earliest;
      if (earliest == Member::kNever) {
        cv_.wait(lock);
      } else {
        cv_.wait_until(lock, SteadyFromNanos(earliest));
      }
      continue;
    }
    wake_at_ = kAwake;
    ++rounds_;
    for (size_t i = 0; i < due_.size(); ++i) {
      Member* member = due_[i];
      if (member == nullptr) continue;  // left meanwhile
      // Its WakeBy starts afresh: a call asking during the pass asks again, and the pass itself
      // looks at every deadline registered before it.
      member->wake_at_.store(Member::kNever, std::memory_order_release);
      member->running_ = true;
      lock.unlock();
      const absl::Time next = member->TimerPass(MonotonicNow());
      lock.lock();
      member->running_ = false;
      member->next_ = next;
      left_cv_.notify_all();
    }
    due_.clear();
  }
}

}  // namespace zrpc::internal
