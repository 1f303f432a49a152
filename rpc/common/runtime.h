// What a channel and a server share of their setup: checking the options both have
// (RuntimeOptions, rpc/options.h) and opening what both run on: the process's shared device,
// a staging pool, the limits on what the peer may send, and started pollers.
#ifndef ZRPC_RPC_COMMON_RUNTIME_H_
#define ZRPC_RPC_COMMON_RUNTIME_H_

#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "rpc/bulk/staging.h"
#include "rpc/connection/rpc_connection.h"
#include "rpc/options.h"
#include "transport/device.h"
#include "transport/poller.h"

namespace zrpc::internal {

// OK, or kInvalidArgument naming the first option out of range as `side` spells its struct
// ("ChannelOptions", "ServerOptions").
absl::Status CheckRuntimeOptions(const RuntimeOptions& options, absl::string_view side);

// OK, or kInvalidArgument naming the first null interceptor ("ServerOptions::interceptors[1] is
// null"); `side` as above.
template <typename Interceptor>
absl::Status CheckInterceptors(const std::vector<std::shared_ptr<Interceptor>>& interceptors,
                               absl::string_view side) {
  for (size_t i = 0; i < interceptors.size(); ++i) {
    if (interceptors[i] == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(side, "::interceptors[", i, "] is null"));
    }
  }
  return absl::OkStatus();
}

// A channel's or a server's resources, in the order they are made (and destroyed in reverse by
// their owner): pollers hold the device, staging and receive limits belong to it.
struct RuntimeParts {
  std::shared_ptr<transport::Device> device;
  std::unique_ptr<StagingPool> staging;
  std::shared_ptr<ReceiveLimits> receive_limits;
  // Shared with received payloads users still hold (rpc_connection.h).
  std::vector<std::shared_ptr<transport::Poller>> pollers;
  // Whether they are driven by DriveManualPollersOnce (manual_pollers.h) instead of their own
  // loops: read once, so that pollers added later are driven the same way.
  bool manual_pollers = false;
};

// Opens the shared device for `options` (rpc/common/shared_device.h), its staging pool, the
// receive limits (errors name `side`'s options) and `options.pollers` started pollers, which lend
// `options.arena_pool` arenas of `arena_piece_size` bytes when that is not 0 (a server's
// connections' arena_size). On error, what was made is destroyed before it returns.
absl::StatusOr<RuntimeParts> OpenRuntime(const RuntimeOptions& options, const char* side,
                                         uint32_t arena_piece_size = 0);

// One more poller for `options` on `device`, started, or handed to the manual driver when
// `manual` (RuntimeParts::manual_pollers: manual_pollers.h): what OpenRuntime makes each of its
// pollers with, for a server that adds pollers as connections come (ServerOptions::max_pollers).
absl::StatusOr<std::shared_ptr<transport::Poller>> StartPoller(transport::Device& device,
                                                               const RuntimeOptions& options,
                                                               bool manual,
                                                               uint32_t arena_piece_size = 0);

// kBySize (rpc/options.h) in `options`' shared_receive_queue and arena_pool, resolved to a
// server's defaults: what a server takes it for, and a poller group (sized for many channels).
void ServerSizesForBySize(RuntimeOptions& options);

// The shared receive queue of `asked` receives (RuntimeOptions::shared_receive_queue) of
// `slot_size`-byte slots that `pollers` pollers each make: `asked`, or, when RLIMIT_MEMLOCK would
// not let the process register them all with room to spare, what half the room left holds (a
// server's default queue is 16 MiB of slots; Debian's default limit is 8 MiB), with a warning
// naming `who` ("server", "channel") and the limit to set. Never below what backs one floor of
// `idle_recv_credits`, so that creation still fails with the pollers' own reason when not even
// that fits, and never above what was asked.
uint32_t SharedQueueWithinLockedMemory(uint32_t asked, uint32_t slot_size, int pollers,
                                       uint32_t idle_recv_credits, absl::string_view who);

// The arenas each poller lends (RuntimeOptions::arena_pool) of `piece` bytes: `asked`, or, when
// RLIMIT_MEMLOCK would not leave room for `pollers` pollers to register them all beside their
// other memory, what a quarter of the room left holds, with a warning naming `who` ("server",
// "channel") and the limit to set. 0 when not even one fits (connections then register arenas
// of their own, which a server's admission counts).
uint32_t ArenaPoolWithinLockedMemory(uint32_t asked, uint64_t piece, int pollers,
                                     absl::string_view who);

// The shared receive queue of `asked` receives that `who`'s ("server", "channel") pollers get on
// `device`: `asked`, or 0 when the device has no shared receive queues, whose connections then
// post receives of their own (and a server's windows do not park); said once a process.
uint32_t SharedQueueOnDevice(const transport::Device& device, uint32_t asked,
                             absl::string_view who);

// Said once a process: `device` has no type-2 memory windows to scope a pulled payload's exposure
// to one queue pair, so pulled payloads are registered per call and, when `arena_size` is not 0,
// `who`'s connections ("server", "channel") register arenas of their own. `arena_size`: the
// arena each connection registers because none is lent, or 0. Says nothing when there is
// nothing to say (windows).
void SayNoWindowsOnce(const transport::Device& device, uint32_t arena_size, absl::string_view who,
                      absl::string_view side);

}  // namespace zrpc::internal

#endif  // ZRPC_RPC_COMMON_RUNTIME_H_
