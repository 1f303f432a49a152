// PollerGroup (poller_group.h): the process's registry of groups, and a group's placement.

#include "rpc/client/poller_group.h"

#include <thread>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "rpc/common/runtime.h"

namespace zrpc::internal {
namespace {

struct Registry {
  absl::Mutex mu;
  absl::flat_hash_map<std::string, std::weak_ptr<PollerGroup>> groups ABSL_GUARDED_BY(mu);
};

Registry& TheRegistry() {
  static Registry* registry = new Registry;  // never destroyed: channels may outlive main
  return *registry;
}

std::string Describe(const PollerGroup::Shape& shape) {
  return absl::StrCat(
      "pollers = ", shape.pollers,
      ", poll_mode = ", shape.poll_mode == transport::PollMode::kBusy ? "kBusy" : "kEvent",
      ", spin = ", absl::FormatDuration(shape.spin),
      ", shared_receive_queue = ", shape.shared_receive_queue, ", arena_pool = ", shape.arena_pool,
      " of ", shape.arena_piece, "-byte arenas (connection.arena_size), ",
      shape.manual ? "manually driven, " : "", "device ", shape.device->selection().device,
      " and its slot pool (device, slots)");
}

bool Same(const PollerGroup::Shape& a, const PollerGroup::Shape& b) {
  return a.device == b.device && a.pollers == b.pollers && a.poll_mode == b.poll_mode &&
         a.spin == b.spin && a.shared_receive_queue == b.shared_receive_queue &&
         a.arena_pool == b.arena_pool && a.arena_piece == b.arena_piece && a.manual == b.manual;
}

}  // namespace

absl::StatusOr<std::shared_ptr<PollerGroup>> PollerGroup::Join(
    const ChannelOptions& options, const std::shared_ptr<transport::Device>& device, bool manual) {
  Shape shape;
  shape.device = device.get();
  shape.pollers = options.pollers;
  shape.poll_mode = options.poll_mode;
  shape.spin = options.spin;
  shape.shared_receive_queue = options.shared_receive_queue;
  const bool pool = options.arena_pool > 0 && options.connection.arena_size > 0;
  shape.arena_pool = pool ? options.arena_pool : 0;
  shape.arena_piece = pool ? options.connection.arena_size : 0;
  shape.manual = manual;
  Registry& registry = TheRegistry();
  absl::MutexLock lock(&registry.mu);
  std::weak_ptr<PollerGroup>& slot = registry.groups[options.poller_group];
  if (std::shared_ptr<PollerGroup> live = slot.lock()) {
    if (!Same(live->asked_, shape)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "ChannelOptions::poller_group \"", options.poller_group,
          "\": its first channel asked for ", Describe(live->asked_), "; this channel asks for ",
          Describe(shape), ": every channel of a group must shape its pollers alike"));
    }
    return live;
  }
  // Made under the registry's lock: a second channel joining meanwhile finds it whole.
  std::shared_ptr<PollerGroup> group(new PollerGroup(options.poller_group, shape, device));
  Shape& made = group->made_;
  made.shared_receive_queue = SharedQueueWithinLockedMemory(
      SharedQueueOnDevice(*device, shape.shared_receive_queue, "channel"), options.slots.slot_size,
      options.pollers, options.connection.idle_recv_credits, "channel");
  made.arena_pool =
      ArenaPoolWithinLockedMemory(shape.arena_pool, shape.arena_piece, options.pollers, "channel");
  if (made.arena_pool == 0) made.arena_piece = 0;
  RuntimeOptions runtime = options;
  runtime.shared_receive_queue = made.shared_receive_queue;
  runtime.arena_pool = made.arena_pool;
  for (int i = 0; i < options.pollers; ++i) {
    absl::StatusOr<std::shared_ptr<transport::Poller>> poller =
        StartPoller(*device, runtime, manual, made.arena_piece);
    if (!poller.ok()) return poller.status();  // the group, and its pollers made, go
    group->pollers_.push_back(*std::move(poller));
  }
  slot = group;
  return group;
}

std::shared_ptr<PollerGroup> PollerGroup::Find(const std::string& name) {
  Registry& registry = TheRegistry();
  absl::MutexLock lock(&registry.mu);
  auto it = registry.groups.find(name);
  return it == registry.groups.end() ? nullptr : it->second.lock();
}

// Its registry entry stays, expired, until a group of the same name replaces it (a name each, as
// few as the application chooses): a destructor that took the registry's lock could run under it,
// when Join fails half-way.
PollerGroup::~PollerGroup() {
  // On one of its own pollers' threads (a channel that failed to create, made by a callback, and
  // the group's last member): a poller cannot join its own thread, so another thread stops them.
  for (const auto& poller : pollers_) {
    if (transport::Poller::Current() == poller.get()) {
      std::thread([pollers = std::move(pollers_)] {
        for (const auto& p : pollers) p->Shutdown();
      }).detach();
      return;
    }
  }
  for (auto& poller : pollers_) poller->Shutdown();
}

std::shared_ptr<transport::Poller> PollerGroup::NextHome() {
  return pollers_[next_.fetch_add(1, std::memory_order_relaxed) % pollers_.size()];
}

absl::StatusOr<std::shared_ptr<transport::Poller>> PollerGroup::Place(
    const std::shared_ptr<transport::Poller>& home, const transport::ConnectionOptions& options) {
  if (home->HasRoomFor(options)) return home;
  // The pollers after home's, in turn, so that what overflows is spread.
  size_t at = 0;
  while (at < pollers_.size() && pollers_[at] != home) ++at;
  for (size_t k = 1; k < pollers_.size(); ++k) {
    const auto& poller = pollers_[(at + k) % pollers_.size()];
    if (poller->HasRoomFor(options)) return poller;
  }
  return absl::ResourceExhaustedError(absl::StrCat(
      "every poller of ChannelOptions::poller_group \"", name_, "\" is full (", pollers_.size(),
      " pollers: their completion queues' entries or shared receive queues' floors); raise the "
      "group's pollers or shared_receive_queue"));
}

}  // namespace zrpc::internal
