// Credit accounting on the host: the reserved credit, piggybacked and explicit returns, refusal of
// a peer that returns more than it was given, and a simulated pair of peers that never deadlocks.
#include "transport/credits.h"

#include <catch2/catch.hpp>
#include <deque>

using zrpc::transport::CreditAccount;

TEST_CASE("data keeps one credit in reserve for credit frames", "[credits]") {
  CreditAccount account(/*peer_window=*/4, /*own_window=*/4);
  CHECK(account.TrySpendForData());
  CHECK(account.TrySpendForData());
  CHECK(account.TrySpendForData());
  CHECK_FALSE(account.TrySpendForData());  // the last credit is reserved
  CHECK(account.in_flight() == 3);
  CHECK(account.TrySpendForUpdate());
  CHECK_FALSE(account.TrySpendForUpdate());
  REQUIRE(account.OnReturned(4).ok());
  CHECK(account.available() == 4);
}

TEST_CASE("a peer returning credits it was never given is a protocol error", "[credits]") {
  CreditAccount account(8, 8);
  CHECK(account.OnReturned(1).code() == absl::StatusCode::kFailedPrecondition);
  REQUIRE(account.TrySpendForData());
  CHECK(account.OnReturned(2).code() == absl::StatusCode::kFailedPrecondition);
  CHECK(account.OnReturned(1).ok());
  CHECK(account.available() == 8);
}

TEST_CASE("owed credits ride on frames, and a credit frame is due at half the window",
          "[credits]") {
  CreditAccount account(8, 8);
  for (int i = 0; i < 3; ++i) account.OnDataRecvReposted();
  CHECK_FALSE(account.ShouldSendUpdate());
  account.OnDataRecvReposted();
  CHECK(account.ShouldSendUpdate());
  // RECVs consumed by credit frames make one due only when half a window of them is owed.
  CreditAccount idle(8, 8);
  for (int i = 0; i < 3; ++i) idle.OnUpdateRecvReposted();
  CHECK_FALSE(idle.ShouldSendUpdate());
  idle.OnUpdateRecvReposted();
  CHECK(idle.ShouldSendUpdate());
  for (int i = 0; i < 96; ++i) idle.OnUpdateRecvReposted();
  CHECK(idle.TakeOwed() == 100);
  CHECK(idle.owed() == 0);
  CHECK(account.TakeOwed() == 4);
  CHECK_FALSE(account.ShouldSendUpdate());
}

TEST_CASE("more owed credits than a frame field holds are returned over several frames",
          "[credits]") {
  CreditAccount account(4, 200000);
  for (int i = 0; i < 70000; ++i) account.OnDataRecvReposted();
  CHECK(account.TakeOwed() == 65535);
  CHECK(account.TakeOwed() == 70000 - 65535);
  CHECK(account.TakeOwed() == 0);
}

TEST_CASE("a peer sending beyond the credits it was given is a protocol error", "[credits]") {
  CreditAccount account(/*peer_window=*/8, /*own_window=*/4);
  for (int i = 0; i < 4; ++i) REQUIRE(account.OnConsumed().ok());  // its initial window
  // Its RECVs were re-posted at once, but no credit has gone back yet: the fifth is too many.
  for (int i = 0; i < 4; ++i) account.OnDataRecvReposted();
  absl::Status s = account.OnConsumed();
  CHECK(s.code() == absl::StatusCode::kFailedPrecondition);
  CHECK(s.message().find("beyond its credits") != absl::string_view::npos);

  CreditAccount returned(8, 4);
  for (int i = 0; i < 4; ++i) REQUIRE(returned.OnConsumed().ok());
  for (int i = 0; i < 4; ++i) returned.OnDataRecvReposted();
  REQUIRE(returned.TakeOwed() == 4);  // sent back in a frame: four more may come
  for (int i = 0; i < 4; ++i) CHECK(returned.OnConsumed().ok());
  CHECK_FALSE(returned.OnConsumed().ok());
}

namespace {
// Two peers joined by in-order queues. Each wants to send `want` data frames; a received frame
// is consumed (its RECV re-posted) right away. Credit frames are sent only when ShouldSendUpdate
// says so. Returns whether both finished: a deadlock leaves data unsent with nothing in flight.
struct Peer {
  CreditAccount credits;
  int to_send;
  bool bulk;               // sends bulk writes: they consume credits but carry no credits back
  std::deque<bool> inbox;  // true: data frame, false: credit frame; each carries returned credits
  std::deque<uint16_t> returned;
};

bool RunPair(uint32_t window, int want_a, int want_b, bool a_bulk = false, bool b_bulk = false) {
  Peer a{CreditAccount(window, window), want_a, a_bulk, {}, {}};
  Peer b{CreditAccount(window, window), want_b, b_bulk, {}, {}};
  for (int step = 0; step < 1000000; ++step) {
    bool moved = false;
    for (auto [self, other] : {std::pair{&a, &b}, std::pair{&b, &a}}) {
      if (self->to_send > 0 && self->credits.TrySpendForData()) {
        other->inbox.push_back(true);
        other->returned.push_back(self->bulk ? 0 : self->credits.TakeOwed());
        --self->to_send;
        moved = true;
      } else if (self->credits.ShouldSendUpdate() && self->credits.TrySpendForUpdate()) {
        other->inbox.push_back(false);
        other->returned.push_back(self->credits.TakeOwed());
        moved = true;
      }
      if (!self->inbox.empty()) {
        bool data = self->inbox.front();
        self->inbox.pop_front();
        // Honest peers never trip the receive-side check, whatever the traffic pattern.
        if (!self->credits.OnConsumed().ok()) return false;
        if (!self->credits.OnReturned(self->returned.front()).ok()) return false;
        self->returned.pop_front();
        if (data) {
          self->credits.OnDataRecvReposted();
        } else {
          self->credits.OnUpdateRecvReposted();
        }
        moved = true;
      }
    }
    if (a.to_send == 0 && b.to_send == 0) return true;
    if (!moved) return false;
  }
  return false;
}
}  // namespace

TEST_CASE("two peers exchanging data one way or both ways never deadlock on credits", "[credits]") {
  for (uint32_t window : {4u, 5u, 8u, 64u}) {
    INFO("window " << window);
    CHECK(RunPair(window, 10000, 0));
    CHECK(RunPair(window, 0, 10000));
    CHECK(RunPair(window, 10000, 10000));
    CHECK(RunPair(window, 10000, 37));
    // A side that only writes bulk payloads returns credits in credit frames alone.
    CHECK(RunPair(window, 10000, 0, /*a_bulk=*/true));
    CHECK(RunPair(window, 10000, 10000, /*a_bulk=*/true, /*b_bulk=*/true));
    CHECK(RunPair(window, 10000, 500, /*a_bulk=*/true));
  }
}
