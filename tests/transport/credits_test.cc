// Credit accounting on the host: the reserved credit, piggybacked and explicit returns, refusal of
// a peer that returns more than it was given, elastic windows over a shared budget, and simulated
// peers that never deadlock, never overrun and never claim more than the budget has.
#include "transport/credits.h"

#include <catch2/catch.hpp>
#include <cstdint>
#include <deque>
#include <memory>
#include <vector>

using zrpc::transport::CreditAccount;
using zrpc::transport::OwnWindow;
using zrpc::transport::ReceiveBudget;
using zrpc::transport::ReceiveShare;

namespace {
// What a poller does at admission: takes the floor from the budget and opens the share with it.
void Admit(ReceiveBudget& budget, ReceiveShare& share, uint32_t floor) {
  REQUIRE(budget.TakeFloor(floor));
  share.Open(&budget, floor);
}
}  // namespace

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
  for (int i = 0; i < 3; ++i) account.OnRecvReposted();
  CHECK_FALSE(account.ShouldSendUpdate());
  account.OnRecvReposted();
  CHECK(account.ShouldSendUpdate());
  // RECVs consumed by data and by credit frames count alike: four of either make half a window.
  CreditAccount mixed(8, 8);
  mixed.OnRecvReposted();
  mixed.OnRecvReposted();
  mixed.OnRecvReposted();
  CHECK_FALSE(mixed.ShouldSendUpdate());
  mixed.OnRecvReposted();
  CHECK(mixed.ShouldSendUpdate());
  // The smallest window's frame is due at two: a frame returning one would cost what it returns,
  // and two idle peers would bounce it forever.
  CreditAccount smallest(3, 3);
  smallest.OnRecvReposted();
  CHECK_FALSE(smallest.ShouldSendUpdate());
  smallest.OnRecvReposted();
  CHECK(smallest.ShouldSendUpdate());
  CreditAccount idle(8, 8);
  for (int i = 0; i < 3; ++i) idle.OnRecvReposted();
  CHECK_FALSE(idle.ShouldSendUpdate());
  idle.OnRecvReposted();
  CHECK(idle.ShouldSendUpdate());
  for (int i = 0; i < 96; ++i) idle.OnRecvReposted();
  CHECK(idle.TakeOwed() == 100);
  CHECK(idle.owed() == 0);
  CHECK(account.TakeOwed() == 4);
  CHECK_FALSE(account.ShouldSendUpdate());
}

TEST_CASE("more owed credits than a frame field holds are returned over several frames",
          "[credits]") {
  CreditAccount account(4, 200000);
  for (int i = 0; i < 70000; ++i) account.OnRecvReposted();
  CHECK(account.TakeOwed() == 65535);
  CHECK(account.TakeOwed() == 70000 - 65535);
  CHECK(account.TakeOwed() == 0);
}

TEST_CASE("a peer sending beyond the credits it was given is a protocol error", "[credits]") {
  CreditAccount account(/*peer_window=*/8, /*own_window=*/4);
  for (int i = 0; i < 4; ++i) REQUIRE(account.OnConsumed().ok());  // its initial window
  // Its RECVs were re-posted at once, but no credit has gone back yet: the fifth is too many.
  for (int i = 0; i < 4; ++i) account.OnRecvReposted();
  absl::Status s = account.OnConsumed();
  CHECK(s.code() == absl::StatusCode::kFailedPrecondition);
  CHECK(s.message().find("beyond its credits") != absl::string_view::npos);

  CreditAccount returned(8, 4);
  for (int i = 0; i < 4; ++i) REQUIRE(returned.OnConsumed().ok());
  for (int i = 0; i < 4; ++i) returned.OnRecvReposted();
  REQUIRE(returned.TakeOwed() == 4);  // sent back in a frame: four more may come
  for (int i = 0; i < 4; ++i) CHECK(returned.OnConsumed().ok());
  CHECK_FALSE(returned.OnConsumed().ok());
}

TEST_CASE("an elastic window grows when its peer runs low and shrinks back to its floor",
          "[credits]") {
  ReceiveBudget budget(400);  // 300 back floors, 100 growth
  ReceiveShare share;
  Admit(budget, share, 3);
  CreditAccount account(8, 8, OwnWindow{3, 32, &share});
  CHECK(account.window() == 3);
  REQUIRE(account.OnConsumed().ok());
  CHECK(account.window() == 3);  // the peer still holds two: enough for data
  REQUIRE(account.OnConsumed().ok());
  // One left: the window grows from the budget, and the new credit is owed at once.
  CHECK(account.window() == 4);
  CHECK(account.owed() == 1);
  REQUIRE(account.OnConsumed().ok());
  CHECK(account.window() == 5);
  CHECK(budget.claimed() == 5);
  CHECK(share.held() == 5);
  // Released while the peer is short: owed, not kept back; all of it is due in a credit frame.
  for (int i = 0; i < 3; ++i) account.OnRecvReposted();
  CHECK(account.window() == 5);
  CHECK(account.ShouldSendUpdate());
  CHECK(account.TakeOwed() == 5);
  // One message at a time, answered after its release: the window stays (no growth, no
  // shrinking, nothing taken from or given to the budget at each call).
  for (int i = 0; i < 10; ++i) {
    REQUIRE(account.OnConsumed().ok());
    account.OnRecvReposted();
    account.TakeOwed();
  }
  CHECK(account.window() == 5);
  // A peer that sends in bursts, spending every credit it may each time, grows its window; sending
  // one at a time afterwards, it leaves most of it unused, and each release gives a receive back
  // down to two plus half the window.
  ReceiveShare wide_share;
  Admit(budget, wide_share, 3);
  CreditAccount wide(8, 8, OwnWindow{3, 32, &wide_share});
  uint32_t peer = 3;  // the credits in the peer's hands (none on the wire here)
  auto send = [&] {
    --peer;
    REQUIRE(wide.OnConsumed().ok());
  };
  for (int burst = 0; burst < 20; ++burst) {
    uint32_t held = 0;
    for (; peer >= 2; ++held) send();
    for (; held > 0; --held) wide.OnRecvReposted();
    peer += wide.TakeOwed();
  }
  CHECK(wide.window() == 32);
  CHECK(budget.claimed() == 5 + 32);
  for (int i = 0; i < 40; ++i) {
    send();
    wide.OnRecvReposted();
    peer += wide.TakeOwed();
  }
  CHECK(wide.window() == 5);
  CHECK(budget.claimed() == 5 + 5);
  // Up to the ceiling and no further; growth takes only from its own pool, never from what backs
  // floors.
  ReceiveBudget pools(200);  // 150 back floors, 50 growth; low under 13 free
  ReceiveShare greedy;
  Admit(pools, greedy, 3);
  CreditAccount busy(8, 8, OwnWindow{3, 32, &greedy});
  // A peer that spends every credit it has each round, its messages released together.
  auto round = [](CreditAccount& account) {
    const uint32_t spend = account.window() - static_cast<uint32_t>(account.owed());
    for (uint32_t i = 0; i < spend; ++i) REQUIRE(account.OnConsumed().ok());
    for (uint32_t i = 0; i < spend; ++i) account.OnRecvReposted();
    account.TakeOwed();
  };
  for (int i = 0; i < 10; ++i) round(busy);
  CHECK(busy.window() == 32);
  CHECK(busy.max_window() == 32);
  CHECK(pools.claimed() == 32);
  CHECK(pools.growth_free() == 50 - 29);
  ReceiveShare other;
  Admit(pools, other, 3);
  CreditAccount second(8, 8, OwnWindow{3, 32, &other});
  for (int i = 0; i < 10; ++i) {
    round(second);
    CHECK(pools.growth_free() >= 0);
    CHECK(pools.claimed() == busy.window() + second.window());
  }
  CHECK(second.window() > 3);
  CHECK(second.window() <= 3 + 21);  // what growth had left
  // Every floor the pool promised still fits beside the grown windows.
  for (int i = 0; i < 48; ++i) CHECK(pools.TakeFloor(3));
  CHECK_FALSE(pools.TakeFloor(3));
  // Growth low (under a quarter of its pool free): a release shrinks a window above its floor
  // whatever its peer does.
  while (!pools.low()) REQUIRE(pools.TakeGrowth(1) == 1);
  const int64_t free_before = pools.growth_free();
  const uint32_t window_before = busy.window();
  REQUIRE(busy.OnConsumed().ok());
  busy.OnRecvReposted();
  CHECK(busy.window() == window_before - 1);
  CHECK(pools.growth_free() == free_before + 1);
}

TEST_CASE("a share gives back everything it holds once, and takes nothing after Close",
          "[credits]") {
  ReceiveBudget budget(64);
  ReceiveShare share;
  Admit(budget, share, 4);
  CHECK(share.Grow(10) == 10);
  CHECK(share.GiveOne());
  CHECK(budget.claimed() == 13);
  share.Close();
  CHECK(budget.claimed() == 0);
  CHECK(share.Grow(10) == 0);
  CHECK_FALSE(share.GiveOne());
  CHECK(budget.claimed() == 0);
  // An account whose share was closed keeps its window to itself, and the budget stays whole.
  ReceiveShare closed;
  Admit(budget, closed, 3);
  CreditAccount account(8, 8, OwnWindow{3, 32, &closed});
  closed.Close();
  for (int i = 0; i < 20; ++i) {
    REQUIRE(account.OnConsumed().ok());
    account.OnRecvReposted();
    account.TakeOwed();
  }
  CHECK(budget.claimed() == 0);
}

TEST_CASE("a peer may be granted past its initial window up to the maximum its Hello names",
          "[credits]") {
  CreditAccount account(/*peer_window=*/3, /*peer_max=*/32, OwnWindow{});
  REQUIRE(account.OnReturned(29).ok());
  CHECK(account.available() == 32);
  CHECK(account.OnReturned(1).code() == absl::StatusCode::kFailedPrecondition);
  REQUIRE(account.TrySpendForData());
  CHECK(account.in_flight() == 1);
  REQUIRE(account.OnReturned(1).ok());
  CHECK(account.in_flight() == 0);
}

namespace {
// Connections of two sides each, joined by in-order queues, every server side's window elastic
// over one budget (or fixed), driven by a seeded random schedule: each side sends `want` data
// frames (or bulk writes, which carry no credits back), the application releases a held message
// at random, and credit frames go only when ShouldSendUpdate says so. After every step the
// accounting must balance exactly, for each direction: the receiver's window equals the
// sender's credits, its messages and returned credits on the wire, and what the receiver holds
// and owes; and the windows' claims equal what the budget lent. Returns whether every side
// finished and the links then fell quiet: a deadlock leaves data unsent with nothing in flight,
// and a bouncing exchange of credit frames never stops.
struct Frame {
  bool data;
  uint32_t returned;
};
struct Side {
  std::unique_ptr<ReceiveShare> share;
  CreditAccount credits{3, 3};
  int to_send = 0;
  bool bulk = false;
  std::deque<Frame> inbox;  // from the other side, in order
  uint32_t held = 0;        // data messages received and not released yet
  uint64_t credit_frames = 0;
};
struct Link {
  Side a, b;  // a: the client (fixed window); b: the server (elastic when a budget is given)
};

struct Model {
  uint32_t window = 8;                // a's fixed window, b's ceiling
  uint32_t floor = 3;                 // b's floor (elastic)
  ReceiveBudget* budget = nullptr;    // b's (the servers'); null: fixed windows
  ReceiveBudget* budget_a = nullptr;  // a's (the clients'), for elastic against elastic
  int links = 1;
  int want_a = 1000, want_b = 1000;
  bool a_bulk = false, b_bulk = false;
  uint32_t release_one_in = 1;  // a held message is released with probability 1/release_one_in
  uint64_t seed = 1;
};

uint64_t Next(uint64_t& x) {
  x ^= x << 13, x ^= x >> 7, x ^= x << 17;
  return x;
}

bool Balanced(const Side& sender, const Side& receiver) {
  uint64_t on_wire_to_receiver = receiver.inbox.size();
  uint64_t returned_to_sender = 0;
  for (const Frame& f : sender.inbox) returned_to_sender += f.returned;
  const uint64_t accounted = sender.credits.available() + on_wire_to_receiver + returned_to_sender +
                             receiver.held + receiver.credits.owed();
  if (accounted != receiver.credits.window()) {
    UNSCOPED_INFO("window " << receiver.credits.window() << " but " << accounted
                            << " accounted for");
    return false;
  }
  return receiver.share == nullptr || receiver.share->held() == receiver.credits.window();
}

bool Run(const Model& m) {
  std::vector<Link> links(m.links);
  for (Link& link : links) {
    const uint32_t a_initial = m.budget_a != nullptr ? m.floor : m.window;
    const uint32_t b_initial = m.budget != nullptr ? m.floor : m.window;
    for (auto [side, budget] : {std::pair{&link.a, m.budget_a}, std::pair{&link.b, m.budget}}) {
      if (budget == nullptr) continue;
      if (!budget->TakeFloor(m.floor)) return false;
      side->share = std::make_unique<ReceiveShare>();
      side->share->Open(budget, m.floor);
    }
    link.a.credits =
        CreditAccount(b_initial, m.window, OwnWindow{a_initial, m.window, link.a.share.get()});
    link.b.credits =
        CreditAccount(a_initial, m.window, OwnWindow{b_initial, m.window, link.b.share.get()});
    link.a.to_send = m.want_a;
    link.b.to_send = m.want_b;
    link.a.bulk = m.a_bulk;
    link.b.bulk = m.b_bulk;
  }
  uint64_t x = m.seed * 0x9E3779B97F4A7C15ull + 1;
  int quiet_steps = 0;
  for (int step = 0; step < 5000000; ++step) {
    bool moved = false;
    bool busy = false;
    Link& link = links[Next(x) % links.size()];
    for (auto [self, other] : {std::pair{&link.a, &link.b}, std::pair{&link.b, &link.a}}) {
      if (self->to_send > 0 && Next(x) % 2 == 0 && self->credits.TrySpendForData()) {
        other->inbox.push_back(Frame{true, self->bulk ? 0u : self->credits.TakeOwed()});
        --self->to_send;
        moved = true;
      } else if (self->credits.ShouldSendUpdate() && self->credits.TrySpendForUpdate()) {
        other->inbox.push_back(Frame{false, self->credits.TakeOwed()});
        ++self->credit_frames;
        moved = true;
      }
      if (!self->inbox.empty() && Next(x) % 2 == 0) {
        const Frame f = self->inbox.front();
        self->inbox.pop_front();
        // Honest peers never trip either side's checks, whatever the schedule.
        if (!self->credits.OnConsumed().ok()) return false;
        if (!self->credits.OnReturned(f.returned).ok()) return false;
        if (!f.data || other->bulk) {
          self->credits.OnRecvReposted();  // a credit frame's or a bulk write's goes straight back
        } else {
          ++self->held;
        }
        moved = true;
      }
      if (self->held > 0 && Next(x) % m.release_one_in == 0) {
        --self->held;
        self->credits.OnRecvReposted();
        moved = true;
      }
    }
    if (!Balanced(link.a, link.b) || !Balanced(link.b, link.a)) return false;
    for (auto [budget, b_side] : {std::pair{m.budget, true}, std::pair{m.budget_a, false}}) {
      if (budget == nullptr) continue;
      uint64_t claimed = 0;
      for (const Link& l : links) claimed += (b_side ? l.b : l.a).share->held();
      if (claimed != budget->claimed() || claimed > budget->size()) return false;
      if (budget->growth_free() < 0) return false;
    }
    for (const Link& l : links) {
      for (const Side* side : {&l.a, &l.b}) {
        busy = busy || side->to_send > 0 || !side->inbox.empty() || side->held > 0 ||
               side->credits.ShouldSendUpdate();
      }
    }
    if (!busy) {
      // Everything sent and delivered: quiet, and every side able to send data again at once.
      for (const Link& l : links) {
        if (!l.a.credits.CanSpendForData() || !l.b.credits.CanSpendForData()) return false;
      }
      return true;
    }
    quiet_steps = moved ? 0 : quiet_steps + 1;
    if (quiet_steps > 100000) return false;  // nothing moves though work remains: a deadlock
  }
  return false;
}

bool RunPair(uint32_t window, int want_a, int want_b, bool a_bulk = false, bool b_bulk = false) {
  Model m;
  m.window = window;
  m.want_a = want_a;
  m.want_b = want_b;
  m.a_bulk = a_bulk;
  m.b_bulk = b_bulk;
  return Run(m);
}
}  // namespace

TEST_CASE("two peers exchanging data one way or both ways never deadlock on credits", "[credits]") {
  for (uint32_t window : {3u, 4u, 5u, 8u, 64u}) {
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

TEST_CASE("elastic windows over one budget never deadlock, overrun or over-claim", "[credits]") {
  struct Case {
    const char* name;
    uint32_t budget;  // receives
    int links;
  };
  // Plenty (every window can reach its ceiling), tight, and as tight as admission allows (a
  // quarter of a budget is for growth: 64 backs the 16 floors of 3 and 16 receives of growth).
  for (const Case& c : {Case{"plenty", 16 * 32 * 2, 16}, Case{"tight", 96, 16},
                        Case{"floors and a little", 64, 16}}) {
    for (uint64_t seed = 1; seed <= 4; ++seed) {
      for (const bool bulk : {false, true}) {
        // Clients with fixed windows, or elastic ones over a budget of their own (a channel with
        // a shared receive queue).
        const bool both = seed % 2 == 0;
        INFO(c.name << ", seed " << seed << (bulk ? ", client writes bulk" : "")
                    << (both ? ", both sides elastic" : ""));
        ReceiveBudget budget(c.budget);
        ReceiveBudget client_budget(c.budget);
        Model m;
        m.window = 32;
        m.budget = &budget;
        if (both) m.budget_a = &client_budget;
        m.links = c.links;
        m.want_a = 2000;
        m.want_b = 300;
        m.a_bulk = bulk;
        m.release_one_in = 1 + static_cast<uint32_t>(seed % 3) * 4;  // prompt to sluggish
        m.seed = seed;
        CHECK(Run(m));
      }
    }
  }
}
