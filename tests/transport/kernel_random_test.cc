// kernel_random.h: values drawn across the per-thread block's edges, by several threads, do not
// repeat, and every byte value comes up (a source stuck at zero, or a block handed out twice,
// fails these).
#include "transport/kernel_random.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

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

// In a child whose seccomp filter refuses getrandom (ENOSYS) and every open (EACCES), as a
// sandbox may: the values still come, distinct and nonzero, and nothing hangs (before the
// fallbacks a refused getrandom left the block at zeros, and a door's token loop spun for good).
// 0 when it held, else what failed.
int DrawWithoutKernelSources() {
  alarm(20);  // a hang is a failure, not a stuck test
  sock_filter filter[] = {
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, nr)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_getrandom, 0, 1),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (ENOSYS & SECCOMP_RET_DATA)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_openat, 0, 1),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (EACCES & SECCOMP_RET_DATA)),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
  };
  sock_fprog program{static_cast<unsigned short>(sizeof(filter) / sizeof(filter[0])), filter};
  if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) return 2;
  if (prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &program) != 0) return 3;
  uint8_t probe[8];
  if (getrandom(probe, sizeof(probe), 0) != -1 || errno != ENOSYS) return 4;
  if (open("/dev/urandom", O_RDONLY) != -1) return 5;
  // A thread of its own: its block starts empty, so every value comes from the fallback.
  int result = 0;
  std::thread drawer([&result] {
    std::set<uint64_t> distinct;
    for (int i = 0; i < 1000; ++i) distinct.insert(KernelRandom64());
    if (distinct.size() != 1000 || distinct.count(0) != 0) result = 6;
  });
  drawer.join();
  return result;
}

TEST_CASE("without getrandom or /dev/urandom, values still differ and nothing hangs",
          "[kernel_random]") {
  const pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) _exit(DrawWithoutKernelSources());
  int status = 0;
  REQUIRE(waitpid(child, &status, 0) == child);
  INFO("child status " << status << " (exit " << WEXITSTATUS(status) << ", signal "
                       << (WIFSIGNALED(status) ? WTERMSIG(status) : 0) << ")");
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
}

}  // namespace
}  // namespace zrpc::transport
