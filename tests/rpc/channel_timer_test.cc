// ChannelTimer (rpc/client/channel_timer.h): one thread running its members' passes, at the
// times they ask for, brought forward by WakeBy, never after Leave; keepalive passes on a grid,
// so that many members share the timer's wake-ups. On the host.
#include "rpc/client/channel_timer.h"

#include <atomic>
#include <catch2/catch.hpp>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "rpc/common/monotonic.h"

namespace {

using zrpc::internal::ChannelTimer;
using zrpc::internal::MonotonicNow;

// A member that asks for a pass every `every` (InfiniteDuration: only when woken) and counts its
// passes and the threads they ran on.
class Counting : public ChannelTimer::Member {
 public:
  explicit Counting(absl::Duration every, absl::Duration grid = absl::ZeroDuration())
      : every_(every), grid_(grid) {}
  absl::Time TimerPass(absl::Time now) override {
    passes.fetch_add(1);
    thread = std::this_thread::get_id();
    last_pass = now;
    if (during) during();
    if (every_ == absl::InfiniteDuration()) return absl::InfiniteFuture();
    return ChannelTimer::OnGrid(now + every_, grid_);
  }
  std::atomic<int> passes{0};
  std::thread::id thread;
  absl::Time last_pass;  // the timer's clock at the last pass
  std::function<void()> during;

 private:
  const absl::Duration every_;
  const absl::Duration grid_;
};

}  // namespace

TEST_CASE("members' passes run on the timer's one thread, at the times they ask for",
          "[channel_timer]") {
  ChannelTimer timer;
  Counting a(absl::Milliseconds(20)), b(absl::Milliseconds(50));
  const absl::Time start = MonotonicNow();
  timer.Join(&a, start);
  timer.Join(&b, start);
  absl::SleepFor(absl::Milliseconds(500));
  timer.Leave(&a);
  timer.Leave(&b);
  const double elapsed_ms = absl::ToDoubleMilliseconds(MonotonicNow() - start);
  INFO("a: " << a.passes.load() << " passes, b: " << b.passes.load() << " in " << elapsed_ms
             << " ms");
  // Never early: at most the first and one per period since; late only by the host's scheduling.
  CHECK(a.passes.load() <= elapsed_ms / 20 + 1);
  CHECK(a.passes.load() >= 5);
  CHECK(b.passes.load() <= elapsed_ms / 50 + 1);
  CHECK(b.passes.load() >= 2);
  CHECK(a.thread == b.thread);
  CHECK(a.thread != std::this_thread::get_id());
  const int after = a.passes.load();
  absl::SleepFor(absl::Milliseconds(100));
  CHECK(a.passes.load() == after);  // none after Leave
}

TEST_CASE("WakeBy brings a member's pass forward; a later one adds none", "[channel_timer]") {
  ChannelTimer timer;
  Counting member(absl::InfiniteDuration());
  timer.Join(&member, absl::InfiniteFuture());
  absl::SleepFor(absl::Milliseconds(50));
  CHECK(member.passes.load() == 0);
  const absl::Time start = MonotonicNow();
  member.WakeBy(start + absl::Milliseconds(30));
  member.WakeBy(start + absl::Seconds(30));  // later than one asked for already: nothing
  for (int i = 0; i < 1000 && member.passes.load() == 0; ++i) absl::SleepFor(absl::Milliseconds(5));
  CHECK(member.passes.load() == 1);
  CHECK(member.last_pass - start >= absl::Milliseconds(30));  // not early, by the timer's clock
  absl::SleepFor(absl::Milliseconds(100));
  CHECK(member.passes.load() == 1);  // the pass cleared what it was woken for
  timer.Leave(&member);
}

TEST_CASE("Leave waits for the member's pass under way", "[channel_timer]") {
  ChannelTimer timer;
  Counting member(absl::Milliseconds(10));
  absl::Notification started;
  std::atomic<bool> finished{false};
  member.during = [&] {
    if (started.HasBeenNotified()) return;
    started.Notify();
    absl::SleepFor(absl::Milliseconds(200));
    finished.store(true);
  };
  timer.Join(&member, MonotonicNow());
  started.WaitForNotification();
  timer.Leave(&member);
  CHECK(finished.load());
}

TEST_CASE("a member's pass may make another leave; none of its passes runs after",
          "[channel_timer]") {
  ChannelTimer timer;
  Counting leaver(absl::Milliseconds(10)), left(absl::Milliseconds(10));
  std::atomic<bool> gone{false};
  std::atomic<int> after_leave{0};
  leaver.during = [&] {
    if (!gone.exchange(true)) timer.Leave(&left);  // on the timer's thread, not left's pass
  };
  left.during = [&] {
    if (gone.load()) after_leave.fetch_add(1);
  };
  // Both first due at the same moment, after both joined: one scan finds both, so `left` is in
  // `leaver`'s round (after it, when joined after it), and must be taken out of it.
  const absl::Time first = MonotonicNow() + absl::Milliseconds(50);
  timer.Join(&leaver, first);
  timer.Join(&left, first);
  for (int i = 0; i < 1000 && !gone.load(); ++i) absl::SleepFor(absl::Milliseconds(5));
  REQUIRE(gone.load());
  absl::SleepFor(absl::Milliseconds(100));
  CHECK(after_leave.load() == 0);
  CHECK(timer.members() == 1);
  timer.Leave(&leaver);
}

TEST_CASE("a thousand members passing every 100 ms on a 5 ms grid share the timer's wake-ups",
          "[channel_timer]") {
  constexpr int kMembers = 1000;
  const absl::Duration every = absl::Milliseconds(100);
  const absl::Duration grid = ChannelTimer::KeepaliveGrid(every);
  CHECK(grid == absl::Milliseconds(5));
  ChannelTimer timer;
  std::vector<std::unique_ptr<Counting>> members;
  const absl::Time start = MonotonicNow();
  for (int i = 0; i < kMembers; ++i) {
    members.push_back(std::make_unique<Counting>(every, grid));
    // Joined at scattered moments, first passes on the grid.
    timer.Join(members.back().get(),
               ChannelTimer::OnGrid(start + absl::Microseconds(97 * i), grid));
  }
  const uint64_t rounds_before = timer.rounds();
  const absl::Time measured_from = MonotonicNow();
  absl::SleepFor(absl::Seconds(1));
  const uint64_t rounds = timer.rounds() - rounds_before;
  const double elapsed_ms = absl::ToDoubleMilliseconds(MonotonicNow() - measured_from);
  for (auto& member : members) timer.Leave(member.get());
  int passes = 0;
  for (auto& member : members) passes += member->passes.load();
  INFO(passes << " passes in " << rounds << " rounds over " << elapsed_ms << " ms");
  CHECK(passes >= kMembers * 5);  // about ten each; at least half on a loaded host
  // One round per grid point at most (and one more at each end), not one per member's pass.
  CHECK(rounds <= elapsed_ms / 5 + 2);
}

TEST_CASE("OnGrid rounds up to the grid", "[channel_timer]") {
  const absl::Duration grid = absl::Milliseconds(50);
  const absl::Time base = absl::FromUnixNanos(1'000'000'000);
  CHECK(ChannelTimer::OnGrid(base, grid) == base);
  CHECK(ChannelTimer::OnGrid(base + absl::Nanoseconds(1), grid) == base + grid);
  CHECK(ChannelTimer::OnGrid(base + absl::Milliseconds(49), grid) == base + grid);
  CHECK(ChannelTimer::OnGrid(base, absl::ZeroDuration()) == base);
  CHECK(ChannelTimer::OnGrid(absl::InfiniteFuture(), grid) == absl::InfiniteFuture());
  CHECK(ChannelTimer::KeepaliveGrid(absl::Seconds(1)) == absl::Milliseconds(50));
  CHECK(ChannelTimer::KeepaliveGrid(absl::Seconds(10)) == absl::Milliseconds(50));
}
