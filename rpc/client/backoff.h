// ReconnectBackoff: how long a subchannel waits before its next connection attempt after failed
// ones. Exponential with jitter: after the n-th failure in a row the delay is
// d = min(max, initial * 2^(n-1)), and the next attempt may start after a time drawn uniformly
// from [d/2, d]. So a client facing a dead server neither spins nor gives up, and clients
// restarted together do not retry in lockstep (each backoff draws from a generator of its own,
// seeded from std::random_device).
//
// Not thread-safe: its owner (a Subchannel) guards it with its own lock.
#ifndef ZRPC_RPC_CLIENT_BACKOFF_H_
#define ZRPC_RPC_CLIENT_BACKOFF_H_

#include <algorithm>
#include <cstdint>
#include <random>

#include "absl/time/time.h"

namespace zrpc::internal {

class ReconnectBackoff {
 public:
  ReconnectBackoff(absl::Duration initial, absl::Duration max) : initial_(initial), max_(max) {}

  // An attempt failed at `now` (monotonic): returns when the next one may start.
  absl::Time Failed(absl::Time now) {
    ++failures_;
    delay_ =
        std::min(max_, initial_ * static_cast<double>(uint64_t{1} << std::min(failures_ - 1, 30)));
    const double jitter = std::uniform_real_distribution<double>(0.5, 1.0)(random_);
    return now + delay_ * jitter;
  }
  // An attempt succeeded: the next failure starts from `initial` again.
  void Succeeded() {
    failures_ = 0;
    delay_ = absl::ZeroDuration();
  }
  // When a connection that was lost at `now` may be made again in the background: after a time
  // drawn from [initial/2, initial], so that a channel's connections lost together (their
  // server restarted) do not all knock at once. Calls still connect at once when none is open.
  absl::Time AfterLoss(absl::Time now) {
    return now + initial_ * std::uniform_real_distribution<double>(0.5, 1.0)(random_);
  }
  // The current delay d (zero when not failing): ChannelStats::backoff.
  absl::Duration delay() const { return delay_; }

 private:
  const absl::Duration initial_;
  const absl::Duration max_;
  int failures_ = 0;
  absl::Duration delay_ = absl::ZeroDuration();
  std::mt19937_64 random_{std::random_device{}()};
};

}  // namespace zrpc::internal

#endif  // ZRPC_RPC_CLIENT_BACKOFF_H_
