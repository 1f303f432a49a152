// ChannelTimer: the thread that runs channels' timer passes (deadlines, keepalives).
//
// A channel's calls end at their deadlines and its connections are checked (keepalive.h) by
// passes of a timer. A channel on its own pollers has a timer of its own; the channels of a
// poller group (ChannelOptions::poller_group) share their group's, so that a client of a
// thousand servers runs one timer thread, not a thousand, each waking every keepalive_interval
// (300 ms) for its keepalive pass. A member's pass runs when the time it asked for comes (its
// keepalive pass) or when one of its calls asks for an earlier look (WakeBy: a deadline). Members
// ask for their keepalive passes on a coarse grid (KeepaliveGrid), so that members joined at any
// moment share the timer's wake-ups: at most 1 / grid of them a second for keepalives, however many
// members.
//
// Threads. Passes run on the timer's thread, one at a time, outside its lock: they run user
// callbacks (a deadline's), which may start calls (WakeBy) or destroy other channels. Leave
// waits for a pass of that member under way, so it must not be called from that member's own
// pass (a channel destroyed from a callback on any runtime thread, this one included, is torn
// down by the reaper thread: channel.h); from another thread it waits at most for the pass under
// way. A pass that blocks holds up every member's (THREADING.md). The timer is destroyed after its
// last member left, never on its own thread (its owner, a channel or a poller group, is released
// by channels, which are not destroyed on runtime threads).
#ifndef ZRPC_RPC_CLIENT_CHANNEL_TIMER_H_
#define ZRPC_RPC_CLIENT_CHANNEL_TIMER_H_

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <limits>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/time/time.h"

namespace zrpc::internal {

class ChannelTimer {
 public:
  class Member {
   public:
    virtual ~Member() = default;
    // One pass at `now` (monotonic), on the timer's thread. Returns when the member wants its
    // next pass (monotonic; InfiniteFuture: only when WakeBy asks).
    virtual absl::Time TimerPass(absl::Time now) = 0;

    // A pass by `at` (monotonic) at the latest: a call's deadline. One atomic load when a pass
    // that early is asked for already (the common case). Any thread, once joined.
    void WakeBy(absl::Time at);

   private:
    friend class ChannelTimer;
    static constexpr int64_t kNever = std::numeric_limits<int64_t>::max();
    ChannelTimer* timer_ = nullptr;
    // The earliest WakeBy since its last pass began (unix nanoseconds of the monotonic time).
    std::atomic<int64_t> wake_at_{kNever};
    absl::Time next_ = absl::InfiniteFuture();  // what its last pass asked for; under mu_
    bool running_ = false;                      // its pass runs now; under mu_
  };

  // Starts the thread.
  ChannelTimer();
  // Stops and joins the thread. Every member must have left.
  ~ChannelTimer();
  ChannelTimer(const ChannelTimer&) = delete;
  ChannelTimer& operator=(const ChannelTimer&) = delete;

  // Runs `member`'s passes from now on, the first at `first` (monotonic).
  void Join(Member* member, absl::Time first);
  // No pass of `member` runs after this returns: it waits for one under way (see the top).
  void Leave(Member* member);

  // The grid keepalive passes are asked for on, for a member passing every `interval`: a
  // twentieth of it, at most 50 ms.
  static absl::Duration KeepaliveGrid(absl::Duration interval) {
    return std::min(interval / 20, absl::Milliseconds(50));
  }
  // `t` rounded up to the grid (monotonic times are absl::Times from a fixed origin).
  static absl::Time OnGrid(absl::Time t, absl::Duration grid);

  size_t members() const;
  // Rounds the loop ran (each a wake-up that found passes due): for tests.
  uint64_t rounds() const;

 private:
  void Loop();
  void Wake(int64_t at);

  mutable std::mutex mu_;
  std::condition_variable cv_;        // the loop's wait: an earlier time, a member, stop
  std::condition_variable left_cv_;   // a pass ended (Leave waits for its member's)
  std::vector<Member*> members_;      // under mu_
  std::vector<Member*> due_;          // the loop's current round; under mu_ (Leave prunes it)
  int64_t wake_at_ = Member::kNever;  // what the loop sleeps until; under mu_
  bool stop_ = false;                 // under mu_
  uint64_t rounds_ = 0;               // under mu_
  std::thread thread_;
};

}  // namespace zrpc::internal

#endif  // ZRPC_RPC_CLIENT_CHANNEL_TIMER_H_
