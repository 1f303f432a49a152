// Pollers that several channels of a process share (ChannelOptions::poller_group).
//
// A client that talks to many servers holds a channel for each, and each channel's own pollers
// cost a thread, a completion queue and, sized for many connections, a shared receive queue and
// an arena pool. Channels that name the same group use one set of pollers instead: the first
// channel to join makes them from its options, later ones join while any member lives, and the
// last one to leave shuts them down. A connection goes to the group's next poller with room for
// it (Poller::HasRoomFor: its completion-queue entries and shared-queue floor), so the members'
// connections fill the pollers together. They share one timer thread too (channel_timer.h), for
// their deadlines and keepalives.
//
// What the members must agree on is what shapes a poller: the device and its slot pool, the
// number of pollers, their poll mode and spin, the shared receive queue, and the arena pool with
// its piece size. A channel that asks for other values is refused with them named, rather than
// given pollers unlike those it asked for.
//
// Thread-safe. The registry holds groups weakly: a group lives while a member holds it (a payload
// a member's user still holds keeps its poller object, stopped, not the group). A member that
// goes waits for a pass of every poller of the group after its connections closed
// (Poller::AwaitPass), since the pollers run on: no report for its connections comes later.
#ifndef ZRPC_RPC_CLIENT_POLLER_GROUP_H_
#define ZRPC_RPC_CLIENT_POLLER_GROUP_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "rpc/client/channel_timer.h"
#include "rpc/options.h"
#include "transport/device.h"
#include "transport/options.h"
#include "transport/poller.h"

namespace zrpc::internal {

class PollerGroup {
 public:
  // What makes the group's pollers; members must ask for the same.
  struct Shape {
    const transport::Device* device = nullptr;
    int pollers = 1;
    transport::PollMode poll_mode = transport::PollMode::kEvent;
    absl::Duration spin;
    uint32_t shared_receive_queue = 0;
    uint32_t arena_pool = 0;
    uint32_t arena_piece = 0;
    bool manual = false;  // driven by DriveManualPollersOnce (manual_pollers.h)
  };

  // The group options.poller_group of this process, joined: made, with its pollers started on
  // `device`, when none lives. `options` has kBySize resolved and is what the channel asks for;
  // members are compared on that, and the group that is made cuts its queue and arena pool to
  // what RLIMIT_MEMLOCK leaves room for then (runtime.h), so that a later member is not refused
  // for memory locked meanwhile. kInvalidArgument when the live group was asked for another shape
  // (both named); a poller's own error when one cannot be made.
  static absl::StatusOr<std::shared_ptr<PollerGroup>> Join(
      const ChannelOptions& options, const std::shared_ptr<transport::Device>& device, bool manual);
  // The live group `name`, or null: for tests and diagnostics.
  static std::shared_ptr<PollerGroup> Find(const std::string& name);

  PollerGroup(const PollerGroup&) = delete;
  PollerGroup& operator=(const PollerGroup&) = delete;
  // Shuts the pollers down: the last member is gone.
  ~PollerGroup();

  const std::string& name() const { return name_; }
  // What its pollers were made with: the queue and arena pool after the cut, the arena pool's
  // piece size (0: no pool).
  const Shape& made() const { return made_; }
  const std::vector<std::shared_ptr<transport::Poller>>& pollers() const { return pollers_; }
  // A poller for a member's next subchannel, in turn: where its connections go while it has room.
  std::shared_ptr<transport::Poller> NextHome();
  // `home` when it has room for a connection with `options`, else the next poller of the group
  // that has; RESOURCE_EXHAUSTED naming the group when none has.
  absl::StatusOr<std::shared_ptr<transport::Poller>> Place(
      const std::shared_ptr<transport::Poller>& home, const transport::ConnectionOptions& options);
  // The timer its members' passes run on (channel_timer.h): one thread for the group.
  ChannelTimer& timer() { return timer_; }

 private:
  PollerGroup(std::string name, Shape asked, std::shared_ptr<transport::Device> device)
      : name_(std::move(name)), asked_(asked), made_(asked), device_(std::move(device)) {}

  const std::string name_;
  const Shape asked_;  // what members are compared on
  Shape made_;         // set while it is made, then fixed
  // Outlives the pollers (declared first, destroyed last).
  const std::shared_ptr<transport::Device> device_;
  std::vector<std::shared_ptr<transport::Poller>> pollers_;
  std::atomic<uint32_t> next_{0};
  // Its members leave it before they let go of the group, so it has none when destroyed.
  ChannelTimer timer_;
};

}  // namespace zrpc::internal

#endif  // ZRPC_RPC_CLIENT_POLLER_GROUP_H_
