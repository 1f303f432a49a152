// SlotPool on the host (no device, memory not registered): O(1) allocation in address order,
// exhaustion reported, double frees caught, and no slot handed to two owners under threads.
#include <catch2/catch.hpp>
#include <atomic>
#include <cstring>
#include <set>
#include <thread>
#include <vector>

#include "transport/slot_pool.h"

namespace {
using zrpc::transport::SlotPool;
using zrpc::transport::SlotPoolOptions;

std::unique_ptr<SlotPool> MakePool(size_t slot_size, uint32_t count) {
  SlotPoolOptions options;
  options.slot_size = slot_size;
  options.slot_count = count;
  options.max_slots = count;  // a pool that never grows
  auto pool = SlotPool::Create(nullptr, options);
  REQUIRE(pool.ok());
  return std::move(*pool);
}
}  // namespace

TEST_CASE("a slot pool hands out every slot once, then reports it is empty", "[slot_pool]") {
  auto pool = MakePool(100, 8);
  CHECK(pool->slot_size() == 128);  // rounded up to a cache line
  CHECK(pool->lkey(0) == 0);        // not registered without a protection domain
  std::set<uint32_t> seen;
  for (uint32_t i = 0; i < 8; ++i) {
    uint32_t slot = pool->Allocate();
    REQUIRE(slot != SlotPool::kNoSlot);
    CHECK(slot == i);  // a fresh pool goes in address order
    seen.insert(slot);
    CHECK(pool->IndexOf(pool->data(slot) + 127) == slot);
  }
  CHECK(seen.size() == 8);
  CHECK(pool->available() == 0);
  CHECK(pool->Allocate() == SlotPool::kNoSlot);
  CHECK(pool->IndexOf(pool->data(7) + 128) == SlotPool::kNoSlot);
  CHECK(pool->IndexOf(pool->data(0) - 1) == SlotPool::kNoSlot);

  REQUIRE(pool->Free(5).ok());
  CHECK(pool->available() == 1);
  CHECK(pool->Allocate() == 5);  // last freed, first reused: warm in cache
}

TEST_CASE("a slot pool refuses double frees and foreign indices, and stays intact", "[slot_pool]") {
  auto pool = MakePool(64, 4);
  uint32_t a = pool->Allocate();
  REQUIRE(pool->Free(a).ok());
  auto twice = pool->Free(a);
  CHECK(twice.code() == absl::StatusCode::kFailedPrecondition);
  CHECK(pool->Free(4).code() == absl::StatusCode::kFailedPrecondition);
  CHECK(pool->Free(SlotPool::kNoSlot).code() == absl::StatusCode::kFailedPrecondition);
  CHECK(pool->available() == 4);
  std::set<uint32_t> seen;
  for (int i = 0; i < 4; ++i) seen.insert(pool->Allocate());
  CHECK(seen == std::set<uint32_t>{0, 1, 2, 3});
}

TEST_CASE("invalid slot pool options are refused", "[slot_pool]") {
  SlotPoolOptions options;
  options.slot_count = 0;
  CHECK(SlotPool::Create(nullptr, options).status().code() == absl::StatusCode::kInvalidArgument);
  options.slot_count = 4;
  options.slot_size = 0;
  CHECK(SlotPool::Create(nullptr, options).status().code() == absl::StatusCode::kInvalidArgument);
}

TEST_CASE("threads allocating and freeing at once never share a slot", "[slot_pool]") {
  constexpr uint32_t kSlots = 64;
  constexpr int kThreads = 4;
  constexpr int kRounds = 20000;
  auto pool = MakePool(64, kSlots);
  // Each owner stamps its slot and checks the stamp before freeing: two owners of one slot
  // would overwrite each other.
  std::atomic<int> conflicts{0};
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::vector<uint32_t> held;
      for (int i = 0; i < kRounds; ++i) {
        if (held.size() < 8) {
          uint32_t slot = pool->Allocate();
          if (slot != SlotPool::kNoSlot) {
            uint64_t stamp = uint64_t(t) << 32 | slot;
            std::memcpy(pool->data(slot), &stamp, sizeof(stamp));
            held.push_back(slot);
            continue;
          }
        }
        if (held.empty()) continue;
        uint32_t slot = held.back();
        held.pop_back();
        uint64_t stamp = 0;
        std::memcpy(&stamp, pool->data(slot), sizeof(stamp));
        if (stamp != (uint64_t(t) << 32 | slot)) conflicts++;
        if (!pool->Free(slot).ok()) failures++;
      }
      for (uint32_t slot : held) {
        if (!pool->Free(slot).ok()) failures++;
      }
    });
  }
  for (auto& th : threads) th.join();
  CHECK(conflicts == 0);
  CHECK(failures == 0);
  CHECK(pool->available() == kSlots);
  std::set<uint32_t> seen;
  for (uint32_t i = 0; i < kSlots; ++i) seen.insert(pool->Allocate());
  CHECK(seen.size() == kSlots);
  CHECK(seen.count(SlotPool::kNoSlot) == 0);
}
