// The client call table and its ids, on the host: ids never reused (against late responses), the
// capacity bound, deadlines, the figures published for other threads.
#include "rpc/client/call_table.h"

#include <atomic>
#include <catch2/catch.hpp>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <thread>
#include <vector>

namespace {

using zrpc::CallIds;
using zrpc::CallTable;
using zrpc::TakenCall;

const absl::Time kT0 = absl::FromUnixSeconds(1'800'000'000);

// Take's call as a value (its entry goes back to the table at once), or nullopt.
template <typename T>
std::optional<T> Took(CallTable<T>& table, uint64_t id) {
  typename CallTable<T>::Taken taken = table.Take(id);
  if (!taken) return std::nullopt;
  return std::move(*taken);
}

template <typename T>
std::vector<int> Values(const std::vector<TakenCall<T>>& taken) {
  std::vector<int> values;
  for (const auto& t : taken) values.push_back(t.call);
  return values;
}

}  // namespace

TEST_CASE("ids are never 0, never repeat, and the domain's and other threads' never collide",
          "[call_table]") {
  CallIds ids;
  std::set<uint64_t> seen;
  for (int i = 0; i < 1000; ++i) {
    const uint64_t in_domain = ids.NextInDomain();
    CHECK(in_domain % 2 == 0);
    CHECK(in_domain != 0);
    CHECK(seen.insert(in_domain).second);
  }
  // Other threads number at once, with no lock: every id once.
  constexpr int kThreads = 4;
  constexpr int kEach = 10000;
  std::vector<std::vector<uint64_t>> shared(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&ids, &shared, t] {
      for (int i = 0; i < kEach; ++i) shared[t].push_back(ids.NextShared());
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (const std::vector<uint64_t>& mine : shared) {
    for (uint64_t id : mine) {
      CHECK(id % 2 == 1);
      CHECK(seen.insert(id).second);
    }
  }
  CHECK(seen.size() == 1000 + kThreads * kEach);
}

TEST_CASE("a call is found by its id until it is taken, and a taken id stays stale",
          "[call_table]") {
  CallTable<int> table(1000);
  CallIds ids;
  std::vector<uint64_t> inserted;
  for (int i = 0; i < 1000; ++i) {
    const uint64_t id = ids.NextInDomain();
    REQUIRE(table.Insert(id, int{i}, absl::InfiniteFuture()).ok());
    inserted.push_back(id);
  }
  CHECK(table.size() == 1000);
  CHECK(table.published_size() == 1000);
  for (size_t i = 0; i < inserted.size(); ++i) {
    CHECK(table.Live(inserted[i]));
    std::optional<int> call = Took(table, inserted[i]);
    REQUIRE(call.has_value());
    CHECK(*call == static_cast<int>(i));
    CHECK(!table.Live(inserted[i]));
  }
  CHECK(table.size() == 0);
  CHECK(table.published_size() == 0);
  CHECK(table.stale_drops() == 0);
  // Late responses: ids that were calls, one never used, 0. None matches a later call.
  const uint64_t later = ids.NextInDomain();
  REQUIRE(table.Insert(later, int{-1}, absl::InfiniteFuture()).ok());
  for (uint64_t old : inserted) CHECK(!Took(table, old).has_value());
  CHECK(!Took(table, 0).has_value());
  CHECK(!Took(table, ~uint64_t{0}).has_value());
  CHECK(table.stale_drops() == inserted.size() + 2);
  CHECK(Took(table, later) == -1);
}

TEST_CASE("the table refuses calls beyond its capacity, and an id in flight twice",
          "[call_table]") {
  CallTable<std::unique_ptr<int>> table(3);
  for (uint64_t id = 1; id <= 3; ++id) {
    REQUIRE(
        table.Insert(id, std::make_unique<int>(static_cast<int>(id)), absl::InfiniteFuture()).ok());
  }
  auto kept = std::make_unique<int>(4);
  absl::Status refused = table.Insert(4, std::move(kept), absl::InfiniteFuture());
  CHECK(refused.code() == absl::StatusCode::kResourceExhausted);
  REQUIRE(kept != nullptr);  // a refused call is left to its caller, who must still fail it
  CHECK(*kept == 4);
  CHECK(table.size() == 3);
  CallTable<std::unique_ptr<int>>::Taken taken = table.Take(2);
  REQUIRE(taken.has_value());
  CHECK(**taken == 2);
  absl::Status twice = table.Insert(3, std::move(kept), absl::InfiniteFuture());
  CHECK(twice.code() == absl::StatusCode::kAlreadyExists);
  REQUIRE(kept != nullptr);
  CHECK(table.Insert(4, std::move(kept), absl::InfiniteFuture()).ok());
  CHECK(table.capacity() == 3);
  CHECK(CallTable<int>(0).capacity() == 1);  // at least 1
}

TEST_CASE("Insert says when a call's deadline becomes the next one", "[call_table]") {
  CallTable<int> table(8);
  bool earliest = false;
  REQUIRE(table.Insert(10, 0, absl::InfiniteFuture(), &earliest).ok());
  CHECK(!earliest);  // never expires: nothing to wake for
  REQUIRE(table.Insert(11, 1, kT0 + absl::Seconds(5), &earliest).ok());
  CHECK(earliest);
  REQUIRE(table.Insert(12, 2, kT0 + absl::Seconds(9), &earliest).ok());
  CHECK(!earliest);
  REQUIRE(table.Insert(13, 3, kT0 + absl::Seconds(1), &earliest).ok());
  CHECK(earliest);
  CHECK(table.NextDeadline() == kT0 + absl::Seconds(1));
  CHECK(table.published_next_deadline() == kT0 + absl::Seconds(1));
  // Once call 13 is answered, the next is 5 s, past the dead entry at 1 s.
  REQUIRE(Took(table, 13) == 3);
  CHECK(table.published_next_deadline() == kT0 + absl::Seconds(1));  // early, never late
  REQUIRE(table.NextDeadline() == kT0 + absl::Seconds(5));
  CHECK(table.published_next_deadline() == kT0 + absl::Seconds(5));
  REQUIRE(table.Insert(14, 4, kT0 + absl::Seconds(3), &earliest).ok());
  CHECK(earliest);
}

// The timer sleeps until published_next_deadline() and runs TakeExpired then. Answered calls
// leave dead entries in the heap; if a pass published one of them, the timer would wake once per
// answered call (every few microseconds under load) for nothing.
TEST_CASE("after TakeExpired the published deadline is a live call's, past answered ones",
          "[call_table]") {
  CallTable<int> table(64);
  for (int i = 1; i <= 40; ++i) {
    REQUIRE(table.Insert(uint64_t(i), int{i}, kT0 + absl::Milliseconds(i)).ok());
  }
  for (int i = 1; i <= 39; ++i) REQUIRE(Took(table, uint64_t(i)) == i);   // answered
  CHECK(table.published_next_deadline() == kT0 + absl::Milliseconds(1));  // early, never late
  // The timer wakes at 1 ms: nothing expired, and the next wake-up is the live call's 40 ms.
  CHECK(table.TakeExpired(kT0 + absl::Milliseconds(1)).empty());
  CHECK(table.published_next_deadline() == kT0 + absl::Milliseconds(40));
  CHECK(table.heap_size() == 1);
  REQUIRE(Took(table, 40) == 40);
  CHECK(table.TakeExpired(kT0 + absl::Milliseconds(2)).empty());
  CHECK(table.published_next_deadline() == absl::InfiniteFuture());
}

TEST_CASE("calls expire in deadline order, and NextDeadline says when", "[call_table]") {
  CallTable<int> table(16);
  CHECK(table.NextDeadline() == absl::InfiniteFuture());
  CHECK(table.published_next_deadline() == absl::InfiniteFuture());
  CHECK(table.Insert(103, 3, kT0 + absl::Seconds(3)).ok());
  CHECK(table.Insert(101, 1, kT0 + absl::Seconds(1)).ok());
  CHECK(table.Insert(100, 0, absl::InfiniteFuture()).ok());
  CHECK(table.Insert(102, 2, kT0 + absl::Seconds(2)).ok());
  CHECK(table.Insert(122, 22, kT0 + absl::Seconds(2)).ok());
  CHECK(table.Insert(104, 4, kT0 + absl::Seconds(4)).ok());
  CHECK(table.NextDeadline() == kT0 + absl::Seconds(1));

  CHECK(table.TakeExpired(kT0).empty());
  CHECK(Values(table.TakeExpired(kT0 + absl::Seconds(1))) == std::vector<int>{1});
  CHECK(table.NextDeadline() == kT0 + absl::Seconds(2));
  // A call answered before its deadline leaves the deadline order too.
  CHECK(Took(table, 102) == 2);
  CHECK(table.NextDeadline() == kT0 + absl::Seconds(2));  // call 122
  CHECK(Values(table.TakeExpired(kT0 + absl::Milliseconds(3500))) == std::vector<int>{22, 3});
  CHECK(table.NextDeadline() == kT0 + absl::Seconds(4));
  CHECK(Took(table, 102) == std::nullopt);
  CHECK(table.size() == 2);

  // Infinite deadlines never expire, not even at the end of time.
  CHECK(Values(table.TakeExpired(absl::InfiniteFuture())) == std::vector<int>{4});
  CHECK(table.NextDeadline() == absl::InfiniteFuture());
  CHECK(table.size() == 1);
  std::vector<TakenCall<int>> all = table.TakeAll();
  REQUIRE(all.size() == 1);
  CHECK(all[0].id == 100);
  CHECK(all[0].call == 0);
  CHECK(table.published_size() == 0);
}

TEST_CASE("same deadlines expire by id, and a taken call never comes out of TakeExpired",
          "[call_table]") {
  CallTable<int> table(16);
  for (uint64_t id : {7, 3, 5, 1}) {
    REQUIRE(table.Insert(id, static_cast<int>(id), kT0).ok());
  }
  REQUIRE(Took(table, 5) == 5);
  CHECK(Values(table.TakeExpired(kT0)) == std::vector<int>{1, 3, 7});
}

TEST_CASE("answered calls do not pile up in the deadline heap", "[call_table]") {
  CallTable<int> table(100);
  CallIds ids;
  std::mt19937 rng(7);
  std::vector<uint64_t> live;
  size_t most = 0;
  for (int i = 0; i < 100'000; ++i) {
    if (live.size() < 100 && (live.empty() || rng() % 2 == 0)) {
      const uint64_t id = ids.NextInDomain();
      REQUIRE(table.Insert(id, int{i}, kT0 + absl::Seconds(10 + rng() % 1000)).ok());
      live.push_back(id);
    } else {
      std::swap(live[rng() % live.size()], live.back());
      REQUIRE(Took(table, live.back()).has_value());
      live.pop_back();
    }
    most = std::max(most, table.heap_size());
  }
  CHECK(most <= 2 * 100 + 1);
  std::vector<TakenCall<int>> expired = table.TakeExpired(absl::InfiniteFuture());
  std::multiset<uint64_t> expired_ids;
  for (const TakenCall<int>& t : expired) expired_ids.insert(t.id);
  CHECK(expired_ids == std::multiset<uint64_t>(live.begin(), live.end()));
  CHECK(table.size() == 0);
}

TEST_CASE("every call leaves the table exactly once, however it ends", "[call_table]") {
  // Responses, deadlines and the connection's end, interleaved at random; late responses for
  // every call after its end.
  CallTable<int> table(64);
  CallIds ids;
  std::mt19937 rng(11);
  std::vector<int> ended(20000, 0);
  std::vector<uint64_t> live;
  std::vector<uint64_t> gone;
  absl::Time now = kT0;
  int next = 0;
  while (next < static_cast<int>(ended.size()) || !live.empty()) {
    const int action = static_cast<int>(rng() % 10);
    if (action < 5 && next < static_cast<int>(ended.size())) {
      const uint64_t id = rng() % 2 == 0 ? ids.NextInDomain() : ids.NextShared();
      const absl::Time deadline =
          rng() % 4 == 0 ? absl::InfiniteFuture() : now + absl::Microseconds(rng() % 200);
      if (table.Insert(id, int{next}, deadline).ok()) {
        live.push_back(id);
        ++next;
      } else {
        REQUIRE(table.size() == 64);
      }
    } else if (action < 8 && !live.empty()) {
      std::swap(live[rng() % live.size()], live.back());
      std::optional<int> call = Took(table, live.back());
      if (call) ++ended[*call];
      gone.push_back(live.back());
      live.pop_back();
    } else if (action < 9) {
      now += absl::Microseconds(rng() % 100);
      for (const TakenCall<int>& t : table.TakeExpired(now)) ++ended[t.call];
    } else if (rng() % 50 == 0) {
      for (const TakenCall<int>& t : table.TakeAll()) ++ended[t.call];
    }
    // Drop from `live` what expiry or TakeAll ended.
    for (size_t i = 0; i < live.size();) {
      if (table.Live(live[i])) {
        ++i;
        continue;
      }
      gone.push_back(live[i]);
      live[i] = live.back();
      live.pop_back();
    }
  }
  for (int count : ended) REQUIRE(count == 1);
  for (uint64_t id : gone) REQUIRE(!Took(table, id).has_value());
  CHECK(table.size() == 0);
}

// A response completes its call in place (call_table.h, "Where calls live"): the call handed out
// by Take stays where it is, with its value, while the done-callback it runs starts calls that
// grow the table past a block of entries; its entry is reused only once the Taken has gone, and a
// table that has grown makes no new entries for calls that fit in the ones it has.
TEST_CASE("a taken call stays in place while the table grows; its entry is reused after it goes",
          "[call_table]") {
  CallTable<std::unique_ptr<int>> table(1000);
  REQUIRE(table.Insert(1, std::make_unique<int>(1), kT0 + absl::Seconds(1)).ok());
  CallTable<std::unique_ptr<int>>::Taken taken = table.Take(1);
  REQUIRE(taken);
  std::unique_ptr<int>* const where = &*taken;
  const int* const value = taken->get();
  std::set<const std::unique_ptr<int>*> entries;
  for (uint64_t id = 2; id < 2 + 100; ++id) {  // three blocks and more
    REQUIRE(
        table.Insert(id, std::make_unique<int>(static_cast<int>(id)), absl::InfiniteFuture()).ok());
    table.Visit(id, [&](std::unique_ptr<int>& call) { entries.insert(&call); });
  }
  CHECK(&*taken == where);  // not moved, not reused
  CHECK(taken->get() == value);
  CHECK(**taken == 1);
  CHECK(entries.count(where) == 0);
  CHECK(entries.size() == 100);
  // Moving the handle moves the claim, not the call.
  CallTable<std::unique_ptr<int>>::Taken moved = std::move(taken);
  CHECK(!taken.has_value());
  CHECK(&*moved == where);
  moved = CallTable<std::unique_ptr<int>>::Taken();  // gone: the entry is the table's again
  // The 101 entries made serve 101 calls in flight again: none is new.
  for (uint64_t id = 2; id < 2 + 100; ++id) {
    std::optional<std::unique_ptr<int>> call = Took(table, id);
    REQUIRE(call.has_value());
    CHECK(**call == static_cast<int>(id));
  }
  std::set<const std::unique_ptr<int>*> reused;
  for (uint64_t id = 200; id < 200 + 101; ++id) {
    REQUIRE(table.Insert(id, std::make_unique<int>(0), absl::InfiniteFuture()).ok());
    table.Visit(id, [&](std::unique_ptr<int>& call) { reused.insert(&call); });
  }
  entries.insert(where);
  CHECK(reused == entries);
}
