// The setup a channel and a server share: their common options' checks, and the device,
// staging, receive limits and pollers both run on.

#include "rpc/common/runtime.h"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "rpc/common/manual_pollers.h"
#include "rpc/common/shared_device.h"
#include "transport/log.h"
#include "transport/process_limits.h"

namespace zrpc::internal {

absl::Status CheckRuntimeOptions(const RuntimeOptions& options, absl::string_view side) {
  if (options.pollers < 1 || options.pollers > 64) {
    return absl::InvalidArgumentError(
        absl::StrCat(side, "::pollers is ", options.pollers, "; it must be in [1, 64]"));
  }
  if (absl::Status s = transport::CheckSpin(options.spin, absl::StrCat(side, "::spin")); !s.ok()) {
    return s;
  }
  if (options.max_message_size == 0 || options.max_message_size > INT32_MAX) {
    return absl::InvalidArgumentError(absl::StrCat(side, "::max_message_size is ",
                                                   options.max_message_size,
                                                   "; it must be in [1, 2 GiB - 1]"));
  }
  if (options.max_bulk_size == 0 || options.max_bulk_size > UINT32_MAX ||
      options.max_pulled_bytes < options.max_bulk_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        side, "::max_bulk_size is ", options.max_bulk_size, " and max_pulled_bytes ",
        options.max_pulled_bytes, ": the first must be in [1, 4 GiB - 1] and at most the second"));
  }
  if (options.stream_window == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(side, "::stream_window is 0; it must be at least 1"));
  }
  return absl::OkStatus();
}

absl::StatusOr<RuntimeParts> OpenRuntime(const RuntimeOptions& options, const char* side,
                                         uint32_t arena_piece_size) {
  RuntimeParts parts;
  absl::StatusOr<std::shared_ptr<transport::Device>> device =
      SharedDevice(options.device, options.slots);
  if (!device.ok()) return device.status();
  parts.device = *std::move(device);
  parts.staging = std::make_unique<StagingPool>(*parts.device, options.staging_bytes);
  parts.receive_limits = std::make_shared<ReceiveLimits>(
      options.max_message_size, options.max_bulk_size, options.max_pulled_bytes, side);
  parts.manual_pollers = ManualPollers();
  for (int i = 0; i < options.pollers; ++i) {
    absl::StatusOr<std::shared_ptr<transport::Poller>> poller =
        StartPoller(*parts.device, options, parts.manual_pollers, arena_piece_size);
    if (!poller.ok()) return poller.status();
    parts.pollers.push_back(*std::move(poller));
  }
  return parts;
}

absl::StatusOr<std::shared_ptr<transport::Poller>> StartPoller(transport::Device& device,
                                                               const RuntimeOptions& options,
                                                               bool manual,
                                                               uint32_t arena_piece_size) {
  transport::PollerOptions poller_options;
  poller_options.mode = options.poll_mode;
  poller_options.spin = options.spin;
  poller_options.shared_receive_queue = options.shared_receive_queue;
  // Only a server's pollers accept connections, whose windows park.
  poller_options.park_windows = options.park_windows && options.shared_receive_queue > 0;
  if (arena_piece_size > 0) {
    poller_options.arena_pool_pieces = options.arena_pool;
    poller_options.arena_piece_size = arena_piece_size;
  }
  absl::StatusOr<std::unique_ptr<transport::Poller>> poller =
      transport::Poller::Create(device, poller_options);
  if (!poller.ok()) return poller.status();
  std::shared_ptr<transport::Poller> made = *std::move(poller);
  if (manual) {
    AddManualPoller(made);  // driven by DriveManualPollersOnce (manual_pollers.h)
  } else if (absl::Status s = made->Start(); !s.ok()) {
    return s;
  }
  return made;
}

void ServerSizesForBySize(RuntimeOptions& options) {
  const ServerOptions server;
  if (options.shared_receive_queue == kBySize) {
    options.shared_receive_queue = server.shared_receive_queue;
  }
  if (options.arena_pool == kBySize) options.arena_pool = server.arena_pool;
}

uint32_t SharedQueueWithinLockedMemory(uint32_t asked, uint32_t slot_size, int pollers,
                                       uint32_t idle_recv_credits, absl::string_view who) {
  if (asked == 0) return 0;
  const transport::LockedMemory memory = transport::ReadLockedMemory();
  if (memory.unlimited) return asked;
  const uint64_t slot = std::max<uint64_t>((uint64_t{slot_size} + 63) / 64 * 64, 1);
  const uint64_t room = memory.limit > memory.locked ? memory.limit - memory.locked : 0;
  const auto made = static_cast<uint64_t>(std::max(pollers, 1));
  const uint64_t fits = room / 2 / made / slot;
  if (fits >= asked) return asked;
  // Three quarters of a queue back floors (transport/receive_budget.h).
  const uint64_t one_floor = (uint64_t{idle_recv_credits} * 4 + 2) / 3;
  const uint32_t sized =
      static_cast<uint32_t>(std::min<uint64_t>(asked, std::max<uint64_t>(fits, one_floor)));
  ZRPC_LOG(kWarning, "rpc", "the ", who, "'s shared receive queues hold ", sized,
           " receives, not shared_receive_queue = ", asked, ": RLIMIT_MEMLOCK is ", memory.limit,
           " bytes, ", memory.locked,
           " locked already; raise it (ulimit -l, or LimitMEMLOCK= for a service) to ",
           memory.locked + 2 * slot * asked * made, " bytes or more for the queues asked for");
  return sized;
}

uint32_t ArenaPoolWithinLockedMemory(uint32_t asked, uint64_t piece, int pollers,
                                     absl::string_view who) {
  if (asked == 0 || piece == 0) return 0;
  const transport::LockedMemory memory = transport::ReadLockedMemory();
  if (memory.unlimited) return asked;
  const uint64_t room = memory.limit > memory.locked ? memory.limit - memory.locked : 0;
  const auto made = static_cast<uint64_t>(std::max(pollers, 1));
  const uint64_t fits = room / 4 / made / piece;
  if (fits >= asked) return asked;
  const auto sized = static_cast<uint32_t>(fits);
  ZRPC_LOG(kWarning, "rpc", "the ", who, "'s pollers lend ", sized,
           " receive arenas each, not arena_pool = ", asked, ": RLIMIT_MEMLOCK is ", memory.limit,
           " bytes, ", memory.locked,
           " locked already; raise it (ulimit -l, or LimitMEMLOCK= for a service) by ",
           4 * piece * asked * made, " bytes or more for the arenas asked for");
  return sized;
}

uint32_t SharedQueueOnDevice(const transport::Device& device, uint32_t asked,
                             absl::string_view who) {
  if (asked == 0 || device.has_shared_receive_queues()) return asked;
  static std::atomic<bool> said{false};
  if (!said.exchange(true)) {
    ZRPC_LOG(kWarning, "rpc", "the RDMA device ", device.selection().device,
             " has no shared receive queues: a ", who,
             "'s connections post receives of their own (a window's worth each, registered and "
             "reserved in the completion queue while idle) instead of sharing their poller's ",
             asked,
             ", and a server's windows do not park: it holds far fewer connections "
             "(transport/README.md, \"Capacity\")");
  }
  return 0;
}

void SayNoWindowsOnce(const transport::Device& device, uint32_t arena_size, absl::string_view who,
                      absl::string_view side) {
  if (device.has_windows()) return;
  static std::atomic<bool> said{false};
  if (said.exchange(true)) return;
  const std::string arenas =
      arena_size == 0
          ? std::string()
          : absl::StrCat("; and a ", who, " connection registers its own ", arena_size,
                         "-byte receive arena instead of borrowing one from its poller's pool "
                         "when its peer writes (",
                         side, "::arena_pool)");
  ZRPC_LOG(kWarning, "rpc", "the RDMA device ", device.selection().device,
           " has no type-2 memory windows",
           ": a payload exposed for the peer to pull is registered for the call, and its key works "
           "from every queue pair of the device until the peer is done (rpc/WIRE.md, \"Scope of "
           "the exposure\")",
           arenas);
}

}  // namespace zrpc::internal
