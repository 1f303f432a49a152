// kernel_random.h: values drawn across the per-thread block's edges, by several threads, do not
// repeat, and every byte value comes up (a source stuck at zero, or a block handed out twice,
// fails these).
#include "transport/kernel_random.h"

#include <algorithm>
#include <array>
#include <catch2/catch.hpp>
#include <cstdint>
#include <set>
#include <thread>
#include <vector>

namespace zrpc::transport {
namespace {

TEST_CASE("64-bit values do not repeat, across blocks and threads", "[kernel_random]") {
  constexpr int kThreads = 4;
  constexpr int kEach = 1000;  // 8,000 bytes each: 125 blocks of 64
  std::vector<std::vector<uint64_t>> drawn(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&drawn, t] {
      for (int i = 0; i < kEach; ++i) drawn[t].push_back(KernelRandom64());
    });
  }
  for (std::thread& thread : threads) thread.join();
  std::set<uint64_t> distinct;
  for (const auto& values : drawn) distinct.insert(values.begin(), values.end());
  CHECK(distinct.size() == size_t{kThreads} * kEach);
  CHECK(distinct.count(0) == 0);
}

TEST_CASE("bytes: every value comes up, and a draw across a block's edge is whole",
          "[kernel_random]") {
  std::array<int, 256> seen{};
  for (int i = 0; i < 20000; ++i) ++seen[KernelRandomByte()];
  for (int value = 0; value < 256; ++value) {
    INFO("byte value " << value);
    CHECK(seen[value] > 0);  // 20,000 draws: each value expected 78 times
  }
  // 61 bytes, then 100: the second draw spans the rest of one block and part of the next. Two
  // 100-byte draws that were equal, or one with a 16-byte run of zeros, would mean a block lost.
  uint8_t skip[61];
  KernelRandomBytes(skip, sizeof(skip));
  std::array<uint8_t, 100> a{}, b{};
  KernelRandomBytes(a.data(), a.size());
  KernelRandomBytes(b.data(), b.size());
  CHECK(a != b);
  for (const auto& draw : {a, b}) {
    int run = 0, longest = 0;
    for (uint8_t byte : draw) longest = std::max(longest, run = byte == 0 ? run + 1 : 0);
    CHECK(longest < 16);
  }
}

}  // namespace
}  // namespace zrpc::transport
