// IdleSince: how long a server's connection has been idle, as its sweeper sees it
// (ServerConnection::SweepPass; ServerOptions::idle_probe_interval and max_connection_idle).
//
// The sweeper looks at a connection now and then; between two looks it knows nothing. A
// connection is idle from the first look that finds it holding no calls (and nothing arriving):
// not from the last look that found it holding some, which may be long before when the sweeper
// ran late (a loaded host). Counting from that older look made a client whose long call had just
// been answered look idle for as long as the sweeper had been late, and get probed (or, with
// max_connection_idle, closed) at once: hostile_peer_test saw an idle probe right after a 1.5 s
// call, under ASan beside three other device tests, where idle_probe_interval was 600 ms.
//
// Not thread-safe: the sweeper's thread alone uses it.
#ifndef ZRPC_RPC_SERVER_IDLE_SINCE_H_
#define ZRPC_RPC_SERVER_IDLE_SINCE_H_

#include "absl/time/time.h"

namespace zrpc::internal {

class IdleSince {
 public:
  // Something arrived (a message or a payload), seen at `now`: not idle before it.
  void Heard(absl::Time now) { since_ = now; }
  // A look at `now`: whether the connection holds calls. Returns how long it has been idle
  // (zero while it holds calls, and at the first look that finds none).
  absl::Duration Look(absl::Time now, bool holds_calls) {
    if (holds_calls) {
      since_ = kHolding;
      return absl::ZeroDuration();
    }
    if (since_ == kHolding) since_ = now;
    return now - since_;
  }

 private:
  // The last look found calls: idle from the next look that finds none.
  static constexpr absl::Time kHolding = absl::InfiniteFuture();
  absl::Time since_ = absl::InfinitePast();
};

}  // namespace zrpc::internal

#endif  // ZRPC_RPC_SERVER_IDLE_SINCE_H_
