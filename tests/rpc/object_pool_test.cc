// ObjectPool (rpc/common/object_pool.h), on the host: objects made once and reused, null past the
// capacity, and any thread taking and giving back at once without handing one object to two.
#include "rpc/common/object_pool.h"

#include <atomic>
#include <catch2/catch.hpp>
#include <set>
#include <thread>
#include <vector>

namespace {

using zrpc::internal::ObjectPool;

struct Thing {
  int value = 0;
  std::atomic<int> holders{0};
};

}  // namespace

TEST_CASE("a pool hands out each object once, then null, and reuses what comes back",
          "[object_pool]") {
  ObjectPool<Thing, 4> pool;
  Thing outside;
  CHECK_FALSE(pool.Owns(&outside));
  std::set<Thing*> taken;
  for (int i = 0; i < 4; ++i) {
    Thing* t = pool.Take();
    REQUIRE(t != nullptr);
    CHECK(pool.Owns(t));
    CHECK(taken.insert(t).second);
    t->value = i + 1;
  }
  CHECK(pool.Take() == nullptr);  // all out: the caller makes its own
  CHECK_FALSE(pool.Owns(&outside));
  Thing* back = *taken.begin();
  pool.Give(back);
  Thing* again = pool.Take();
  CHECK(again == back);
  CHECK(again->value == back->value);  // as it was left
  for (Thing* t : taken) pool.Give(t);
}

TEST_CASE("threads taking and giving back at once never share an object", "[object_pool]") {
  ObjectPool<Thing, 8> pool;
  constexpr int kThreads = 4;
  constexpr int kRounds = 20000;
  std::atomic<int> shared{0}, empty{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < kRounds; ++i) {
        Thing* thing = pool.Take();
        if (thing == nullptr) {
          ++empty;
          continue;
        }
        if (thing->holders.fetch_add(1) != 0) ++shared;
        thing->holders.fetch_sub(1);
        pool.Give(thing);
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  CHECK(shared.load() == 0);
  CHECK(empty.load() == 0);  // at most 4 out at once, of 8
  std::set<Thing*> all;
  for (int i = 0; i < 8; ++i) {
    Thing* t = pool.Take();
    REQUIRE(t != nullptr);
    CHECK(all.insert(t).second);
  }
  CHECK(pool.Take() == nullptr);
  for (Thing* t : all) pool.Give(t);
}
