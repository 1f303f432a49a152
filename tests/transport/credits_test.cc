// Credit accounting on the host: the reserved credit, piggybacked and explicit returns, refusal of
// a peer that returns more than it was given, elastic windows over a shared budget, and simulated
// peers that never deadlock, never overrun and never claim more than the budget has.
#include "transport/credits.h"

#include <catch2/catch.hpp>
#include <cstdint>
#include <cstdio>
#include <deque>
#include <memory>
#include <utility>
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
  enum Kind { kNormal, kPark, kParked } kind = kNormal;
  uint32_t surrendered = 0;  // kParked: the credits its sender gave up with it
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
  // Parking (b's window): a knocked and is not answered yet; b waits for a floor; b received
  // since the poller's last look.
  bool knocked = false;  // the client knocked and was not granted since
  bool heard = false;    // the poller saw the knock and has not opened the window yet
  bool waiting = false;
  bool used = false;
  uint32_t surrendered = 0;  // given up by a kPark's answer not sent yet
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
  bool parks = false;  // b's windows park (credits.h, "Parked windows"): the poller is modelled
  bool foreign_knocks = false;  // doors change without their client's knock (park_doors.h)
  // Filled in by Run: windows parked, grants made, kParked answers.
  mutable uint64_t parks_done = 0, grants = 0, answers = 0;
};

uint64_t Next(uint64_t& x) {
  x ^= x << 13, x ^= x >> 7, x ^= x << 17;
  return x;
}

// `limbo`: credits the sender gave up, or spent on a kParked, that no frame carries yet.
bool Balanced(const Side& sender, const Side& receiver, uint64_t limbo = 0) {
  uint64_t on_wire_to_receiver = receiver.inbox.size();
  uint64_t returned_to_sender = 0;
  for (const Frame& f : sender.inbox) returned_to_sender += f.returned;
  uint64_t surrendered = 0;  // given up with a kParked still on its way (or still owed)
  for (const Frame& f : receiver.inbox) surrendered += f.surrendered;
  const uint64_t accounted = sender.credits.available() + on_wire_to_receiver + returned_to_sender +
                             surrendered + limbo + receiver.held + receiver.credits.owed() +
                             receiver.credits.withheld();
  if (accounted != receiver.credits.window()) {
    UNSCOPED_INFO("window " << receiver.credits.window() << " but " << accounted
                            << " accounted for");
    return false;
  }
  return receiver.share == nullptr || receiver.share->held() == receiver.credits.window();
}

bool Fail(int line) {
  UNSCOPED_INFO("model failed at line " << line);
  return false;
}

bool Run(const Model& m) {
  std::vector<Link> links(m.links);
  for (Link& link : links) {
    const uint32_t a_initial = m.budget_a != nullptr ? m.floor : m.window;
    const uint32_t b_initial = m.budget != nullptr ? m.floor : m.window;
    bool b_parked = false;  // admitted with no floor free: starts parked
    for (auto [side, budget] : {std::pair{&link.a, m.budget_a}, std::pair{&link.b, m.budget}}) {
      if (budget == nullptr) continue;
      const bool floor = budget->TakeFloor(m.floor);
      if (!floor && !(m.parks && side == &link.b)) return Fail(__LINE__);
      if (!floor) b_parked = true;
      side->share = std::make_unique<ReceiveShare>();
      side->share->Open(budget, floor ? m.floor : 0);
    }
    link.a.credits = CreditAccount(b_parked ? 0 : b_initial, m.window,
                                   OwnWindow{a_initial, m.window, link.a.share.get()});
    OwnWindow b_own{b_initial, m.window, link.b.share.get()};
    b_own.parks = m.parks;
    b_own.parked = b_parked;
    link.b.credits = CreditAccount(a_initial, m.window, b_own);
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
    // The poller (Poller::ServeParking): knocks are answered with a floor when one is free;
    // while a knock waits, windows idle since the last look are asked to park.
    if (m.foreign_knocks && Next(x) % 64 == 0) links[Next(x) % links.size()].heard = true;
    if (m.parks && Next(x) % 8 == 0) {
      bool waiting = false;
      for (Link& l : links) {
        if (!l.heard || !l.b.credits.parked()) continue;
        if (l.b.credits.Unpark()) {
          l.heard = false;
          l.used = true;
          ++m.grants;
          moved = true;
        } else {
          waiting = true;
        }
      }
      if (waiting && Next(x) % 4 == 0) {
        for (Link& l : links) {
          Side& b = l.b;
          if (std::exchange(l.used, false) || !b.credits.CanAskPark()) continue;
          b.credits.TrySpendForData();
          l.a.inbox.push_back(Frame{false, b.credits.TakeOwed(), Frame::kPark});
          if (b.credits.AskedPark()) ++m.parks_done;
          moved = true;
        }
      }
    }
    Link& link = links[Next(x) % links.size()];
    // The client's side of parking: a kPark is answered (its last credit spent on a kParked, or
    // none held and nothing sent), and a parked sender with something to send knocks, once.
    if (link.a.credits.park_answer_owed() && Next(x) % 2 == 0) {
      link.a.credits.AnsweredPark();
      link.b.inbox.push_back(
          Frame{false, link.a.credits.TakeOwed(), Frame::kParked, link.surrendered});
      link.surrendered = 0;
      ++m.answers;
      moved = true;
    }
    if (link.a.credits.sender_parked() && !link.knocked &&
        (link.a.to_send > 0 || link.a.credits.WantsToReturn())) {
      link.knocked = true;
      link.heard = true;
      moved = true;
    }
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
        if (!self->credits.OnConsumed().ok()) return Fail(__LINE__);
        if (!self->credits.OnReturned(f.returned).ok()) return Fail(__LINE__);
        if (self->credits.OnGrantArrived()) link.knocked = false;
        if (self == &link.b) link.used = true;
        if (!f.data || other->bulk) {
          self->credits.OnRecvReposted();  // a credit frame's or a bulk write's goes straight back
        } else {
          ++self->held;
        }
        // Given up at once (the kParked, if one is owed, carries one of them): counted with the
        // kParked until it arrives.
        const uint32_t holding = self->credits.available();
        if (f.kind == Frame::kPark) link.surrendered = holding > 0 ? holding - 1 : 0;
        if (f.kind == Frame::kPark && !self->credits.OnParkAsked().ok()) {
          UNSCOPED_INFO("kPark to a sender parked "
                        << self->credits.sender_parked() << ", answer owed "
                        << self->credits.park_answer_owed() << ", available "
                        << self->credits.available() << ", returned " << f.returned);
          return Fail(__LINE__);
        }
        if (f.kind == Frame::kParked) {
          if (!self->credits.OnParked().ok()) return Fail(__LINE__);
          ++m.parks_done;
        } else if (!f.data && self->credits.parking() && self->credits.MaybeParked()) {
          ++m.parks_done;
        }
        moved = true;
      }
      if (self->held > 0 && Next(x) % m.release_one_in == 0) {
        --self->held;
        self->credits.OnRecvReposted();
        moved = true;
      }
    }
    const uint64_t limbo = link.surrendered + (link.a.credits.park_answer_owed() ? 1 : 0);
    if (!Balanced(link.a, link.b, limbo) || !Balanced(link.b, link.a)) return Fail(__LINE__);
    for (auto [budget, b_side] : {std::pair{m.budget, true}, std::pair{m.budget_a, false}}) {
      if (budget == nullptr) continue;
      uint64_t claimed = 0;
      for (const Link& l : links) claimed += (b_side ? l.b : l.a).share->held();
      if (claimed != budget->claimed() || claimed > budget->size()) return Fail(__LINE__);
      if (budget->growth_free() < 0) return Fail(__LINE__);
    }
    for (const Link& l : links) {
      for (const Side* side : {&l.a, &l.b}) {
        busy = busy || side->to_send > 0 || !side->inbox.empty() || side->held > 0 ||
               side->credits.ShouldSendUpdate();
      }
    }
    for (const Link& l : links) {
      busy = busy || l.a.credits.park_answer_owed() ||
             ((l.knocked || l.heard) && l.b.credits.parked()) || l.b.credits.parking();
    }
    if (!busy) {
      // Everything sent and delivered: quiet, and every side able to send data again at once (a
      // parked sender by knocking).
      for (const Link& l : links) {
        if (!(l.a.credits.CanSpendForData() || l.a.credits.sender_parked()) ||
            !l.b.credits.CanSpendForData()) {
          return Fail(__LINE__);
        }
      }
      return true;
    }
    quiet_steps = moved ? 0 : quiet_steps + 1;
    if (quiet_steps > 100000) {  // nothing moves though work remains: a deadlock
      for (size_t i = 0; i < links.size(); ++i) {
        const Link& l = links[i];
        if (l.a.to_send == 0 && l.b.to_send == 0 && l.a.inbox.empty() && l.b.inbox.empty() &&
            !l.knocked && !l.b.credits.parking()) {
          continue;
        }
        UNSCOPED_INFO("link " << i << ": a to_send " << l.a.to_send << " available "
                              << l.a.credits.available() << " owed " << l.a.credits.owed()
                              << " parked " << l.a.credits.sender_parked() << " answer owed "
                              << l.a.credits.park_answer_owed() << " inbox " << l.a.inbox.size()
                              << "; b to_send " << l.b.to_send << " available "
                              << l.b.credits.available() << " window " << l.b.credits.window()
                              << " held " << l.b.held << " owed " << l.b.credits.owed()
                              << " parked " << l.b.credits.parked() << " parking "
                              << l.b.credits.parking() << " inbox " << l.b.inbox.size()
                              << "; knocked " << l.knocked);
      }
      return Fail(__LINE__);
    }
  }
  return Fail(__LINE__);
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

TEST_CASE(
    "parked windows: a hundred links over a budget of 64 never deadlock, overrun or over-claim",
    "[credits]") {
  // 64 receives back 16 floors of 3: 84 links start parked, and every window of the 100 parks
  // and opens again, many times, as clients knock with data to send and idle windows are taken
  // back. Honest peers never trip a check, every claim stays within the budget, every sender
  // ends able to send (or knock), and nothing is left in flight.
  for (uint64_t seed = 1; seed <= 6; ++seed) {
    for (const bool server_sends : {false, true}) {
      INFO("seed " << seed << (server_sends ? ", both ways" : ", client to server"));
      ReceiveBudget budget(64);
      Model m;
      m.window = 32;
      m.budget = &budget;
      m.parks = true;
      m.links = 100;
      m.want_a = 60;
      m.want_b = server_sends ? 20 : 0;
      m.a_bulk = seed % 3 == 0;
      m.release_one_in = 1 + static_cast<uint32_t>(seed % 3) * 4;
      m.seed = seed;
      // Another peer writing doors not its own opens windows their clients did not ask for.
      m.foreign_knocks = seed >= 4;
      CHECK(Run(m));
      std::printf("seed %llu%s: %llu parks, %llu grants, %llu kParked answers\n",
                  static_cast<unsigned long long>(seed), server_sends ? " (both ways)" : "",
                  static_cast<unsigned long long>(m.parks_done),
                  static_cast<unsigned long long>(m.grants),
                  static_cast<unsigned long long>(m.answers));
      CHECK(m.grants >= 84);    // every link that started parked was opened
      CHECK(m.parks_done > 0);  // and windows were taken back to open them
      CHECK(budget.claimed() <= budget.size());
    }
  }
}

TEST_CASE(
    "a parked window: kPark withholds credits, kParked gives the window back, a knock opens it",
    "[credits]") {
  ReceiveBudget budget(8);  // 6 for floors, 2 for growth
  ReceiveShare share;
  Admit(budget, share, 3);
  OwnWindow own{3, 8, &share};
  own.parks = true;
  CreditAccount server(3, 3, own);  // its window; the client's fixed window of 3
  CreditAccount client(3, 8);       // its sending toward the server's window
  // The client sends one message; the server releases it and owes the credit.
  REQUIRE(client.TrySpendForData());
  REQUIRE(server.OnConsumed().ok());
  server.OnRecvReposted();
  CHECK(server.owed() == 1);
  CHECK(server.held() == 0);
  REQUIRE(server.CanAskPark());
  // kPark: its header takes what was owed, and nothing returns afterwards.
  REQUIRE(server.TrySpendForData());
  const uint16_t in_park = server.TakeOwed();
  CHECK(in_park == 1);
  CHECK_FALSE(server.AskedPark());  // the client holds credits: not parked yet
  CHECK(server.parking());
  REQUIRE(client.OnReturned(in_park).ok());
  // The client parks at once: one credit for the kParked it owes, the other two given up.
  CHECK(client.available() == 3);
  REQUIRE(client.OnParkAsked().ok());
  CHECK(client.park_answer_owed());
  CHECK(client.sender_parked());
  CHECK(client.available() == 0);
  CHECK_FALSE(client.OnGrantArrived());
  CHECK(client.OnParkAsked().code() == absl::StatusCode::kFailedPrecondition);
  client.AnsweredPark();
  CHECK_FALSE(client.park_answer_owed());
  REQUIRE(server.OnConsumed().ok());
  server.OnRecvReposted();
  CHECK_FALSE(server.ShouldSendUpdate());
  CHECK(server.TakeOwed() == 0);  // withheld while parking
  REQUIRE(server.OnParked().ok());
  CHECK(server.parked());
  CHECK(server.window() == 0);
  CHECK(share.held() == 0);
  CHECK(budget.floor_free() == 6);
  CHECK_FALSE(server.ShouldSendUpdate());
  // A kParked unasked, or a second one, is a protocol error; so is a frame beyond the credits.
  CHECK(server.OnParked().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(server.OnConsumed().code() == absl::StatusCode::kFailedPrecondition);
}

TEST_CASE("a knock opens a parked window with a floor, granted with the reserved credit",
          "[credits]") {
  ReceiveBudget budget(4);  // 3 for floors, 1 for growth
  ReceiveShare share;
  share.Open(&budget, 0);
  OwnWindow own{3, 8, &share};
  own.parks = true;
  own.parked = true;
  CreditAccount server(3, 3, own);
  CreditAccount client(0, 3, OwnWindow{3, 3, nullptr});
  CHECK(server.parked());
  CHECK(client.sender_parked());
  CHECK_FALSE(client.CanSpendForData());
  CHECK_FALSE(client.TrySpendForUpdate());
  // Another window holds the only floor: no grant until it comes back.
  REQUIRE(budget.TakeFloor(3));
  CHECK_FALSE(server.Unpark());
  budget.GiveFloor(3);
  // The server spent credits down to its reserved one on data to the client.
  REQUIRE(server.TrySpendForData());
  CHECK(server.available() == 2);
  REQUIRE(server.Unpark());
  CHECK(server.window() == 3);
  CHECK(share.held() == 3);
  // The grant goes in a credit frame even with the last credit (ShouldSendUpdate), returning 3.
  REQUIRE(server.TrySpendForData());
  CHECK(server.available() == 1);
  CHECK(server.ShouldSendUpdate());
  REQUIRE(server.TrySpendForUpdate());
  CHECK(server.TakeOwed() == 3);
  REQUIRE(client.OnReturned(3).ok());
  CHECK(client.OnGrantArrived());
  CHECK_FALSE(client.sender_parked());
  CHECK(client.CanSpendForData());
}

TEST_CASE("a provisional window grants one credit and owes the rest until confirmed", "[credits]") {
  // The accepting side of a connection that authenticates (auth.h): the client's Hello offers 8,
  // this side posts 16 of its own, and its Hello offers 1.
  OwnWindow own{16, 16, nullptr};
  own.provisional = true;
  CreditAccount account(8, 8, own);
  CHECK(account.provisional());
  CHECK(account.window() == 16);
  CHECK(account.owed() == 15);
  CHECK(account.held() == 0);
  // The client's kAuth spends its one credit; a second frame before the kAuthOk is an overrun.
  REQUIRE(account.OnConsumed().ok());
  CHECK(account.held() == 1);
  CreditAccount overrun(8, 8, own);
  REQUIRE(overrun.OnConsumed().ok());
  CHECK_FALSE(overrun.OnConsumed().ok());
  // Verified: the kAuth's receive goes back, and the kAuthOk returns the whole window.
  account.Confirm();
  CHECK_FALSE(account.provisional());
  account.OnRecvReposted();
  CHECK(account.ShouldSendUpdate());
  REQUIRE(account.TrySpendForUpdate());
  CHECK(account.TakeOwed() == 16);
  CHECK(account.held() == 0);
  // From here the client may spend all 16, and no more.
  for (int i = 0; i < 16; ++i) REQUIRE(account.OnConsumed().ok());
  CHECK_FALSE(account.OnConsumed().ok());
}

TEST_CASE("a provisional elastic window neither grows nor parks before it is confirmed",
          "[credits]") {
  ReceiveBudget budget(400);
  ReceiveShare share;
  Admit(budget, share, 3);
  OwnWindow own{3, 32, &share};
  own.parks = true;
  own.provisional = true;
  CreditAccount account(8, 8, own);
  // The kAuth leaves the peer without credits: an open window would grow here.
  REQUIRE(account.OnConsumed().ok());
  CHECK(account.window() == 3);
  CHECK(budget.claimed() == 3);
  CHECK_FALSE(account.CanAskPark());
  account.RetryGrowth();
  CHECK(account.window() == 3);
  account.Confirm();
  account.OnRecvReposted();
  REQUIRE(account.TrySpendForUpdate());
  CHECK(account.TakeOwed() == 3);
  // Confirmed, it behaves as any elastic window: the peer short of credits makes it grow.
  REQUIRE(account.OnConsumed().ok());
  REQUIRE(account.OnConsumed().ok());
  CHECK(account.window() == 4);
}
