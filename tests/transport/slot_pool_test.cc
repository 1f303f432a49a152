// SlotPool on the host (no device, memory not registered, every lkey 0): O(1) allocation in
// address order, growth in chunks up to the cap, exhaustion and failed growth reported, double
// frees caught, and no slot handed to two owners under threads while the pool grows.
#include "transport/slot_pool.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <cstdio>
#include <cstring>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "tests/skip.h"

namespace {
using zrpc::transport::SlotPool;
using zrpc::transport::SlotPoolOptions;

std::unique_ptr<SlotPool> MakePool(size_t slot_size, uint32_t count, uint32_t max_slots) {
  SlotPoolOptions options;
  options.slot_size = slot_size;
  options.slot_count = count;
  options.max_slots = max_slots;
  auto pool = SlotPool::Create(nullptr, options);
  REQUIRE(pool.ok());
  return std::move(*pool);
}

std::string CreateError(const SlotPoolOptions& options) {
  auto pool = SlotPool::Create(nullptr, options);
  REQUIRE(pool.status().code() == absl::StatusCode::kInvalidArgument);
  return std::string(pool.status().message());
}
}  // namespace

TEST_CASE("a slot pool hands out every slot once, then reports it is empty", "[slot_pool]") {
  auto pool = MakePool(100, 8, 8);  // a pool that never grows
  CHECK(pool->slot_size() == 128);  // rounded up to a cache line
  std::set<uint32_t> seen;
  for (uint32_t i = 0; i < 8; ++i) {
    uint32_t slot = pool->Allocate();
    REQUIRE(slot != SlotPool::kNoSlot);
    CHECK(slot == i);              // a fresh pool goes in address order
    CHECK(pool->lkey(slot) == 0);  // not registered without a protection domain
    seen.insert(slot);
    CHECK(pool->IndexOf(pool->data(slot) + 127) == slot);
  }
  CHECK(seen.size() == 8);
  CHECK(pool->available() == 0);
  CHECK(pool->Allocate() == SlotPool::kNoSlot);
  CHECK(pool->growth_error().ok());  // empty because of the cap, not a failure
  CHECK(pool->IndexOf(pool->data(7) + 128) == SlotPool::kNoSlot);
  CHECK(pool->IndexOf(pool->data(0) - 1) == SlotPool::kNoSlot);

  REQUIRE(pool->Free(5).ok());
  CHECK(pool->available() == 1);
  CHECK(pool->Allocate() == 5);  // last freed, first reused: warm in cache
}

TEST_CASE("a slot pool refuses double frees and foreign indices, and stays intact", "[slot_pool]") {
  auto pool = MakePool(64, 4, 4);
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

TEST_CASE("a slot pool grows a chunk at a time up to its cap, then reports it is empty",
          "[slot_pool]") {
  // Chunks of 4 slots of 64 bytes (one page each), at most 10 slots: 4 + 4 + a last chunk of 2.
  auto pool = MakePool(64, 3, 10);  // 3 rounds up to 4
  CHECK(pool->chunk_slots() == 4);
  CHECK(pool->max_slots() == 10);
  CHECK(pool->slot_count() == 4);
  CHECK(pool->registered_bytes() == 4096);
  CHECK(pool->available() == 4);

  std::vector<uint32_t> slots;
  for (uint32_t i = 0; i < 10; ++i) {
    uint32_t slot = pool->Allocate();
    REQUIRE(slot != SlotPool::kNoSlot);
    CHECK(slot == i);  // each new chunk hands out its slots in address order too
    CHECK(pool->lkey(slot) == 0);
    slots.push_back(slot);
    CHECK(pool->slot_count() == std::min<uint32_t>(10, (i / 4 + 1) * 4));
  }
  CHECK(pool->registered_bytes() == 3 * 4096);
  CHECK(pool->available() == 0);
  CHECK(pool->Allocate() == SlotPool::kNoSlot);
  CHECK(pool->slot_count() == 10);
  CHECK(pool->growth_error().ok());

  SECTION("slots are slot_size apart within a chunk and never overlap across chunks") {
    for (uint32_t slot : {1u, 2u, 3u, 5u, 6u, 7u, 9u}) {
      CHECK(pool->data(slot) == pool->data(slot - 1) + 64);
    }
    std::vector<std::pair<const uint8_t*, uint32_t>> starts;
    for (uint32_t slot : slots) starts.emplace_back(pool->data(slot), slot);
    std::sort(starts.begin(), starts.end());
    for (size_t i = 1; i < starts.size(); ++i) {
      INFO("slot " << starts[i].second << " after slot " << starts[i - 1].second);
      CHECK(starts[i].first >= starts[i - 1].first + 64);
    }
    // Every byte of a slot is its own and no other's.
    for (uint32_t slot : slots) std::memset(pool->data(slot), static_cast<int>(slot), 64);
    for (uint32_t slot : slots) {
      for (size_t b = 0; b < 64; ++b) REQUIRE(pool->data(slot)[b] == slot);
    }
  }

  SECTION("IndexOf finds slots in every chunk, and nothing outside them") {
    for (uint32_t slot : slots) {
      CHECK(pool->IndexOf(pool->data(slot)) == slot);
      CHECK(pool->IndexOf(pool->data(slot) + 63) == slot);
    }
    CHECK(pool->IndexOf(pool->data(3) + 64) == SlotPool::kNoSlot);  // rest of chunk 0's page
    CHECK(pool->IndexOf(pool->data(9) + 64) == SlotPool::kNoSlot);  // past the short last chunk
    CHECK(pool->IndexOf(pool->data(8) - 1) == SlotPool::kNoSlot);
    int local = 0;
    CHECK(pool->IndexOf(&local) == SlotPool::kNoSlot);
  }

  SECTION("frees and double frees are checked against the slots that exist") {
    CHECK(pool->Free(10).code() == absl::StatusCode::kFailedPrecondition);  // never existed
    CHECK(pool->Free(12).code() == absl::StatusCode::kFailedPrecondition);
    REQUIRE(pool->Free(6).ok());  // a slot of the second chunk
    CHECK(pool->Free(6).code() == absl::StatusCode::kFailedPrecondition);
    CHECK(pool->available() == 1);
    CHECK(pool->Allocate() == 6);  // reused; the pool does not grow past its cap
    CHECK(pool->slot_count() == 10);
  }
}

TEST_CASE("a pool that can grow refuses indices of chunks it has not added yet", "[slot_pool]") {
  auto pool = MakePool(64, 4, 64);
  CHECK(pool->slot_count() == 4);
  auto status = pool->Free(4);
  CHECK(status.code() == absl::StatusCode::kFailedPrecondition);
  CHECK(std::string(status.message()).find("slot 4") != std::string::npos);
  CHECK(pool->Free(63).code() == absl::StatusCode::kFailedPrecondition);
  CHECK(pool->slot_count() == 4);
  CHECK(pool->available() == 4);
}

TEST_CASE("a pool with default options starts at 1 MiB and takes 256 idle server connections",
          "[slot_pool]") {
  auto pool = SlotPool::Create(nullptr, SlotPoolOptions{});
  REQUIRE(pool.ok());
  SlotPool& p = **pool;
  CHECK(p.slot_size() == 4096);
  CHECK(p.chunk_slots() == 256);
  CHECK(p.slot_count() == 256);
  CHECK(p.max_slots() == 131072);
  CHECK(p.registered_bytes() == (size_t{1} << 20));
  // Each server connection keeps recv_credits + 1 = 65 slots (ConnectionOptions defaults).
  constexpr uint32_t kPerConnection = 65;
  for (uint32_t i = 0; i < 256 * kPerConnection; ++i) REQUIRE(p.Allocate() != SlotPool::kNoSlot);
  CHECK(p.slot_count() == 256 * kPerConnection);  // 65 chunks, exactly
  CHECK(p.registered_bytes() == size_t{256} * kPerConnection * 4096);
}

TEST_CASE("invalid slot pool options are refused, naming the option", "[slot_pool]") {
  SlotPoolOptions options;
  options.slot_count = 0;
  CHECK(CreateError(options).find("slot_count 0") != std::string::npos);
  options = {};
  options.slot_size = 0;
  CHECK(CreateError(options).find("slot_size 0") != std::string::npos);
  options.slot_size = (size_t{1} << 30) + 1;
  CHECK(CreateError(options).find("slot_size") != std::string::npos);
  options = {};
  options.max_slots = 0;
  CHECK(CreateError(options).find("max_slots 0") != std::string::npos);
  options.max_slots = (uint32_t{1} << 31) + 1;
  CHECK(CreateError(options).find("max_slots") != std::string::npos);
  options.max_slots = UINT32_MAX;
  CHECK(CreateError(options).find("max_slots") != std::string::npos);
  options = {};
  options.slot_count = 100;
  options.max_slots = 99;  // the first chunk would exceed the cap
  CHECK(CreateError(options).find("slot_count 100 is not in [1, max_slots = 99]") !=
        std::string::npos);
  options = {};
  options.slot_count = 1;
  options.max_slots = (1 << 16) + 1;  // one chunk, one MR, per slot
  CHECK(CreateError(options).find("65537 chunks") != std::string::npos);
  options.max_slots = 1 << 16;  // exactly the most chunks allowed
  CHECK(SlotPool::Create(nullptr, options).ok());
}

// RLIMIT_AS makes the next chunk's allocation fail without touching the machine's memory. The
// sanitizers reserve terabytes of address space and abort when it runs out, so they skip this.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define ZRPC_SANITIZER_RESERVES_ADDRESS_SPACE 1
#endif

TEST_CASE("a pool that fails to grow says why, and grows on a later try", "[slot_pool]") {
#ifdef ZRPC_SANITIZER_RESERVES_ADDRESS_SPACE
  ZRPC_SKIP("RLIMIT_AS cannot be lowered under ASan or TSan");
#endif
  // 16 MiB chunks; a limit 4 MiB above what the process maps now refuses the second one.
  auto pool = MakePool(16384, 1024, 4096);
  for (int i = 0; i < 1024; ++i) REQUIRE(pool->Allocate() != SlotPool::kNoSlot);
  long pages = 0;
  std::FILE* statm = std::fopen("/proc/self/statm", "r");
  REQUIRE(statm != nullptr);
  REQUIRE(std::fscanf(statm, "%ld", &pages) == 1);
  std::fclose(statm);
  rlimit saved{};
  REQUIRE(getrlimit(RLIMIT_AS, &saved) == 0);
  rlimit low = saved;
  low.rlim_cur = static_cast<rlim_t>(pages) * sysconf(_SC_PAGESIZE) + (4 << 20);
  REQUIRE(setrlimit(RLIMIT_AS, &low) == 0);
  uint32_t refused = pool->Allocate();
  uint32_t again = pool->Allocate();  // tries again: nobody else tried meanwhile
  REQUIRE(setrlimit(RLIMIT_AS, &saved) == 0);

  CHECK(refused == SlotPool::kNoSlot);
  CHECK(again == SlotPool::kNoSlot);
  CHECK(pool->slot_count() == 1024);  // below the cap: growth, not the cap, refused
  absl::Status error = pool->growth_error();
  CHECK(error.code() == absl::StatusCode::kResourceExhausted);
  CHECK(std::string(error.message()).find("chunk 1") != std::string::npos);

  uint32_t slot = pool->Allocate();  // the limit is back: the chunk is added now
  CHECK(slot == 1024);
  CHECK(pool->slot_count() == 2048);
  CHECK(pool->registered_bytes() == size_t{32} << 20);
  CHECK(pool->growth_error().code() == absl::StatusCode::kResourceExhausted);  // kept
}

TEST_CASE("threads allocating and freeing while the pool grows never share a slot", "[slot_pool]") {
  constexpr int kThreads = 8;
  constexpr uint32_t kHold = 32;               // slots each thread holds at most
  constexpr uint32_t kMax = kThreads * kHold;  // so Allocate may never fail
  constexpr int kRounds = 4000;
  constexpr int kPools = 10;  // fresh pools: growth races again each time
  for (int round = 0; round < kPools; ++round) {
    auto pool = MakePool(64, 4, kMax);  // 64 chunks of 4 slots
    // owner[i]: the thread holding slot i, plus one; 0 when free. Each owner also stamps the
    // slot's bytes and checks the stamp before freeing: two owners would overwrite each other.
    std::unique_ptr<std::atomic<int>[]> owner(new std::atomic<int>[kMax]);
    for (uint32_t i = 0; i < kMax; ++i) owner[i].store(0);
    std::atomic<int> shared{0};
    std::atomic<int> conflicts{0};
    std::atomic<int> refused{0};
    std::atomic<int> failures{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t] {
        std::vector<uint32_t> held;
        uint32_t seed = 12345u + static_cast<uint32_t>(t) * 7919u;
        for (int i = 0; i < kRounds; ++i) {
          seed = seed * 1103515245u + 12345u;
          // Mostly allocate until full, then churn: every thread pushes the pool to grow.
          bool allocate = held.empty() || (held.size() < kHold && (seed >> 16) % 4 != 0);
          if (allocate) {
            uint32_t slot = pool->Allocate();
            if (slot == SlotPool::kNoSlot) {
              refused++;
              continue;
            }
            if (slot >= kMax || owner[slot].exchange(t + 1) != 0) shared++;
            uint64_t stamp = uint64_t(t) << 32 | slot;
            std::memcpy(pool->data(slot), &stamp, sizeof(stamp));
            std::memset(pool->data(slot) + sizeof(stamp), t, 64 - sizeof(stamp));
            held.push_back(slot);
            continue;
          }
          size_t pick = (seed >> 8) % held.size();
          uint32_t slot = held[pick];
          held[pick] = held.back();
          held.pop_back();
          uint64_t stamp = 0;
          std::memcpy(&stamp, pool->data(slot), sizeof(stamp));
          if (stamp != (uint64_t(t) << 32 | slot)) conflicts++;
          for (size_t b = sizeof(stamp); b < 64; ++b) {
            if (pool->data(slot)[b] != t) conflicts++;
          }
          if (owner[slot].exchange(0) != t + 1) shared++;
          if (!pool->Free(slot).ok()) failures++;
        }
        for (uint32_t slot : held) {
          if (owner[slot].exchange(0) != t + 1) shared++;
          if (!pool->Free(slot).ok()) failures++;
        }
      });
    }
    for (auto& th : threads) th.join();
    INFO("pool " << round);
    CHECK(shared == 0);
    CHECK(conflicts == 0);
    CHECK(refused == 0);  // demand never exceeded the cap, so no Allocate may fail
    CHECK(failures == 0);
    CHECK(pool->growth_error().ok());
    uint32_t count = pool->slot_count();
    CHECK(count <= kMax);
    CHECK(count % 4 == 0);
    CHECK(pool->available() == count);
    std::set<uint32_t> seen;
    for (uint32_t i = 0; i < count; ++i) seen.insert(pool->Allocate());
    CHECK(seen.size() == count);
    CHECK(seen.count(SlotPool::kNoSlot) == 0);
    CHECK(pool->slot_count() == count);  // every existing slot came back: no growth needed
  }
}

TEST_CASE(
    "a slot cache keeps up to its capacity of freed slots for its thread, counted free, and gives "
    "them back when flushed or destroyed",
    "[slot_pool][cache]") {
  using zrpc::transport::SlotCache;
  constexpr uint32_t kSlots = SlotCache::kCapacity + 8;
  auto pool = MakePool(64, kSlots, kSlots);
  std::vector<uint32_t> held;
  {
    SlotCache cache(*pool);
    // Empty, the cache takes from the pool.
    for (uint32_t i = 0; i < kSlots; ++i) {
      uint32_t slot = cache.Allocate();
      REQUIRE(slot != SlotPool::kNoSlot);
      held.push_back(slot);
    }
    CHECK(cache.Allocate() == SlotPool::kNoSlot);  // the pool's exhaustion, passed on
    CHECK(pool->available() == 0);
    // Freed, the first kCapacity stay in the cache, the rest go to the pool's stack; all count
    // free.
    for (uint32_t slot : held) REQUIRE(cache.Free(slot).ok());
    CHECK(cache.cached() == SlotCache::kCapacity);
    CHECK(pool->available() == kSlots);
    // Another thread's Allocate reaches only the stack: 8 slots, not the cached ones.
    std::vector<uint32_t> from_pool;
    for (uint32_t slot; (slot = pool->Allocate()) != SlotPool::kNoSlot;) from_pool.push_back(slot);
    CHECK(from_pool.size() == kSlots - SlotCache::kCapacity);
    // The cache hands out the last freed first, and marks it taken.
    CHECK(cache.Allocate() == held[SlotCache::kCapacity - 1]);
    CHECK(pool->available() == SlotCache::kCapacity - 1);
    // Double frees are refused, the cache's and the pool's alike; the counts stay.
    REQUIRE(cache.Free(held[SlotCache::kCapacity - 1]).ok());
    CHECK_FALSE(cache.Free(held[SlotCache::kCapacity - 1]).ok());
    CHECK_FALSE(pool->Free(held[0]).ok());  // cached: free already
    CHECK_FALSE(cache.Free(kSlots).ok());   // no such slot
    CHECK(cache.cached() == SlotCache::kCapacity);
    for (uint32_t slot : from_pool) REQUIRE(pool->Free(slot).ok());
    cache.Flush();
    CHECK(cache.cached() == 0);
    // Every slot is back on the stack, once.
    std::set<uint32_t> all;
    for (uint32_t slot; (slot = pool->Allocate()) != SlotPool::kNoSlot;) all.insert(slot);
    CHECK(all.size() == kSlots);
    for (uint32_t slot : all) REQUIRE(cache.Free(slot).ok());
    CHECK(cache.cached() == SlotCache::kCapacity);
  }
  // Destroyed, the cache flushed itself.
  std::set<uint32_t> all;
  for (uint32_t slot; (slot = pool->Allocate()) != SlotPool::kNoSlot;) all.insert(slot);
  CHECK(all.size() == kSlots);
}
