// The locked-memory limit a server meets (transport/process_limits.h), on the host over
// fakeverbs: read from the process as the kernel applies it (CAP_IPC_LOCK lifts it), what an
// idle connection registers, how many fit, and what an RPC server does with it: created with
// admission bounded by the limit and a warning naming the value to set, or refused with that
// advice when not one connection fits. The test drops CAP_IPC_LOCK from its own process (this
// binary holds nothing else) and lowers its RLIMIT_MEMLOCK, as a non-root server runs (to 8 MiB,
// or to the hard limit if a container set it lower).
#include "transport/process_limits.h"

#include <linux/capability.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdint>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "rpc/channel.h"
#include "rpc/server.h"
#include "tests/fakeverbs/fake_device.h"
#include "tests/log_capture.h"

namespace {

using zrpc::transport::ConnectionOptions;
using zrpc::transport::ConnectionsWithin;
using zrpc::transport::LockedMemory;
using zrpc::transport::RegisteredPerIdleConnection;

// Drops CAP_IPC_LOCK from this process's effective and permitted sets, for good.
void DropIpcLock() {
  __user_cap_header_struct header{_LINUX_CAPABILITY_VERSION_3, 0};
  __user_cap_data_struct data[_LINUX_CAPABILITY_U32S_3] = {};
  REQUIRE(syscall(SYS_capget, &header, data) == 0);
  data[0].effective &= ~(1u << CAP_IPC_LOCK);
  data[0].permitted &= ~(1u << CAP_IPC_LOCK);
  data[0].inheritable &= ~(1u << CAP_IPC_LOCK);
  REQUIRE(syscall(SYS_capset, &header, data) == 0);
}

// Sets the soft limit to `bytes`, or to the hard limit when that is lower; returns which.
uint64_t LimitLockedMemory(uint64_t bytes) {
  rlimit limit{};
  REQUIRE(getrlimit(RLIMIT_MEMLOCK, &limit) == 0);
  limit.rlim_cur = bytes;
  if (limit.rlim_max != RLIM_INFINITY && limit.rlim_max < bytes) limit.rlim_cur = limit.rlim_max;
  REQUIRE(setrlimit(RLIMIT_MEMLOCK, &limit) == 0);
  return limit.rlim_cur;
}

}  // namespace

TEST_CASE("an idle connection's registered bytes, and how many fit in what the limit leaves",
          "[process_limits]") {
  ConnectionOptions options;  // 32 receives, a 256 KiB arena
  CHECK(RegisteredPerIdleConnection(options, false, 4096) == (256 << 10) + 33 * 4096);
  CHECK(RegisteredPerIdleConnection(options, true, 4096) == (256 << 10) + 4096);
  options.arena_size = 64;  // a page at least
  CHECK(RegisteredPerIdleConnection(options, true, 4096) == 2 * 4096);
  LockedMemory memory{false, 8 << 20, 1 << 20};
  CHECK(ConnectionsWithin(memory, 1 << 20) == 7);
  CHECK(ConnectionsWithin(memory, (7 << 20) + 1) == 0);
  memory.locked = 9 << 20;  // over the limit already
  CHECK(ConnectionsWithin(memory, 4096) == 0);
  CHECK(ConnectionsWithin(LockedMemory{}, 1 << 20) == UINT64_MAX);  // unlimited
  const std::string advice =
      zrpc::transport::RaiseLockedMemoryAdvice(LockedMemory{false, 8 << 20, 1 << 20}, 1 << 20, 100);
  INFO(advice);
  CHECK(absl::StrContains(advice, "RLIMIT_MEMLOCK is 8 MiB with 1 MiB locked already"));
  CHECK(absl::StrContains(advice, "it holds 7 connections. For 100 set it to at least 101 MiB"));
}

TEST_CASE(
    "without CAP_IPC_LOCK a server admits what RLIMIT_MEMLOCK holds and says what to set, or is "
    "refused when not one connection fits",
    "[process_limits]") {
  DropIpcLock();
  // 8 MiB, Debian's default, or the hard limit when that is lower (a container's).
  const uint64_t limit = LimitLockedMemory(8 << 20);
  const LockedMemory memory = zrpc::transport::ReadLockedMemory();
  REQUIRE_FALSE(memory.unlimited);
  CHECK(memory.limit == limit);
  zrpc::ServerOptions options;
  options.device = zrpc::fakeverbs::FakeDevice();
  // Default options: 4 KiB per idle connection (its credit-frame slot), its share of its
  // poller's shared receive queue, which the server cuts to half the room the limit leaves
  // (fakeverbs pins nothing itself), and its share of its poller's pool of arenas lent on demand,
  // cut to a quarter of the room: with 8 MiB, 1,024 receives backing 256 floors of 3, 16 KiB
  // each, and 8 arenas of 256 KiB, 8 KiB each.
  const uint64_t room = memory.limit > memory.locked ? memory.limit - memory.locked : 0;
  const uint64_t queue = std::min<uint64_t>(4096, std::max<uint64_t>(room / 2 / 4096, 3));
  const uint64_t floors = (queue - queue / 4) / 3;
  const uint64_t arenas = std::min<uint64_t>(64, room / 4 / (256 << 10));
  const uint64_t per_connection =
      4096 + (floors == 0 ? 0 : (queue * 4096 + floors - 1) / floors) +
      (arenas == 0 ? (256 << 10) : (arenas * (256 << 10) + floors - 1) / floors);
  const uint64_t fits =
      memory.limit > memory.locked ? (memory.limit - memory.locked) / per_connection : 0;
  INFO("limit " << memory.limit << ", pinned " << memory.locked << ": " << fits << " fit");
  if (fits > 0) {
    zrpc::testing::LogCapture log(zrpc::LogLevel::kWarning);
    auto server = zrpc::Server::Create(options);
    INFO(server.status());
    REQUIRE(server.ok());
    CHECK(log.Count(zrpc::LogLevel::kWarning, "rpc",
                    absl::StrCat("the server admits ", fits, " connections, not 16384")) == 1);
    // The queue and the arena pool were cut to fit, and the server said so.
    CHECK(queue < 4096);
    CHECK(arenas < 64);
    CHECK(log.Count(zrpc::LogLevel::kWarning, "rpc",
                    absl::StrCat("lend ", arenas, " receive arenas each, not arena_pool = 64")) ==
          1);
    CHECK(log.Count(zrpc::LogLevel::kWarning, "rpc",
                    absl::StrCat("shared receive queues hold ", queue,
                                 " receives, not shared_receive_queue = 4096")) == 1);
    const uint64_t needed = memory.locked + per_connection * 16384;
    CHECK(log.Count(zrpc::LogLevel::kWarning, "rpc",
                    absl::StrCat("set it to at least ", (needed + (1 << 20) - 1) >> 20, " MiB")) ==
          1);
  }
  LimitLockedMemory(256 << 10);
  auto refused = zrpc::Server::Create(options);
  INFO(refused.status());
  REQUIRE_FALSE(refused.ok());
  CHECK(refused.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(absl::StrContains(refused.status().message(),
                          "the process may lock no more memory for a connection: RLIMIT_MEMLOCK"));
}

// Before: a channel made its shared receive queue whatever the limit (a poller group's is 16 MiB
// of slots by default, twice Debian's 8 MiB), and on a device that pins it failed to create.
TEST_CASE("without CAP_IPC_LOCK a channel cuts its shared queue and arena pool to the limit",
          "[process_limits]") {
  DropIpcLock();
  LimitLockedMemory(8 << 20);
  const LockedMemory memory = zrpc::transport::ReadLockedMemory();
  REQUIRE_FALSE(memory.unlimited);
  const uint64_t room = memory.limit > memory.locked ? memory.limit - memory.locked : 0;
  const uint64_t queue = std::min<uint64_t>(4096, std::max<uint64_t>(room / 2 / 4096, 4));
  const uint64_t arenas = std::min<uint64_t>(64, room / 4 / (256 << 10));
  zrpc::ChannelOptions options;
  options.device = zrpc::fakeverbs::FakeDevice();
  options.poller_group = "limited";  // a server's sizes: a queue of 4,096, 64 arenas
  zrpc::testing::LogCapture log(zrpc::LogLevel::kWarning);
  auto channel =
      zrpc::CreateChannel(absl::StrCat(zrpc::fakeverbs::FakeDevice().addr, ":1"), options);
  INFO(channel.status());
  REQUIRE(channel.ok());
  CHECK(queue < 4096);
  CHECK((*channel)->stats().shared_receives == queue);
  CHECK(log.Count(zrpc::LogLevel::kWarning, "rpc",
                  absl::StrCat("the channel's shared receive queues hold ", queue,
                               " receives, not shared_receive_queue = 4096")) == 1);
  if (arenas > 0) {
    CHECK((*channel)->stats().arena_pool == arenas);
    CHECK(log.Count(zrpc::LogLevel::kWarning, "rpc",
                    absl::StrCat("the channel's pollers lend ", arenas,
                                 " receive arenas each, not arena_pool = 64")) == 1);
  }
}
