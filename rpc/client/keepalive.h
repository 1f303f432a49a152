// KeepaliveSchedule: when the channel's timer checks one connection's server (a ping, or a probe
// of its NIC when a ping would wait behind the connection's own traffic: client_connection.h).
//
// Two rates, because the two cases cost and buy different things.
//  - A connection with work in flight (calls, streams, queued requests, payloads moving), or one
//    whose calls ended at their deadlines since the last pass without an answer, has a caller
//    waiting on the server, or had one. It is checked as soon as a whole keepalive pass
//    (ChannelOptions::keepalive_interval, 300 ms) went by with nothing received, so a dead server
//    fails its calls within about interval + timeout, and a hung one whose calls all time out
//    between two passes is noticed as fast.
//  - An idle connection has nobody waiting. It is checked once nothing was received for
//    idle_keepalive_interval (20 s), drawn anew each time from [3/4, 1] of it; a connection's
//    first check comes anywhere in (0, 1] of it. So connections made together (a client
//    starting, a reconnect storm after a server restart) never ping in lockstep: simulated, ten
//    thousand made at once check at most about 1.6 times the mean number per pass from the
//    first round on (with [3/4, 1] alone, 4 times the mean for a minute: keepalive_test). Its point
//    is to drop a connection to a vanished server before the next call meets it, and to show the
//    server a word now and then (so it need not probe this side: ServerOptions::
//    idle_probe_interval).
//    Connections whose work ends together start their idle schedules together; the jitter
//    spreads them within a few rounds.
// A pass checks at most IdleChecksPerPass idle connections of a channel (256 a second), and every
// busy one, so
// no number of idle connections delays a busy one's check. The next pass starts where the last
// one ran out (IdleCheckCursor), so the idle connections left over are served first, round robin:
// were every pass to start at the same connection, those at the front, rescheduled and due again
// first, would take every check, and the rest would never be checked. With a thousand idle
// connections a server answers 50 pings a second from them, not 500 (issue 35: every idle
// connection pinging on every other pass collapsed a server between 1,000 and 2,500 connections).
//
// A server may ask for a longer idle interval (ServerOptions::idle_keepalive_budget: its accept
// reply and its answers to pings carry one, from how many connections it holds): a connection
// then waits for the longer of the two, at most the channel's max_idle_keepalive_interval. So a
// connection's first check is drawn from the interval its accept reply asked for. An answer is a
// word heard, so the schedule restarts from it with the server's interval in force.
//
// A check that goes out is rescheduled [3/4, 1] of an idle interval on, whether or not an answer
// comes: a probe (which the server's NIC answers, not its process) moves no received count, and a
// ping that times out closes the connection anyway. Anything received resets the schedule.
//
// Not thread-safe: the channel's timer thread alone calls it.
#ifndef ZRPC_RPC_CLIENT_KEEPALIVE_H_
#define ZRPC_RPC_CLIENT_KEEPALIVE_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "absl/time/time.h"

namespace zrpc {
class MethodMetrics;
}  // namespace zrpc

namespace zrpc::internal {

// What a pass of the channel's timer brings to each connection's Keepalive.
struct KeepalivePass {
  absl::Time now;                // monotonic
  absl::Duration timeout;        // ChannelOptions::keepalive_timeout: a ping's deadline
  absl::Duration idle_interval;  // zero: idle connections are never checked
  MethodMetrics* metrics;        // the pings' (zrpc.Keepalive/Ping), or null
  int idle_checks_left;          // this pass's allowance of idle checks, spent as they go
  bool denied = false;           // an idle connection was due and found none left
  // ChannelOptions::max_idle_keepalive_interval: the most a server's advice may stretch
  // idle_interval to.
  absl::Duration max_idle_interval = absl::InfiniteDuration();
};

// Where a channel's keepalive pass starts among its connections: where the last pass first
// denied an idle check, else where the last one started. Timer thread only.
class IdleCheckCursor {
 public:
  // The index to start a pass over `n` connections at.
  size_t Start(size_t n) const { return n == 0 ? 0 : next_ % n; }
  // After connection `index`'s Keepalive: `pass` says whether it was the first denied.
  void After(const KeepalivePass& pass, size_t index) {
    if (pass.denied && !seen_denied_) {
      seen_denied_ = true;
      next_ = index;
    }
  }
  // The pass is over (started at `start`).
  void EndPass(size_t start) {
    if (!seen_denied_) next_ = start;
    seen_denied_ = false;
  }

 private:
  size_t next_ = 0;
  bool seen_denied_ = false;
};

class KeepaliveSchedule {
 public:
  // A channel checks at most this many idle connections a second, whatever its
  // keepalive_interval: IdleChecksPerPass(interval) a pass.
  static constexpr int kIdleChecksPerSecond = 256;
  static int IdleChecksPerPass(absl::Duration interval) {
    const double per_pass = kIdleChecksPerSecond * absl::ToDoubleSeconds(interval);
    return per_pass < 1                           ? 1
           : per_pass > kIdleChecksPerSecond * 60 ? kIdleChecksPerSecond * 60
                                                  : static_cast<int>(per_pass);
  }

  // `seed` draws the jitter (any value; connections of a channel should differ); `now`, the
  // connection's start, counts as its last word heard.
  KeepaliveSchedule(uint64_t seed, absl::Time now) : random_(seed), heard_at_(now) {}

  // One pass of the timer. `received`: how many messages the connection received so far.
  // `busy`: it has work in flight other than a ping, or calls ended at their deadlines since the
  // last pass. `ping_out`: a ping is out (its answer or its
  // deadline decides; nothing is due meanwhile). `server_interval`: the idle interval the server
  // asked for in its accept reply or its last answer to a ping (zero: none). Returns whether to
  // check the server now; an idle check spends one of `pass.idle_checks_left`.
  bool Due(KeepalivePass& pass, uint64_t received, bool busy, bool ping_out,
           absl::Duration server_interval = absl::ZeroDuration()) {
    if (received != received_) {
      received_ = received;
      heard_at_ = pass.now;
      idle_due_ = absl::InfiniteFuture();
      return false;
    }
    if (ping_out) return false;
    if (busy) {
      // Nothing since the last pass, a keepalive interval ago. Going idle later starts the idle
      // schedule from the last word heard.
      idle_due_ = absl::InfiniteFuture();
      return true;
    }
    if (pass.idle_interval <= absl::ZeroDuration()) return false;
    const absl::Duration interval = IdleInterval(pass, server_interval);
    if (idle_due_ == absl::InfiniteFuture()) {
      idle_due_ = heard_at_ + (first_ ? interval * (1.0 - Unit()) : Jittered(interval));
      first_ = false;
    }
    if (pass.now < idle_due_) return false;
    if (pass.idle_checks_left <= 0) {
      pass.denied = true;
      return false;
    }
    --pass.idle_checks_left;
    idle_due_ = pass.now + Jittered(interval);
    return true;
  }

  // The idle interval in force: the channel's, or the server's when it asked for longer, at most
  // the channel's ceiling (never below the channel's own).
  static absl::Duration IdleInterval(const KeepalivePass& pass, absl::Duration server_interval) {
    return std::max(pass.idle_interval, std::min(server_interval, pass.max_idle_interval));
  }

  // The check Due asked for could not go (every send slot taken): due again on the next pass,
  // and an idle one's check goes back to the pass.
  void NotChecked(KeepalivePass& pass) {
    if (idle_due_ == absl::InfiniteFuture()) return;  // a busy connection's
    idle_due_ = pass.now;
    ++pass.idle_checks_left;
  }

  // When the next idle check is due (InfiniteFuture when none is scheduled): for tests.
  absl::Time idle_due() const { return idle_due_; }

 private:
  // `interval` times a factor drawn uniformly from (3/4, 1].
  absl::Duration Jittered(absl::Duration interval) { return interval * (1.0 - Unit() / 4); }
  // Uniform in [0, 1) (splitmix64: eight bytes of state per connection; the spread needs no
  // better).
  double Unit() {
    random_ += 0x9e3779b97f4a7c15u;
    uint64_t z = random_;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9u;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebu;
    z ^= z >> 31;
    return static_cast<double>(z >> 11) * 0x1.0p-53;
  }

  uint64_t random_;
  uint64_t received_ = 0;
  absl::Time heard_at_;
  absl::Time idle_due_ = absl::InfiniteFuture();
  bool first_ = true;  // no idle check was scheduled yet
};

}  // namespace zrpc::internal

#endif  // ZRPC_RPC_CLIENT_KEEPALIVE_H_
