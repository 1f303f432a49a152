// IdleSince (rpc/server/idle_since.h): a connection is idle from the first look that finds it
// holding no calls, however late that look comes.
#include "rpc/server/idle_since.h"

#include <catch2/catch.hpp>

#include "absl/time/time.h"

namespace {

using zrpc::internal::IdleSince;

const absl::Time kStart = absl::FromUnixSeconds(1000);

absl::Time At(int ms) { return kStart + absl::Milliseconds(ms); }

// Before: idle counted from the last look that found calls, so a sweeper 2 s late found a client
// whose call had just been answered idle for 2 s, and probed it (hostile_peer_test, under ASan).
TEST_CASE("a late look after a call ended finds the connection just gone idle", "[idle_since]") {
  IdleSince idle;
  idle.Heard(At(0));  // the request
  CHECK(idle.Look(At(100), true) == absl::ZeroDuration());
  // The call ends unseen; the next look comes 2 s late.
  CHECK(idle.Look(At(2100), false) == absl::ZeroDuration());
  CHECK(idle.Look(At(2700), false) == absl::Milliseconds(600));
}

TEST_CASE("idle counts from the last word when no call was seen", "[idle_since]") {
  IdleSince idle;
  idle.Heard(At(0));
  CHECK(idle.Look(At(300), false) == absl::Milliseconds(300));
  CHECK(idle.Look(At(900), false) == absl::Milliseconds(900));
  // A word restarts it; a look holding calls keeps it at zero.
  idle.Heard(At(1000));
  CHECK(idle.Look(At(1200), false) == absl::Milliseconds(200));
  CHECK(idle.Look(At(1300), true) == absl::ZeroDuration());
  CHECK(idle.Look(At(5000), true) == absl::ZeroDuration());
  CHECK(idle.Look(At(5100), false) == absl::ZeroDuration());
  CHECK(idle.Look(At(5400), false) == absl::Milliseconds(300));
}

}  // namespace
