// Ring: FIFO order through growth and wrap-around, erasing a range from the middle, and no
// allocation once it has grown (a counting operator new in this binary).
#include "transport/ring.h"

#include <catch2/catch.hpp>
#include <deque>

#include "tests/counting_new.h"

namespace {

using zrpc::transport::Ring;

struct Item {
  uint64_t value = 0;
  uint32_t pad = 0;
};

}  // namespace

TEST_CASE("a ring keeps FIFO order through growth and wrap-around, like a deque") {
  Ring<Item> ring;
  std::deque<uint64_t> model;
  uint64_t next = 0;
  // Grows to 40 (past 16 and 32), drains to 3, refills: the head wraps many times.
  for (int round = 0; round < 50; ++round) {
    const size_t target = round % 2 == 0 ? 40 : 3;
    while (model.size() < target) {
      ring.push_back(Item{next});
      model.push_back(next++);
    }
    while (model.size() > target) {
      REQUIRE(ring.front().value == model.front());
      ring.pop_front();
      model.pop_front();
    }
    REQUIRE(ring.size() == model.size());
    for (size_t i = 0; i < model.size(); ++i) REQUIRE(ring[i].value == model[i]);
  }
  ring.clear();
  CHECK(ring.empty());
}

TEST_CASE("erasing a range keeps the rest in order, also across the wrap") {
  Ring<Item> ring;
  for (uint64_t i = 0; i < 12; ++i) ring.push_back(Item{i});
  for (int i = 0; i < 10; ++i) ring.pop_front();               // head near the end of 16 slots
  for (uint64_t i = 12; i < 20; ++i) ring.push_back(Item{i});  // wraps
  // 10..19; erase 13 and 14 (a write and its message).
  ring.erase(3, 5);
  const uint64_t expected[] = {10, 11, 12, 15, 16, 17, 18, 19};
  REQUIRE(ring.size() == 8);
  for (size_t i = 0; i < 8; ++i) CHECK(ring[i].value == expected[i]);
  ring.erase(7, 8);  // the last
  CHECK(ring.back().value == 18);
  ring.erase(0, 1);  // the first
  CHECK(ring.front().value == 11);
}

TEST_CASE("a ring that flows allocates nothing once grown; a deque does") {
  Ring<Item> ring;
  std::deque<Item> deque;
  for (int i = 0; i < 64; ++i) {  // grow both to their working size
    ring.push_back(Item{});
    deque.push_back(Item{});
  }
  ring.push_back(Item{});  // 65 at most while flowing: the ring's one growth to 128 is here
  ring.pop_front();
  const uint64_t before_ring = zrpc::testing::AllocationCount();
  for (int i = 0; i < 100000; ++i) {
    ring.push_back(Item{});
    ring.pop_front();
  }
  CHECK(zrpc::testing::AllocationCount() == before_ring);
  const uint64_t before_deque = zrpc::testing::AllocationCount();
  for (int i = 0; i < 100000; ++i) {
    deque.push_back(Item{});
    deque.pop_front();
  }
  // The reason for Ring: libstdc++'s deque allocates a 512-byte block every 32 Items here.
  CHECK(zrpc::testing::AllocationCount() > before_deque);
}
