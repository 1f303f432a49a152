#include "transport/poller.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <vector>

#include "absl/strings/str_cat.h"
#include "transport/adaptive_spin.h"
#include "transport/cm_util.h"
#include "transport/connection.h"
#include "transport/log.h"
#include "transport/memory_window.h"
#include "transport/steady_clock.h"
#include "transport/verbs_error.h"
#include "transport/work_request_id.h"

namespace zrpc::transport {
namespace {

// Completions read per ibv_poll_cq call.
constexpr int kBatch = 32;
// CQ events acknowledged together (ibv_ack_cq_events takes a mutex).
constexpr unsigned kAckBatch = 64;

}  // namespace

absl::Status CheckSpin(absl::Duration spin, absl::string_view option) {
  if (spin >= absl::ZeroDuration() && spin <= absl::Seconds(1)) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(option, " is ", absl::FormatDuration(spin), "; it must be in [0, 1s]"));
}

absl::StatusOr<std::unique_ptr<Poller>> Poller::Create(Device& device,
                                                       const PollerOptions& options) {
  std::unique_ptr<Poller> poller(new Poller(options, device.slots()));
  poller->cq_capacity_ = std::min(options.cq_size, device.attr().max_cqe);
  if (poller->cq_capacity_ <= 0) return absl::InvalidArgumentError("cq_size must be positive");
  if (absl::Status s = CheckSpin(options.spin, "PollerOptions::spin"); !s.ok()) return s;
  ibv_comp_channel* channel = nullptr;
  if (options.mode == PollMode::kEvent) {
    poller->comp_channel_.reset(ibv_create_comp_channel(device.context()));
    if (poller->comp_channel_ == nullptr) return VerbsError("ibv_create_comp_channel", errno);
    channel = poller->comp_channel_.get();
    if (auto s = SetNonBlocking(channel->fd, "the completion channel"); !s.ok()) return s;
  }
  poller->cq_.reset(ibv_create_cq(device.context(), poller->cq_capacity_, nullptr, channel, 0));
  if (poller->cq_ == nullptr) return VerbsError("ibv_create_cq", errno);
  if (options.shared_receive_queue > 0) {
    if (options.shared_receive_queue > static_cast<uint32_t>(poller->cq_capacity_) / 2) {
      return absl::InvalidArgumentError(absl::StrCat(
          "PollerOptions::shared_receive_queue is ", options.shared_receive_queue,
          "; the completion queue (", poller->cq_capacity_,
          " entries) takes at most half as many, the rest being for the connections' sends"));
    }
    const uint32_t low_water = options.shared_receive_low_water > 0
                                   ? options.shared_receive_low_water
                                   : std::max<uint32_t>(1, options.shared_receive_queue / 8);
    if (low_water >= options.shared_receive_queue) {
      return absl::InvalidArgumentError(absl::StrCat(
          "PollerOptions::shared_receive_low_water is ", low_water,
          "; it must be below shared_receive_queue (", options.shared_receive_queue, ")"));
    }
    absl::StatusOr<std::unique_ptr<SharedReceiveQueue>> srq = SharedReceiveQueue::Create(
        device, options.shared_receive_queue, low_water, &poller->events_);
    if (!srq.ok()) return srq.status();
    poller->srq_ = *std::move(srq);
    poller->shared_posted_.store(poller->srq_->posted(), std::memory_order_relaxed);
  }
  if (options.arena_pool_pieces > 0) {
    if (options.arena_piece_size == 0 || options.arena_piece_size % kArenaAlign != 0 ||
        options.arena_piece_size > kMaxArenaSize) {
      return absl::InvalidArgumentError(
          absl::StrCat("PollerOptions::arena_piece_size ", options.arena_piece_size,
                       " is not a multiple of ", kArenaAlign, " up to 1 GiB"));
    }
    // Without type-2 windows a piece could only be opened by its region's key, which every queue
    // pair of the device accepts: no pool, and connections keep arenas of their own.
    if (SupportsType2Windows(device.attr())) {
      poller->arena_pool_ = std::make_unique<ArenaPool>(device.pd(), options.arena_piece_size,
                                                        options.arena_pool_pieces);
    }
  }
  if (options.park_windows) {
    if (poller->srq_ == nullptr) {
      return absl::InvalidArgumentError(
          "PollerOptions::park_windows needs a shared_receive_queue: only a shared queue's "
          "windows are lent and taken back");
    }
    // A door per connection the completion queue could hold (each reserves an entry at least).
    absl::StatusOr<std::unique_ptr<ParkDoors>> doors =
        ParkDoors::Create(device.pd(), static_cast<uint32_t>(poller->cq_capacity_));
    if (!doors.ok()) return doors.status();
    poller->doors_ = *std::move(doors);
  }
  // The shared queue's receives may all complete at once: set aside for good. Of the rest, an
  // eighth (at least four grants) is left to sends whatever connections reserve.
  const int64_t entries = poller->cq_capacity_ - int64_t{options.shared_receive_queue};
  poller->cq_budget_.Init(
      entries, std::min<int64_t>(entries, std::max<int64_t>(entries / 8, 4 * kCqGrantChunk)));
  auto cm = CreateCmChannel();
  if (!cm.ok()) return cm.status();
  poller->cm_channel_ = std::move(*cm);
  if (poller->events_.wake_fd() < 0) return VerbsError("eventfd", errno);
  poller->cm_wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (poller->cm_wake_fd_ < 0) return VerbsError("eventfd", errno);
  return poller;
}

Poller::~Poller() {
  Shutdown();
  if (unacked_cq_events_ > 0) ibv_ack_cq_events(cq_.get(), unacked_cq_events_);
  if (cm_wake_fd_ >= 0) close(cm_wake_fd_);
}

void Poller::Shutdown() {
  Stop();
  std::vector<std::shared_ptr<Connection>> open;
  {
    absl::MutexLock lock(&mu_);
    for (auto& [qp_num, connection] : connections_) open.push_back(connection);
  }
  // Close what is still open and drive the drains for a bounded time, so handlers hear of it.
  for (auto& connection : open) connection->Close();
  const bool drain = !open.empty();
  open.clear();
  // Past the watchdog's give-up and its one-second look, with room for what it gives up on to
  // be handled: only a connection whose domain stays held (a handler that never returns) is left.
  const absl::Time deadline = absl::Now() + kDrainGiveUp + absl::Seconds(3);
  while (drain) {
    // The cm thread has stopped: the watchdog runs here, and what it ends is handled by the
    // pass right after it (RunDeferred), not found undrained at the deadline.
    WatchDrains();
    RunOnce(absl::Milliseconds(10));
    {
      absl::MutexLock lock(&mu_);
      if (connections_.empty()) break;
    }
    if (absl::Now() > deadline) {
      std::vector<std::shared_ptr<Connection>> some;  // a few, described outside mu_
      size_t undrained = 0;
      size_t deferred = 0;
      {
        absl::MutexLock lock(&mu_);
        undrained = connections_.size();
        deferred = deferred_.size();
        for (const auto& [qp_num, connection] : connections_) {
          if (some.size() == 3) break;
          some.push_back(connection);
        }
      }
      std::string described;
      for (const auto& connection : some) {
        absl::StrAppend(&described, "; ", connection->peer_address(), ": ",
                        connection->TryDebugString());
      }
      some.clear();
      ZRPC_LOG(kWarning, "transport", "poller shut down with ", undrained,
               " connections that did not drain (", draining_.load(), " draining, ", deferred,
               " deferred)", described);
      absl::MutexLock lock(&mu_);
      for (const auto& [qp_num, connection] : connections_) UnreserveLocked(*connection);
      connections_.clear();
      // The loop's lookups (FindFromLoop) must not find them: a later RunOnce would reach a
      // connection its owners have destroyed meanwhile through the cached plain pointer.
      generation_.fetch_add(1, std::memory_order_release);
      break;
    }
  }
  // The loop has ended, and with it the retries of stashed completions. A connection still listed
  // had its stash emptied by another path after the loop's last retry (OnCompletions handles a
  // stash itself when the domain is free; the list forgets it at the next pass, which never came),
  // or was dropped above without draining, its domain held throughout: what it kept is dropped
  // unhandled with it (sends it holds are never reported, as for any connection given up on).
  // The list's reference must go: the connection co-owns its handler, which may own this poller,
  // so the three would keep one another alive for good.
  for (const std::shared_ptr<Connection>& connection : stashed_) DropStash(*connection);
  stashed_.clear();
  // What the loop kept for its passes goes now, and Unregister drops at once.
  slot_cache_.Flush();
  std::vector<std::shared_ptr<Connection>> released;
  std::vector<std::shared_ptr<Connection>> deferred;
  {
    absl::MutexLock lock(&mu_);
    loop_ended_ = true;
    ended_.store(true, std::memory_order_release);
    released.swap(retired_);
    released.insert(released.end(), cq_waiters_.begin(), cq_waiters_.end());
    cq_waiters_.clear();
    released.insert(released.end(), arena_waiters_.begin(), arena_waiters_.end());
    arena_waiters_.clear();
    released.insert(released.end(), floor_waiters_.begin(), floor_waiters_.end());
    floor_waiters_.clear();
    deferred.swap(deferred_);
    has_deferred_.store(false, std::memory_order_relaxed);
  }
  // Deferred before the end: their tasks run here, as Defer's callers run them from now on.
  for (auto& connection : deferred) connection->ReplayEarly();
}

absl::Status Poller::Start() {
  if (thread_.joinable()) return absl::FailedPreconditionError("poller already started");
  stop_.store(false);
  looping_.store(true);
  cm_thread_ = std::thread([this] { CmLoop(); });
  thread_ = std::thread([this] { Loop(); });
  return absl::OkStatus();
}

void Poller::Stop() {
  stop_.store(true);
  looping_.store(false);
  Wake();
  if (thread_.joinable()) thread_.join();
  if (cm_thread_.joinable()) {
    WakeCm();
    cm_thread_.join();
  }
}

void Poller::WakeCm() {
  uint64_t one = 1;
  // Fails only when the counter would overflow: a wake-up is pending anyway.
  ssize_t written = write(cm_wake_fd_, &one, sizeof(one));
  static_cast<void>(written);
}

void Poller::LookAtCmChannel() {
  WakeCm();  // the cm thread, while the loop runs
  Wake();    // RunOnce, which reads the channel itself
}

bool Poller::AwaitPass(absl::Duration timeout) {
  if (Current() == this) return false;
  // A pass counts itself as it starts: the one running now (if any) is `first`, and once
  // `first` + 2 has started, `first` + 1, which began after this call, has ended.
  const uint64_t first = passes();
  const absl::Time until = absl::Now() + timeout;
  while (passes() < first + 2) {
    if (!looping_.load(std::memory_order_acquire) || absl::Now() >= until) return false;
    Wake();
    absl::SleepFor(absl::Microseconds(200));
  }
  return true;
}

void Poller::Wake() { events_.Wake(); }

void Poller::UnreserveLocked(Connection& connection) {
  // Unregistered once drained (or dropped by Shutdown): nothing of it is in flight any more, and
  // its grant no longer changes.
  const uint32_t reserved = connection.cq_entries_reserved();
  cq_budget_.Unreserve(reserved);
  // An exchange: a connection that goes on running in its domain afterwards (a task left
  // there) must find no grant left to give back a second time.
  cq_budget_.Give(reserved + connection.cq_granted_.exchange(0, std::memory_order_acq_rel));
  // What its window claims of the shared queue, however much it has grown (an exchange too).
  connection.receive_share_.Close();
}

uint32_t Poller::shared_receives_claimed() const {
  return srq_ != nullptr ? srq_->budget().claimed() : 0;
}

uint32_t Poller::parked_windows() const {
  absl::MutexLock lock(&mu_);
  uint32_t parked = 0;
  for (const auto& [qp_num, connection] : connections_) {
    if (connection->window_parked_.load(std::memory_order_relaxed)) ++parked;
  }
  return parked;
}

uint64_t Poller::Capacity(const ConnectionOptions& options) const {
  const bool shared = srq_ != nullptr;
  uint64_t connections = static_cast<uint64_t>(cq_budget_.entries() - cq_budget_.grant_floor()) /
                         CqEntriesReservedFor(options, shared);
  // Windows that park are not bounded by floors: those beyond them start parked.
  if (shared && doors_ == nullptr) {
    const uint32_t floor = std::max<uint32_t>(options.idle_recv_credits, 1);
    connections = std::min<uint64_t>(connections, srq_->budget().floor_size() / floor);
  }
  return connections;
}

bool Poller::HasRoomFor(const ConnectionOptions& options) {
  const bool shared = srq_ != nullptr;
  {
    absl::MutexLock lock(&mu_);
    if (!cq_budget_.Fits(CqEntriesReservedFor(options, shared))) return false;
  }
  // A poller that parks takes a connection without a floor too (parked), but a floor is room.
  return !shared || srq_->budget().floor_free() >= options.idle_recv_credits;
}

absl::Status Poller::Register(const std::shared_ptr<Connection>& connection) {
  const uint32_t reserved = connection->cq_entries_reserved();
  const uint32_t floor = connection->options_.idle_recv_credits;  // of a shared queue's receives
  {
    absl::MutexLock lock(&mu_);
    if (!cq_budget_.Fits(reserved)) {
      // Short: a refusal's reason travels in the reject's private data.
      return absl::ResourceExhaustedError(
          absl::StrCat("completion queue full: ", reserved, " entries needed, ",
                       cq_budget_.reserved(), " of ", cq_capacity_, " reserved, ",
                       cq_budget_.grant_floor(), " kept for sends; use another poller"));
    }
    // An accepted connection on a poller that parks: a door, and a floor if one is free (else it
    // starts parked).
    const bool parks = doors_ != nullptr && connection->accepted_;
    if (parks) {
      connection->door_ = doors_->Take();
      if (!connection->door_.has_value()) {
        return absl::ResourceExhaustedError(
            absl::StrCat("all ", doors_->count(), " park doors taken; use another poller"));
      }
      // Behind windows waiting for a floor, never ahead of them: a storm of new connections must
      // not keep a knock waiting.
      // A connection that authenticates cannot start parked: its client learns where to knock
      // only once its tag is checked, and its tag needs a receive (connection_auth.cc). It takes
      // a floor if one is free, waiters or not, and is refused otherwise.
      const bool authenticates = connection->auth_ != nullptr;
      connection->start_parked_ =
          (!authenticates && !floor_waiters_.empty()) || !srq_->budget().TakeFloor(floor);
      if (connection->start_parked_ && authenticates) {
        doors_->Give(connection->door_->index);
        connection->door_.reset();
        connection->start_parked_ = false;
        return absl::ResourceExhaustedError(absl::StrCat(
            "no receive floor free for a connection that authenticates (it cannot start parked); "
            "use another poller"));
      }
    } else if (srq_ != nullptr && !srq_->budget().TakeFloor(floor)) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "the poller's shared receive queue (", srq_->size(), " receives, ",
          srq_->budget().floor_size(), " of them for floors) cannot back another floor of ", floor,
          "; use another poller"));
    }
    cq_budget_.Reserve(reserved);
  }
  // The reservation fits, but connections' sends may hold the entries: the holders are asked
  // now (an idle one gives its grant back at once, on this thread when its domain is free), and
  // the busy ones by the loop, a millisecond at a time, for up to 100 ms. A caller on a poller
  // thread, or of a poller whose loop does not run, cannot wait for a loop.
  bool taken = cq_budget_.Take(reserved);
  if (!taken) {
    AskCqHolders();
    taken = cq_budget_.Take(reserved);
  }
  for (int i = 0; !taken && i < 100 && !OnPollerThread() && looping_.load(); ++i) {
    RequestCqEntries();
    absl::SleepFor(absl::Milliseconds(1));
    taken = cq_budget_.Take(reserved);
  }
  absl::MutexLock lock(&mu_);
  if (!taken) {
    cq_budget_.Unreserve(reserved);
    if (srq_ != nullptr && !connection->start_parked_) srq_->budget().GiveFloor(floor);
    if (connection->door_.has_value()) {
      doors_->Give(connection->door_->index);
      connection->door_.reset();
      connection->start_parked_ = false;
    }
    return absl::ResourceExhaustedError(
        absl::StrCat("completion queue: ", reserved,
                     " entries not free (its connections' sends hold them; waited ",
                     looping_.load() && !OnPollerThread() ? "100 ms)" : "not: no loop to ask)"));
  }
  if (srq_ != nullptr) {
    connection->receive_share_.Open(&srq_->budget(), connection->start_parked_ ? 0 : floor);
  }
  if (connection->start_parked_) {
    connection->window_parked_.store(true, std::memory_order_relaxed);
    watched_doors_[connection->door_->index] =
        DoorWatch{connection->qp_num(), connection->door_->token};
    doors_watched_.store(static_cast<uint32_t>(watched_doors_.size()), std::memory_order_relaxed);
  }
  connections_[connection->qp_num()] = connection;
  generation_.fetch_add(1, std::memory_order_release);
  return absl::OkStatus();
}

void Poller::WaitForCqEntries(std::shared_ptr<Connection> connection) {
  cq_waits_.fetch_add(1, std::memory_order_relaxed);
  {
    absl::MutexLock lock(&mu_);
    cq_waiters_.push_back(std::move(connection));
  }
  RequestCqEntries();
}

void Poller::RequestCqEntries() {
  if (!cq_short_.exchange(true, std::memory_order_acq_rel)) Wake();
}

void Poller::ServeCqShortage() {
  const int64_t now = SpinClockNanos();
  if (now - cq_served_ns_ < 1'000'000) return;
  cq_served_ns_ = now;
  // Cleared first: a waiter that still finds no entry, or a registration still waiting, sets it
  // again. Busy holders give back what they do not use, and the rest once their sends complete
  // while it is set.
  cq_short_.store(false, std::memory_order_release);
  std::vector<std::shared_ptr<Connection>> waiters;
  {
    absl::MutexLock lock(&mu_);
    waiters.swap(cq_waiters_);
  }
  // Holders first: the entries they give back are there when the waiters' passes run. (A
  // waiter that holds entries too is asked twice: its pass, then what it does not use.)
  AskCqHolders();
  for (auto& waiter : waiters) waiter->AskForCqEntries();
}

void Poller::WaitForArena(std::shared_ptr<Connection> connection) {
  arena_waits_.fetch_add(1, std::memory_order_relaxed);
  {
    absl::MutexLock lock(&mu_);
    arena_waiters_.push_back(std::move(connection));
  }
  if (!arena_short_.exchange(true, std::memory_order_acq_rel)) Wake();
}

void Poller::GiveArenaPiece(uint32_t piece) {
  arena_pool_->Give(piece);
  bool waiting = false;
  {
    absl::MutexLock lock(&mu_);
    waiting = !arena_waiters_.empty();
  }
  if (waiting && !arena_short_.exchange(true, std::memory_order_acq_rel)) Wake();
}

void Poller::ServeArenaShortage() {
  const int64_t now = SpinClockNanos();
  if (now - arena_served_ns_ < 1'000'000) return;
  arena_served_ns_ = now;
  // Holders are looked at less often than waiters are served: a loan that took no payload
  // between two looks is recalled, so the interval is the idle time that costs a loan.
  const bool look_at_holders = now - arena_holders_asked_ns_ >= 10'000'000;
  if (look_at_holders) arena_holders_asked_ns_ = now;
  // Cleared first: a waiter that still finds no piece sets it again.
  arena_short_.store(false, std::memory_order_release);
  std::vector<std::shared_ptr<Connection>> waiters;
  std::vector<std::shared_ptr<Connection>> holders;
  {
    absl::MutexLock lock(&mu_);
    waiters.swap(arena_waiters_);
    if (!waiters.empty() && look_at_holders) {
      for (const auto& [qp_num, connection] : connections_) {
        if (connection->arena_lent_.load(std::memory_order_relaxed)) holders.push_back(connection);
      }
    }
  }
  // Holders first: a loan idle since the last look is recalled, and comes back once its peer
  // returns it (a frame's round trip), when the waiters are asked again (GiveArenaPiece).
  for (auto& holder : holders) holder->AskForArena();
  for (auto& waiter : waiters) waiter->AskForArena();
}

void Poller::WatchDoor(uint32_t qp_num, uint32_t door, uint32_t token) {
  absl::MutexLock lock(&mu_);
  if (connections_.find(qp_num) == connections_.end()) return;  // unregistered meanwhile
  watched_doors_[door] = DoorWatch{qp_num, token};
  doors_watched_.store(static_cast<uint32_t>(watched_doors_.size()), std::memory_order_relaxed);
}

void Poller::WaitForFloor(std::shared_ptr<Connection> connection) {
  {
    absl::MutexLock lock(&mu_);
    floor_waiters_.push_back(std::move(connection));
  }
  if (!floor_short_.exchange(true, std::memory_order_acq_rel)) Wake();
}

void Poller::FloorGivenBack() {
  bool waiting = false;
  {
    absl::MutexLock lock(&mu_);
    waiting = !floor_waiters_.empty();
  }
  if (waiting && !floor_short_.exchange(true, std::memory_order_acq_rel)) Wake();
}

void Poller::ServeParking() {
  const int64_t now = SpinClockNanos();
  if (now - park_served_ns_ < 1'000'000) return;
  park_served_ns_ = now;
  std::vector<std::shared_ptr<Connection>> heard;
  std::vector<std::shared_ptr<Connection>> asked;
  {
    absl::MutexLock lock(&mu_);
    // The doors of parked windows: any change from the armed value is a knock (park_doors.h).
    for (auto it = watched_doors_.begin(); it != watched_doors_.end();) {
      const auto current = it++;
      const uint32_t door = current->first;
      const uint64_t value = doors_->Read(door);
      if (value == doors_->armed(door)) continue;
      if (value >> 32 != current->second.token) {
        foreign_knocks_.fetch_add(1, std::memory_order_relaxed);
      }
      knocks_heard_.fetch_add(1, std::memory_order_relaxed);
      doors_->Rearm(door);
      auto found = connections_.find(current->second.qp_num);
      if (found != connections_.end()) heard.push_back(found->second);
      watched_doors_.erase(current);
    }
    doors_watched_.store(static_cast<uint32_t>(watched_doors_.size()), std::memory_order_relaxed);
    // Waiters stay listed (and floor_short_ set) until a floor is free for them: then each has
    // a try, and one that finds none lists itself again. Meanwhile, every 10 ms, the windows not
    // parked are looked at: those idle since the last look park, and their floors come back as
    // their peers answer.
    floor_short_.store(!floor_waiters_.empty(), std::memory_order_release);
    if (!floor_waiters_.empty()) {
      if (now - park_holders_asked_ns_ >= 10'000'000) {
        park_holders_asked_ns_ = now;
        for (const auto& [qp_num, connection] : connections_) {
          if (connection->door_.has_value() &&
              !connection->window_parked_.load(std::memory_order_relaxed)) {
            asked.push_back(connection);
          }
        }
      }
      // The largest floor a waiter needs: every waiter is tried once that many are free.
      uint32_t waiter_floor = 0;
      for (const auto& waiter : floor_waiters_) {
        waiter_floor = std::max(waiter_floor, waiter->options_.idle_recv_credits);
      }
      if (srq_->budget().floor_free() >= waiter_floor) {
        asked.insert(asked.end(), floor_waiters_.begin(), floor_waiters_.end());
        floor_waiters_.clear();
      }
    }
  }
  for (auto& connection : heard) connection->KnockHeard();
  for (auto& connection : asked) connection->AskForPark();
}

void Poller::AskCqHolders() {
  std::vector<std::shared_ptr<Connection>> holders;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [qp_num, connection] : connections_) {
      if (connection->cq_granted_.load(std::memory_order_relaxed) > 0) {
        holders.push_back(connection);
      }
    }
  }
  for (auto& holder : holders) holder->AskForCqEntries();
}

void Poller::Unregister(uint32_t qp_num) {
  std::shared_ptr<Connection> last;  // dropped after the lock
  absl::MutexLock lock(&mu_);
  auto it = connections_.find(qp_num);
  if (it == connections_.end()) return;
  UnreserveLocked(*it->second);
  if (const auto& door = it->second->door_; door.has_value()) {
    // The door goes back with the connection (a late knock of its peer's on the next holder's
    // door only opens that one's window needlessly: park_doors.h).
    watched_doors_.erase(door->index);
    doors_watched_.store(static_cast<uint32_t>(watched_doors_.size()), std::memory_order_relaxed);
    doors_->Give(door->index);
    // Nor does it wait for a floor any more (its reference would keep it alive for as long as
    // no floor comes back).
    const Connection* gone = it->second.get();
    floor_waiters_.erase(
        std::remove_if(floor_waiters_.begin(), floor_waiters_.end(),
                       [&](const std::shared_ptr<Connection>& c) { return c.get() == gone; }),
        floor_waiters_.end());
    if (!floor_waiters_.empty()) floor_short_.store(true, std::memory_order_relaxed);
  }
  last = std::move(it->second);
  connections_.erase(it);
  generation_.fetch_add(1, std::memory_order_release);
  // Once the loop has ended no pass holds it, unless this is one (a RunOnce after Shutdown, or
  // another poller's pass): `last` then goes after the lock.
  if (loop_ended_ && !OnPollerThread()) return;
  // A pass may be using it (FindFromLoop): the loop drops this reference after its pass.
  retired_.push_back(std::move(last));
  has_retired_.store(true, std::memory_order_release);
  Wake();  // an idle loop in event mode releases it now, not at its next completion
}

void Poller::ReleaseRetired() {
  if (!has_retired_.load(std::memory_order_acquire)) return;
  std::vector<std::shared_ptr<Connection>> released;
  {
    absl::MutexLock lock(&mu_);
    released.swap(retired_);
    has_retired_.store(false, std::memory_order_relaxed);
  }
  // Destroyed here, outside the lock and between passes: a connection's destructor may take it.
}

bool Poller::Defer(std::shared_ptr<Connection> connection) {
  {
    absl::MutexLock lock(&mu_);
    if (loop_ended_) return false;
    deferred_.push_back(std::move(connection));
  }
  has_deferred_.store(true, std::memory_order_release);
  Wake();
  return true;
}

void Poller::RunDeferred() {
  if (!has_deferred_.load(std::memory_order_acquire)) return;
  std::vector<std::shared_ptr<Connection>> work;
  {
    absl::MutexLock lock(&mu_);
    work.swap(deferred_);
    has_deferred_.store(false, std::memory_order_relaxed);
  }
  for (auto& connection : work) connection->ReplayEarly();
}

std::shared_ptr<Connection> Poller::Find(uint32_t qp_num) {
  absl::MutexLock lock(&mu_);
  auto it = connections_.find(qp_num);
  return it == connections_.end() ? nullptr : it->second;
}

Connection* Poller::FindFromLoop(uint32_t qp_num) {
  // Read before the lookup: a change after it makes the entry stale at the next look.
  const uint64_t generation = generation_.load(std::memory_order_acquire);
  CachedConnection& entry = found_[qp_num % kFoundCache];
  if (entry.qp_num == qp_num && entry.generation == generation) return entry.connection;
  // The reference Find returns is not the last one: connections_ or retired_ holds another until
  // this pass ends.
  Connection* connection = Find(qp_num).get();
  entry = CachedConnection{qp_num, generation, connection};
  return connection;
}

namespace {
thread_local Poller* current_poller = nullptr;  // whose loop this thread runs now
thread_local uint64_t current_batch = 0;        // 0: not in a batch
thread_local uint64_t batches = 0;              // this thread's batches so far

// Marks the calling thread as running `poller`'s loop for the scope's length.
class PollerThreadScope {
 public:
  explicit PollerThreadScope(Poller* poller) : was_(current_poller) { current_poller = poller; }
  ~PollerThreadScope() { current_poller = was_; }

 private:
  Poller* was_;
};
}  // namespace

bool Poller::OnPollerThread() { return current_poller != nullptr; }
Poller* Poller::Current() { return current_poller; }
uint64_t Poller::CurrentBatch() { return current_batch; }

void Poller::Loop() {
  PollerThreadScope scope(this);
  const bool event = options_.mode == PollMode::kEvent;
  const int64_t cap_ns = absl::ToInt64Nanoseconds(options_.spin);  // in [0, 1s]: CheckSpin
  // Event mode: the budget learns from how long the idle stretches between completions last
  // (adaptive_spin.h). An idle stretch starts at the first empty pass after a completion and
  // ends at the next completion, sleeping included: that is a round trip for a caller, the time
  // between requests for a server.
  AdaptiveSpin spin;
  int64_t idle_since = 0;  // 0: the last pass found completions
  int64_t spin_until = 0;
  bool after_traffic = false;  // the wait before the first completion is not a round trip
  auto traffic = [&] {
    if (idle_since != 0 && after_traffic) spin.Observe(SpinClockNanos() - idle_since, cap_ns);
    idle_since = 0;
    after_traffic = true;
  };
  while (!stop_.load(std::memory_order_relaxed)) {
    CountPass();
    ReleaseRetired();
    RunDeferred();
    // Completions that waited for a domain another thread held come before newer ones.
    const bool stashed = RetryStashed();
    const int polled = PollCq();
    // After the pass's completions: a failed completion says more than the disconnect that
    // followed it (a peer that broke the protocol, then hung up).
    RunCmEvents(polled);
    if (cq_short_.load(std::memory_order_relaxed)) ServeCqShortage();
    if (arena_short_.load(std::memory_order_relaxed)) ServeArenaShortage();
    if (ABSL_PREDICT_FALSE(ParkingDue())) ServeParking();
    if (!event || stashed) continue;
    if (polled > 0) {
      if (cap_ns > 0) traffic();
      continue;
    }
    // Adaptive polling: an answer usually follows a completion within a round trip, and catching
    // it by polling saves the interrupt, the wake-up and the re-arm that sleeping would cost.
    if (cap_ns > 0) {
      const int64_t now = SpinClockNanos();
      if (idle_since == 0) {
        idle_since = now;
        const int64_t budget = spin.BudgetNanos(cap_ns);
        spin_budget_ns_.store(budget, std::memory_order_relaxed);
        spin_until = now + budget;
      }
      if (now < spin_until) continue;
    }
    // A wake-up that brings no completion (a Wake, a cm event) does not end the idle stretch:
    // only completions do (here, those the re-poll after arming found; above, the others).
    // A shared receive queue that the exhausted pool left short is refilled by the passes, and
    // connections waiting for completion-queue entries or an arena are served by them: meanwhile
    // the loop sleeps a millisecond at most.
    const bool starved = (srq_ != nullptr && srq_->short_of_slots()) ||
                         cq_short_.load(std::memory_order_relaxed) ||
                         arena_short_.load(std::memory_order_relaxed) || ParkingDue();
    if (ArmAndWait(starved ? 1 : -1, /*with_cm=*/false) && cap_ns > 0) traffic();
  }
}

void Poller::CmLoop() {
  // Sleeps until the cm channel has an event or Stop() writes cm_wake_fd_: no system call, no
  // allocation while nothing happens (rdma_get_cm_event on an empty channel costs a malloc and a
  // failing write(2), which the loop used to pay every 1024 passes). Events are queued for the
  // loop, which applies them after its next look at the CQ (RunCmEvents).
  pollfd fds[2] = {{cm_channel_->fd, POLLIN, 0}, {cm_wake_fd_, POLLIN, 0}};
  while (!stop_.load(std::memory_order_relaxed)) {
    // Timed only while a connection drains: its watchdog (WatchDrains).
    const bool watch = draining_.load(std::memory_order_acquire) > 0;
    if (poll(fds, 2, watch ? 1000 : -1) < 0) {
      if (errno == EINTR) continue;
      ZRPC_LOG(kError, "transport", "poll on the cm channel failed (errno ", errno, ")");
      return;
    }
    if (fds[1].revents & POLLIN) {
      // Stop, or LookAtCmChannel: an event that moved with a migrated id raises no POLLIN.
      uint64_t count = 0;
      ssize_t got = read(cm_wake_fd_, &count, sizeof(count));
      static_cast<void>(got);
    }
    if (fds[0].revents & POLLIN || fds[1].revents & POLLIN) HandleCmEvents(/*queue=*/true);
    if (draining_.load(std::memory_order_acquire) > 0) WatchDrains();
  }
}

void Poller::WatchDrains() {
  const int64_t now_ns = SteadyNanos();
  {
    absl::MutexLock lock(&drain_watch_mu_);
    if (now_ns < next_drain_watch_ns_) return;
    next_drain_watch_ns_ = now_ns + absl::ToInt64Nanoseconds(absl::Seconds(1));
  }
  const int64_t limit = absl::ToInt64Nanoseconds(kDrainGiveUp);
  std::vector<std::shared_ptr<Connection>> overdue;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [qp_num, connection] : connections_) {
      const int64_t since = connection->draining_since_ns_.load(std::memory_order_relaxed);
      if (since != 0 && now_ns - since > limit) overdue.push_back(connection);
    }
  }
  for (const auto& connection : overdue) connection->GiveUpOnDrain();
}

void Poller::RunQueuedEvents(int polled) {
  // Cleared before the lists are taken: whatever is queued after this sets it again.
  events_.pending.store(false, std::memory_order_seq_cst);
  bool cq_emptied = false;
  for (const DeviceEventSink::QueuePairError& error : events_.TakeQueuePairErrors()) {
    std::shared_ptr<Connection> connection = Find(error.qp_num);
    if (connection == nullptr || connection->queue_pair() != error.qp) continue;
    if (error.type == IBV_EVENT_QP_LAST_WQE_REACHED && !cq_emptied) {
      // The completions of the queue pair's last receives came before the event, but perhaps
      // after this pass's look at the CQ: the connection hears of it only once the CQ has been
      // polled empty (its drain ends on it: shared_receive_queue.h, "Teardown").
      while (PollCq() == kBatch) {
      }
      cq_emptied = true;
    }
    connection->OnDeviceEvent(error.type);
  }
  if (srq_ != nullptr) {
    // The device said the shared queue ran low (shared_receive_queue.h, "Low water"): windows
    // are held to their floors until the queue is posted full and the completion queue drained
    // (a look short of a full batch; before that the next arrival would report it again at
    // once), and the report is armed anew. Looked at on every pass until then.
    const uint64_t reports = events_.shared_queue_low_reports();
    if (reports != low_reports_seen_) {
      low_reports_seen_ = reports;
      srq_->OnLowReported();
    }
    if (srq_->budget().device_low()) {
      if (!srq_->short_of_slots() && polled < kBatch) {
        srq_->Rearm();
      } else {
        events_.pending.store(true, std::memory_order_relaxed);
      }
    }
  }
  std::vector<std::pair<uint32_t, rdma_cm_event_type>> events;
  {
    absl::MutexLock lock(&mu_);
    events.swap(cm_events_);
  }
  for (const auto& [qp_num, type] : events) {
    if (auto connection = Find(qp_num)) connection->OnCmEvent(type);
  }
}

int Poller::RunOnce(absl::Duration wait) {
  PollerThreadScope scope(this);
  CountPass();
  ReleaseRetired();
  RunDeferred();
  const bool stashed = RetryStashed();
  int n = PollCq();
  RunCmEvents(n);  // queued by the cm thread before it stopped
  HandleCmEvents(/*queue=*/false);
  if (cq_short_.load(std::memory_order_relaxed)) ServeCqShortage();
  if (arena_short_.load(std::memory_order_relaxed)) ServeArenaShortage();
  if (ParkingDue()) ServeParking();
  if (n == 0 && !stashed && options_.mode == PollMode::kEvent && wait > absl::ZeroDuration()) {
    int timeout_ms = static_cast<int>(absl::ToInt64Milliseconds(wait));
    if (cq_short_.load(std::memory_order_relaxed) || arena_short_.load(std::memory_order_relaxed) ||
        ParkingDue()) {
      timeout_ms = std::min(timeout_ms, 1);
    }
    ArmAndWait(timeout_ms, /*with_cm=*/true);
    n = PollCq();
  }
  return n;
}

int Poller::PollCq() {
  ibv_wc wcs[kBatch];
  int n = ibv_poll_cq(cq_.get(), kBatch, wcs);
  if (n < 0) {
    ZRPC_LOG(kError, "transport", "ibv_poll_cq failed (", n, ")");
    return 0;
  }
  // Completions of one connection tend to come together: each run of them is looked up once and
  // handled under one lock of the connection (Connection::OnCompletions).
  if (n > 0) current_batch = ++batches;
  // Nothing to take, and nothing left short by an exhausted pool: the busy loop's empty pass.
  if (srq_ != nullptr && (n > 0 || srq_->short_of_slots())) TakeSharedReceives(wcs, n);
  for (int i = 0; i < n;) {
    const uint32_t qp_num = wcs[i].qp_num;
    int end = i + 1;
    while (end < n && wcs[end].qp_num == qp_num) ++end;
    // A completion of a connection already gone (flushed after it was unregistered) is dropped:
    // the connection freed its slots when it was destroyed, but not a shared queue's receive
    // that came for it, whose slot the queue handed on (TakeSharedReceives): that goes back.
    if (Connection* connection = FindFromLoop(qp_num)) {
      if (!connection->OnCompletions(absl::MakeConstSpan(&wcs[i], static_cast<size_t>(end - i))) &&
          !connection->stash_listed_) {
        connection->stash_listed_ = true;
        stashed_.push_back(connection->shared_from_this());
      }
    } else if (srq_ != nullptr) {
      // Completions of a connection already gone: nobody else will give their slots back.
      FreeSharedReceiveSlots(absl::MakeConstSpan(&wcs[i], static_cast<size_t>(end - i)));
    }
    i = end;
  }
  current_batch = 0;
  return n;
}

void Poller::TakeSharedReceives(ibv_wc* wcs, int n) {
  for (int i = 0; i < n; ++i) {
    uint64_t& id = wcs[i].wr_id;
    if (!IsSharedReceiveId(id)) continue;
    // The entry's slot goes with the completion to its connection; the entry is posted again
    // with a fresh slot before any connection handles the batch (and sends the credits the
    // queue's receives back).
    const uint32_t slot = srq_->Take(WorkRequestIndex(id), slot_cache_);
    id = kRecvBit | kSharedBit | slot;
    // An entry that was not posted: the device broke the queue's bookkeeping. The connection
    // fails on it (nothing is read from a slot that is not there).
    if (slot == SlotPool::kNoSlot) wcs[i].status = IBV_WC_GENERAL_ERR;
  }
  srq_->Post(slot_cache_);
  srq_->Refill(slot_cache_);  // entries an exhausted pool left short, now or before
  shared_posted_.store(srq_->posted(), std::memory_order_relaxed);
}

void Poller::HandleCmEvents(bool queue) {
  bool queued = false;
  for (;;) {
    rdma_cm_event* event = nullptr;
    if (rdma_get_cm_event(cm_channel_.get(), &event) != 0) break;  // EAGAIN: none
    // id->context holds the QP number, set before the id moved here. Ack before acting: the
    // connection's destructor (rdma_destroy_id) waits for the ack of its events.
    auto qp_num = static_cast<uint32_t>(reinterpret_cast<uintptr_t>(event->id->context));
    rdma_cm_event_type type = event->event;
    rdma_ack_cm_event(event);
    if (!queue) {
      if (auto connection = Find(qp_num)) connection->OnCmEvent(type);
      continue;
    }
    absl::MutexLock lock(&mu_);
    cm_events_.emplace_back(qp_num, type);
    events_.pending.store(true, std::memory_order_release);
    queued = true;
  }
  if (queued) Wake();
}

void Poller::FreeSharedReceiveSlots(absl::Span<const ibv_wc> wcs) {
  for (const ibv_wc& wc : wcs) {
    if (IsSharedReceiveId(wc.wr_id)) {
      static_cast<void>(slot_cache_.Free(WorkRequestIndex(wc.wr_id)));
    }
  }
}

void Poller::DropStash(Connection& connection) {
  FreeSharedReceiveSlots(connection.stash_);
  connection.stash_.clear();
  connection.stash_listed_ = false;
}

bool Poller::RetryStashed() {
  if (stashed_.empty()) return false;
  size_t kept = 0;
  for (size_t i = 0; i < stashed_.size(); ++i) {
    if (stashed_[i]->RetryStashed()) {
      stashed_[i]->stash_listed_ = false;
    } else {
      stashed_[kept++] = std::move(stashed_[i]);
    }
  }
  stashed_.resize(kept);
  return kept > 0;
}

bool Poller::ArmAndWait(int timeout_ms, bool with_cm) {
  if (int rc = ibv_req_notify_cq(cq_.get(), 0); rc != 0) {
    ZRPC_LOG(kError, "transport", "ibv_req_notify_cq failed (", rc, ")");
    return false;
  }
  // Anything that arrived before arming raised no event: look once more before sleeping.
  if (PollCq() > 0) return true;
  pollfd fds[3] = {
      {comp_channel_->fd, POLLIN, 0}, {events_.wake_fd(), POLLIN, 0}, {cm_channel_->fd, POLLIN, 0}};
  if (poll(fds, with_cm ? 3 : 2, timeout_ms) <= 0) return false;
  wakeups_.store(wakeups_.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
  if (fds[0].revents & POLLIN) {
    // One read: the CQ was armed once, so it raised at most one event since. Reading until
    // EAGAIN would cost a failing read(2) per wake-up.
    ibv_cq* cq = nullptr;
    void* context = nullptr;
    if (ibv_get_cq_event(comp_channel_.get(), &cq, &context) == 0 &&
        ++unacked_cq_events_ >= kAckBatch) {
      ibv_ack_cq_events(cq_.get(), unacked_cq_events_);
      unacked_cq_events_ = 0;
    }
  }
  if (with_cm && (fds[2].revents & POLLIN)) HandleCmEvents(/*queue=*/false);
  if (fds[1].revents & POLLIN) {
    uint64_t count = 0;
    // Nothing to do on failure: the eventfd is non-blocking and only its readiness matters.
    ssize_t got = read(events_.wake_fd(), &count, sizeof(count));
    static_cast<void>(got);
  }
  return false;
}

}  // namespace zrpc::transport
