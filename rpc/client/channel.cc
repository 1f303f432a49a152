// ClientChannel (rpc/channel.h) and ChannelImpl: target and options, the subchannels calls are
// spread over (subchannel.h), the timer thread, and the Channel calls generated stubs make.

#include "rpc/channel.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <limits>
#include <mutex>
#include <string>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/attributes.h"
#include "absl/base/optimization.h"
#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"
#include "absl/hash/hash.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "rpc/bulk/registration.h"
#include "rpc/bulk/staging.h"
#include "rpc/client/channel_timer.h"
#include "rpc/client/client_connection.h"
#include "rpc/client/client_stream.h"
#include "rpc/client/intercepted_call.h"
#include "rpc/client/poller_group.h"
#include "rpc/client/retry.h"
#include "rpc/client/subchannel.h"
#include "rpc/common/call_clock.h"
#include "rpc/common/host_port.h"
#include "rpc/common/monotonic.h"
#include "rpc/common/runtime.h"
#include "rpc/common/shared_device.h"
#include "rpc/connection/rpc_header.h"
#include "rpc/impl/block_cache.h"
#include "transport/adaptive_spin.h"
#include "transport/arena_pool.h"
#include "transport/log.h"

namespace zrpc {
namespace internal {
namespace {

// What AcquireSendSlot hands to StartUnaryCall through SendSlot::token: the connection the slot
// belongs to (a slot must be sent, or given back, on the connection it was taken from).
// A request too large for the slot is serialized into `large` instead (the slot then carries
// only the header: WIRE.md, "Messages larger than a slot").
// On a runtime thread that finds no free slot, the request is serialized into `large` whatever
// its size and `waiting` is set: there is no slot, and the call waits in its connection's queue
// (ClientConnection::StartWaiting).
struct SlotTicket {
  std::shared_ptr<ClientConnection> connection;
  transport::SendBuffer buffer;
  uint8_t* large = nullptr;  // malloc'd; freed by the OutgoingBulk it becomes, or the ticket
  bool waiting = false;
  CallTiming timing;  // read when AcquireSendSlot began: the call's start
  // The call's interceptors (a channel with some: AcquireSendSlot), taken by the call's start.
  InterceptedCall* intercepted = nullptr;
  // A call a retry may make again that found no slot (SlotForRetry, below): why. There
  // is no connection; the request goes into `large`, and StartUnaryCall hands it to the retries.
  absl::Status* unsent = nullptr;
  ~SlotTicket() {
    std::free(large);
    if (ABSL_PREDICT_FALSE(intercepted != nullptr)) EndUnstarted(intercepted);
    if (ABSL_PREDICT_FALSE(unsent != nullptr)) delete unsent;
  }
  // A start that never took the interceptors' call: it never began. Out of line, so that the
  // ticket's destruction stays small enough to inline where calls start.
  ABSL_ATTRIBUTE_NOINLINE static void EndUnstarted(InterceptedCall* call) {
    call->End(absl::CancelledError("the call was not started"));
    delete call;
  }
  // Gives the slot back (a call that ends before it is sent).
  void ReleaseSlot() {
    if (!waiting) connection->connection().ReleaseSendBuffer(buffer);
  }
};

// The reason a ticket of SlotForRetry's carries, taken, its interceptors (if any) ended with it:
// that attempt is over.
absl::Status TakeUnsent(SlotTicket& ticket) {
  absl::Status unsent = std::move(*ticket.unsent);
  if (ticket.intercepted != nullptr) {
    ticket.intercepted->End(unsent);
    delete std::exchange(ticket.intercepted, nullptr);
  }
  return unsent;
}

// Whether a unary call to `method` with `options` is one a retry may make again (retry.h), on
// a channel that retries (one with a Retrier).
bool Retried(const MethodInfo& method, const CallOptions& options) {
  return method.idempotent && !method.streaming() && !method.request_bulk &&
         options.response_destination.empty();
}

// Ticket memory, recycled per thread (rpc/impl/block_cache.h): AsyncUnaryCall runs
// AcquireSendSlot and StartUnaryCall one after the other on the caller's thread, so the block one
// call gives back is the one the thread's next call takes: no lock and no allocation per call. A
// ticket is destroyed before its memory is kept (its connection is not held by a cache).
struct TicketDeleter {
  void operator()(SlotTicket* ticket) const {
    ticket->~SlotTicket();
    GiveBlock(ticket, sizeof(SlotTicket));
  }
};

// Runs work(0) .. work(n - 1), up to `at_once` of them at a time, each on a thread of its own
// while it lasts (the calling thread is one of them). Fewer at once when no thread can be had.
void RunAtOnce(size_t n, size_t at_once, absl::FunctionRef<void(size_t)> work) {
  const size_t workers = std::min(n, at_once);
  std::atomic<size_t> next{0};
  auto loop = [&] {
    for (size_t i; (i = next.fetch_add(1, std::memory_order_relaxed)) < n;) work(i);
  };
  std::vector<std::thread> threads;
  threads.reserve(workers > 0 ? workers - 1 : 0);
  for (size_t i = 1; i < workers; ++i) {
    try {
      threads.emplace_back(loop);
    } catch (const std::system_error&) {
      break;  // no thread to be had (a process limit): fewer at once, still every one
    }
  }
  loop();
  for (std::thread& thread : threads) thread.join();
}

// Resolves kBySize (rpc/options.h) for a channel that puts `per_poller` connections on each
// poller: few keep their own receives and arenas (the shortest call path); more share a queue
// backing their floors, a quarter more for windows to grow into (transport/receive_budget.h),
// and borrow arenas from a pool (a channel of a thousand connections would otherwise register
// 388 KiB for each).
void ChooseBySize(uint64_t per_poller, ChannelOptions& options) {
  const bool few = per_poller <= ChannelOptions::kOwnReceivesPerPoller;
  if (options.shared_receive_queue == kBySize) {
    const uint64_t floors = per_poller * options.connection.idle_recv_credits;
    options.shared_receive_queue =
        few ? 0 : static_cast<uint32_t>(std::max<uint64_t>(1024, (floors * 4 + 2) / 3));
  }
  if (options.arena_pool == kBySize) options.arena_pool = few ? 0 : 64;
}

}  // namespace

class ChannelImpl final : public ClientConnectionOwner,
                          public SubchannelHost,
                          private ChannelTimer::Member {
 public:
  ChannelImpl(std::string target, std::string host, uint16_t port, const ChannelOptions& options)
      : target_(std::move(target)), host_(std::move(host)), port_(port), options_(options) {}
  ~ChannelImpl();

  absl::Status Init();
  // `deadline` is monotonic; `waited` as Subchannel::Get's.
  absl::StatusOr<std::shared_ptr<ClientConnection>> Pick(absl::Time deadline, bool* waited);
  // Pick, for a call with CallOptions::wait_for_ready: where Pick fails UNAVAILABLE (no
  // connection open, an attempt failed or its backoff runs), waits for the first backoff to end
  // or a connection to open and picks again, until `deadline` or `cancellation` ends the wait.
  // Never waits on a runtime thread.
  absl::StatusOr<std::shared_ptr<ClientConnection>> PickWhenReady(absl::Time deadline,
                                                                  const Cancellation* cancellation,
                                                                  bool* waited);
  // Connect(): every subchannel, kConnectsAtOnce at a time.
  absl::Status ConnectAll(absl::Time deadline);
  static constexpr size_t kConnectsAtOnce = 16;
  ChannelStats stats() const;
  // Records the message limit and the server's keepalive advice of a new connection, and warns
  // once when the server's receive slots differ from this channel's.
  void NoteMessageLimit(const transport::Connection& connection);
  const std::string& target() const { return target_; }
  const ChannelOptions& options() const { return options_; }
  const std::shared_ptr<transport::Device>& device() const { return device_; }

  // ClientConnectionOwner.
  StagingPool& staging() override { return *staging_; }
  std::shared_ptr<ReceiveLimits> receive_limits() override { return receive_limits_; }
  void DeadlineAdded(absl::Time deadline) override { WakeBy(deadline); }
  void CountExpired(size_t count) override { expired_.fetch_add(count, std::memory_order_relaxed); }
  void CountLateResponse() override { late_.fetch_add(1, std::memory_order_relaxed); }
  void CountWaitedForSlot() override { waited_for_slot_.fetch_add(1, std::memory_order_relaxed); }
  void ConnectionClosed(ClientConnection* connection, bool violation) override;
  absl::Status CloseStatus(const std::string& peer, const absl::Status& why) override;

  // SubchannelHost.
  ClientConnectionOwner& connection_owner() override { return *this; }
  void CountAttempt() override { attempts_.fetch_add(1, std::memory_order_relaxed); }
  void CountFailure() override { failures_.fetch_add(1, std::memory_order_relaxed); }
  void AddLive(std::shared_ptr<ClientConnection> connection) override;
  absl::StatusOr<std::shared_ptr<transport::Poller>> PollerToConnect(
      const std::shared_ptr<transport::Poller>& home) override {
    if (group_ == nullptr) return home;
    return group_->Place(home, options_.connection);
  }
  // What a call to `method` needs besides the method itself, looked up once per method.
  struct MethodState {
    MethodMetrics* metrics;
    uint32_t service_id;  // ServiceId of the part of the full name before '/'
  };
  MethodState MethodFor(const MethodInfo& method);
  const Metrics& metrics() const { return metrics_; }
  // The channel's retries (retry.h); null when they are off (retry.max_attempts 1).
  Retrier* retrier() { return retrier_.get(); }

 private:
  // The ClientChannel the retrier makes attempts through: the very calls a stub makes, on this
  // core, whose lifetime it shares (the one the application holds may go first: the reaper).
  struct FrontDeleter {
    void operator()(ClientChannel* front) const {
      static_cast<void>(front->impl_.release());  // not its own
      delete front;
    }
  };
  // One pass of the timer (channel_timer.h): every connection's expired calls, and its
  // keepalive check when the keepalive pass is due. Returns when the next keepalive pass is due.
  absl::Time TimerPass(absl::Time now) override;
  // The restorer (channels of more than one connection): a connection lost while another of the
  // channel's is open would otherwise never come back, since calls prefer open connections
  // (Pick). It makes it again in the background once its backoff allows, kConnectsAtOnce at a
  // time. Woken when a connection closes or opens, and by the earliest backoff's end.
  void RestoreLoop();
  // One pass: attempts what is due; returns when the next pass is due (monotonic).
  absl::Time RestoreLost();
  void KickRestorer();

  const std::string target_;
  const std::string host_;
  const uint16_t port_;
  // Resolved by Init (kBySize, arenas lent or not) before any other thread reads it; then fixed.
  ChannelOptions options_;
  std::shared_ptr<transport::Device> device_;
  std::unique_ptr<StagingPool> staging_;
  std::shared_ptr<ReceiveLimits> receive_limits_;
  // Shared with received payloads users still hold (rpc_connection.h).
  std::vector<std::shared_ptr<transport::Poller>> pollers_;
  // The group whose pollers those are (ChannelOptions::poller_group), or null: the channel's own.
  std::shared_ptr<PollerGroup> group_;
  // options.connections of them, each on a poller, round robin (subchannel.h).
  std::vector<std::unique_ptr<Subchannel>> subchannels_;
  std::atomic<uint32_t> next_{0};

  // Connections attached and not closed: what the timer scans, and what destruction waits for.
  mutable absl::Mutex mu_;
  std::vector<std::shared_ptr<ClientConnection>> live_ ABSL_GUARDED_BY(mu_);
  bool destroying_ ABSL_GUARDED_BY(mu_) = false;

  // The timer that runs this channel's passes (deadlines, keepalives): its group's, or its own.
  std::unique_ptr<ChannelTimer> own_timer_;
  ChannelTimer* timer_ = nullptr;  // set by Init; left at the start of destruction
  // The passes' state (timer thread only).
  bool keepalive_ = false;
  absl::Duration idle_interval_;
  absl::Duration keepalive_grid_;
  MethodMetrics* keepalive_metrics_ = nullptr;  // the pings' own series (zrpc.Keepalive/Ping)
  IdleCheckCursor idle_cursor_;
  absl::Time next_keepalive_ = absl::InfiniteFuture();
  // The connections a pass looks at: one vector for every pass, so that a pass allocates nothing
  // (it runs by the clock, and count_calls_test holds the client to no allocation per call).
  std::vector<std::shared_ptr<ClientConnection>> pass_live_;

  // The restorer's state (RestoreLoop); std:: primitives, as the timer's, for the steady clock.
  std::mutex restore_mu_;
  std::condition_variable restore_cv_;
  bool restore_stop_ = false;  // under restore_mu_
  bool restore_kick_ = false;  // under restore_mu_
  std::thread restorer_;

  // The retries (retry.h), and the front they make their attempts through: set by Init when the
  // options retry, before any call. The retrier stays until the end, for the ends of attempts.
  std::unique_ptr<ClientChannel, FrontDeleter> front_;
  std::unique_ptr<Retrier> retrier_;

  // Per-method metrics, and the MethodInfo -> MethodState cache in front of the registry's
  // by-name lookup (MethodInfo objects are static in generated code, so their address is a key).
  Metrics metrics_;
  // What each method called on this channel resolves to. Read on every call, so the first
  // kMethodCache methods are also in an open-addressed table read without a lock: an entry's
  // state is written before its key is published (release), and entries are never removed.
  static constexpr size_t kMethodCache = 64;
  struct CachedMethod {
    std::atomic<const MethodInfo*> key{nullptr};
    MethodState state{};
  };
  std::array<CachedMethod, kMethodCache> method_cache_;
  absl::Mutex methods_mu_;  // writes to method_cache_, and methods_
  absl::flat_hash_map<const MethodInfo*, MethodState> methods_ ABSL_GUARDED_BY(methods_mu_);

  std::atomic<uint64_t> attempts_{0};
  std::atomic<uint64_t> failures_{0};
  std::atomic<uint64_t> max_message_{0};         // ChannelStats::max_slot_message
  std::atomic<uint32_t> server_advice_ms_{0};    // ChannelStats::server_idle_advice
  std::atomic<bool> slot_mismatch_said_{false};  // the slot-size warning, once per channel
  std::atomic<uint64_t> lost_{0};
  std::atomic<uint64_t> expired_{0};
  std::atomic<uint64_t> late_{0};
  std::atomic<uint64_t> waited_for_slot_{0};
  std::atomic<uint64_t> violations_{0};
};

absl::Status ChannelImpl::Init() {
  const bool grouped = !options_.poller_group.empty();
  const uint64_t per_poller =
      (static_cast<uint64_t>(options_.connections) + options_.pollers - 1) / options_.pollers;
  uint32_t arena_piece = 0;
  // The process's device, held from here until OpenRuntime below finds it again: dropped in
  // between, the first channel of a process would open it twice.
  std::shared_ptr<transport::Device> held_device;
  if (grouped) {
    // A group holds many channels' connections, whatever this one's size: a server's sizes,
    // cut to RLIMIT_MEMLOCK when the group is made (PollerGroup::Join).
    ServerSizesForBySize(options_);
  } else {
    ChooseBySize(per_poller, options_);
    // The device decides whether receives are shared (opened now; OpenRuntime below finds the
    // same one, the process's), then RLIMIT_MEMLOCK what they may hold, as a server's: a channel
    // whose connections' floors no longer fit is refused below, naming the queue.
    absl::StatusOr<std::shared_ptr<transport::Device>> device =
        SharedDevice(options_.device, options_.slots);
    if (!device.ok()) return device.status();
    held_device = *std::move(device);
    options_.shared_receive_queue =
        SharedQueueOnDevice(*held_device, options_.shared_receive_queue, "channel");
    options_.shared_receive_queue = SharedQueueWithinLockedMemory(
        options_.shared_receive_queue, options_.slots.slot_size, options_.pollers,
        options_.connection.idle_recv_credits, "channel");
    options_.arena_pool = ArenaPoolWithinLockedMemory(
        options_.arena_pool, options_.connection.arena_size, options_.pollers, "channel");
    arena_piece = options_.arena_pool > 0 ? options_.connection.arena_size : 0;
  }
  RuntimeOptions own = options_;
  if (grouped) own.pollers = 0;  // the group's instead
  absl::StatusOr<RuntimeParts> parts = OpenRuntime(own, "ChannelOptions", arena_piece);
  if (!parts.ok()) return parts.status();
  if (grouped) {
    absl::StatusOr<std::shared_ptr<PollerGroup>> group =
        PollerGroup::Join(options_, parts->device, parts->manual_pollers);
    if (!group.ok()) return group.status();
    group_ = *std::move(group);
    parts->pollers = group_->pollers();
    options_.shared_receive_queue = group_->made().shared_receive_queue;
    options_.arena_pool = group_->made().arena_pool;
    arena_piece = group_->made().arena_piece;
  }
  // Lent on demand when the pollers have pools: a device without type-2 memory windows makes
  // none, and each connection registers an arena of its own.
  const bool lend = arena_piece > 0 && parts->pollers.front()->arena_pool() != nullptr;
  SayNoWindowsOnce(*parts->device, lend ? 0 : arena_piece, "channel", "ChannelOptions");
  options_.connection.arena_on_demand = lend;
  if (!lend) options_.arena_pool = 0;
  device_ = std::move(parts->device);
  staging_ = std::move(parts->staging);
  receive_limits_ = std::move(parts->receive_limits);
  pollers_ = std::move(parts->pollers);
  // Each poller must hold the connections the channel gives it (i % pollers): else they would be
  // refused at every connect, and the channel would only back off. A group's pollers are shared:
  // its channels' connections fill them together, and one that finds them full backs off.
  const uint64_t fits = pollers_.front()->Capacity(options_.connection);
  if (grouped ? fits == 0 : fits < per_poller) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ChannelOptions: each poller holds ", grouped ? 1 : per_poller,
        " of the channel's connections but has room for ", fits,
        options_.shared_receive_queue > 0
            ? absl::StrCat(" (its shared_receive_queue of ", options_.shared_receive_queue,
                           " receives backs ", fits, " floors of connection.idle_recv_credits = ",
                           options_.connection.idle_recv_credits, ")")
            : " (its completion queue's entries)",
        "; raise shared_receive_queue or pollers, or lower connections or "
        "connection.idle_recv_credits"));
  }
  for (int i = 0; i < options_.connections; ++i) {
    subchannels_.push_back(
        std::make_unique<Subchannel>(*this, target_, host_, port_, options_, device_,
                                     grouped ? group_->NextHome() : pollers_[i % pollers_.size()]));
  }
  // The timer: the group's, shared by its channels, or one of its own.
  keepalive_ = options_.keepalive_interval > absl::ZeroDuration();
  idle_interval_ = options_.idle_keepalive_interval > absl::ZeroDuration()
                       ? std::max(options_.idle_keepalive_interval, options_.keepalive_interval)
                       : absl::ZeroDuration();
  keepalive_grid_ = ChannelTimer::KeepaliveGrid(options_.keepalive_interval);
  keepalive_metrics_ = &metrics_.ForMethod(MetricsSide::kClient, kKeepalivePing.full_name);
  if (keepalive_) {
    next_keepalive_ =
        ChannelTimer::OnGrid(MonotonicNow() + options_.keepalive_interval, keepalive_grid_);
  }
  if (grouped) {
    timer_ = &group_->timer();
  } else {
    own_timer_ = std::make_unique<ChannelTimer>();
    timer_ = own_timer_.get();
  }
  timer_->Join(this, next_keepalive_);
  if (subchannels_.size() > 1) restorer_ = std::thread([this] { RestoreLoop(); });
  if (options_.retry.max_attempts > 1) {
    front_.reset(new ClientChannel(std::unique_ptr<ChannelImpl>(this), /*retry_front=*/true));
    retrier_ = std::make_unique<Retrier>(options_.retry, front_.get());
  }
  return absl::OkStatus();
}

ChannelImpl::~ChannelImpl() {
  // Retried calls waiting for their next attempt end now (CANCELLED), as any that would wait
  // from now on; an attempt under way ends with the calls in flight, below.
  if (retrier_ != nullptr) retrier_->Stop();
  if (restorer_.joinable()) {
    // First: it makes connections. An attempt under way ends within connect_timeout.
    {
      std::lock_guard<std::mutex> lock(restore_mu_);
      restore_stop_ = true;
    }
    restore_cv_.notify_one();
    restorer_.join();
  }
  // No pass after this (one under way ends first): the calls left end with the connections.
  if (timer_ != nullptr) timer_->Leave(this);
  std::vector<std::shared_ptr<ClientConnection>> live;
  {
    absl::MutexLock lock(&mu_);
    destroying_ = true;
    live = live_;
  }
  for (auto& connection : live) connection->connection().Close();
  live.clear();
  {
    // Each OnClosed fails its calls (CANCELLED) and leaves live_; the poller drives it.
    absl::MutexLock lock(&mu_);
    auto closed = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return live_.empty(); };
    // A group's pollers run on after this channel: its connections' reports must all be over
    // before it goes, however long (the drain watchdog ends every close within seconds). Its
    // own pollers' Shutdown, below, ends what is left.
    while (!mu_.AwaitWithTimeout(absl::Condition(&closed), absl::Seconds(10)) &&
           group_ != nullptr) {
      ZRPC_LOG(kWarning, "rpc", "a channel to ", target_, " in poller_group \"",
               options_.poller_group, "\" waits for ", live_.size(),
               " of its connections to close before it goes");
    }
  }
  for (auto& sub : subchannels_) sub->Reset();
  if (group_ != nullptr) {
    // OnClosed takes a connection out of live_ before it ends its calls (and their callbacks):
    // a whole pass of each poller after this point means those are over, and any task left for
    // the connections has run (poller_group.h). The pollers stop with the group's last channel.
    for (auto& poller : pollers_) poller->AwaitPass(absl::Seconds(10));
  } else {
    // Drains whatever is left; a payload a user still holds keeps its poller object (and CQ)
    // until released, with the loop stopped.
    for (auto& poller : pollers_) poller->Shutdown();
  }
  pollers_.clear();
  group_.reset();
}

absl::StatusOr<std::shared_ptr<ClientConnection>> ChannelImpl::Pick(absl::Time deadline,
                                                                    bool* waited) {
  const size_t n = subchannels_.size();
  // A load and a store, not an atomic add: callers that race may start from the same
  // subchannel, which costs the rotation nothing a later call does not even out.
  const uint32_t turn = next_.load(std::memory_order_relaxed);
  next_.store(turn + 1, std::memory_order_relaxed);
  const size_t first = turn % n;
  // Prefer an open connection over a subchannel that would have to connect or is backing off.
  for (size_t i = 0; i < n && n > 1; ++i) {
    if (std::shared_ptr<ClientConnection> ready = subchannels_[(first + i) % n]->Ready()) {
      return ready;
    }
  }
  return subchannels_[first]->Get(deadline, waited);
}

absl::StatusOr<std::shared_ptr<ClientConnection>> ChannelImpl::PickWhenReady(
    absl::Time deadline, const Cancellation* cancellation, bool* waited) {
  absl::Status last;  // the last attempt's failure, which the deadline's error quotes
  for (;;) {
    absl::StatusOr<std::shared_ptr<ClientConnection>> picked = Pick(deadline, waited);
    if (picked.ok() || OnRuntimeThread()) return picked;
    const absl::StatusCode code = picked.status().code();
    if (code == absl::StatusCode::kDeadlineExceeded && !last.ok()) break;
    // UNAVAILABLE is a failed attempt, a backoff or a connection lost; anything else is final.
    if (code != absl::StatusCode::kUnavailable) return picked;
    last = picked.status();
    *waited = true;
    // Asleep until the first subchannel's backoff ends (Pick then attempts), a connection
    // opens, the deadline, or a cancel: looked at every 20 ms.
    absl::Time next = absl::InfiniteFuture();
    for (const auto& sub : subchannels_) next = std::min(next, sub->next_attempt());
    // A millisecond at least: a failure that sets no backoff must not make this spin.
    const absl::Time wake =
        std::min(deadline, std::max(next, MonotonicNow() + absl::Milliseconds(1)));
    for (;;) {
      if (cancellation != nullptr && cancellation->cancelled()) {
        return absl::CancelledError(absl::StrCat("cancelled while waiting for a connection to ",
                                                 target_, " (wait_for_ready)"));
      }
      const absl::Time now = MonotonicNow();
      if (now >= wake) break;
      bool ready = false;
      for (const auto& sub : subchannels_) ready = ready || sub->Ready() != nullptr;
      if (ready) break;
      absl::SleepFor(std::min(absl::Milliseconds(20), wake - now));
    }
    if (MonotonicNow() >= deadline) break;
  }
  return absl::DeadlineExceededError(absl::StrCat("not connected to ", target_,
                                                  " by the deadline (wait_for_ready); the last "
                                                  "attempt: ",
                                                  last.message()));
}

void ChannelImpl::AddLive(std::shared_ptr<ClientConnection> connection) {
  {
    absl::MutexLock lock(&mu_);
    if (!connection->closed()) live_.push_back(std::move(connection));
  }
  KickRestorer();  // the first connection back after an outage: the others follow it
}

absl::Status ChannelImpl::ConnectAll(absl::Time deadline) {
  // A handshake mostly waits (for the server's listener, for the two sides' connection managers),
  // so the connections are made kConnectsAtOnce at a time, each on a thread of its own while it
  // lasts: one after another, a thousand took their server's whole accept time added up. On a
  // runtime thread each fails at once (Subchannel::Get), as before, and no thread is started.
  const size_t n = subchannels_.size();
  absl::Mutex mu;
  absl::Status first;  // the first connection's error, in their order
  size_t first_index = n;
  RunAtOnce(n, OnRuntimeThread() ? 1 : kConnectsAtOnce, [&](size_t i) {
    absl::Status connected = subchannels_[i]->Connect(deadline);
    if (connected.ok()) return;
    absl::MutexLock lock(&mu);
    if (i < first_index) {
      first_index = i;
      first = std::move(connected);
    }
  });
  return first;
}

void ChannelImpl::KickRestorer() {
  if (subchannels_.size() < 2) return;  // no restorer (and restorer_ may be being joined)
  std::lock_guard<std::mutex> lock(restore_mu_);
  restore_kick_ = true;
  restore_cv_.notify_one();
}

void ChannelImpl::RestoreLoop() {
  std::unique_lock<std::mutex> lock(restore_mu_);
  absl::Time wake = absl::InfiniteFuture();  // monotonic
  for (;;) {
    auto woken = [this] { return restore_stop_ || restore_kick_; };
    if (wake == absl::InfiniteFuture()) {
      restore_cv_.wait(lock, woken);
    } else {
      const absl::Duration wait = std::max(absl::ZeroDuration(), wake - MonotonicNow());
      restore_cv_.wait_for(lock, absl::ToChronoNanoseconds(wait), woken);
    }
    if (restore_stop_) return;
    restore_kick_ = false;
    lock.unlock();
    wake = RestoreLost();
    lock.lock();
  }
}

absl::Time ChannelImpl::RestoreLost() {
  // Nothing open: the server is away, and the next call connects on demand (and kicks this when
  // it does); trying here too would only double the attempts a down server refuses.
  const bool any_open = std::any_of(subchannels_.begin(), subchannels_.end(),
                                    [](const auto& sub) { return sub->Ready() != nullptr; });
  if (!any_open) return absl::InfiniteFuture();
  const absl::Time now = MonotonicNow();
  absl::Time next = absl::InfiniteFuture();
  std::vector<Subchannel*> due;
  for (const auto& sub : subchannels_) {
    absl::Time at;
    switch (sub->Restorable(now, &at)) {
      case Subchannel::Restore::kNo:
        break;
      case Subchannel::Restore::kNow:
        due.push_back(sub.get());
        break;
      case Subchannel::Restore::kAt:
        next = std::min(next, at);
        break;
    }
  }
  if (due.empty()) return next;
  RunAtOnce(due.size(), kConnectsAtOnce, [&](size_t i) {
    {
      std::lock_guard<std::mutex> lock(restore_mu_);
      if (restore_stop_) return;  // the channel is going: no new connection
    }
    // One attempt, bounded by connect_timeout alone (a deadline of the restorer's own would make
    // a timed-out handshake look cut short by it, and set no backoff): a failure sets the
    // subchannel's backoff, and the next pass waits it out.
    (void)due[i]->Get(absl::InfiniteFuture());
  });
  return MonotonicNow();  // another pass at once: what failed now has its next attempt set
}

absl::Time ChannelImpl::TimerPass(absl::Time now) {
  const bool keepalive_due = keepalive_ && now >= next_keepalive_;
  {
    absl::MutexLock lock(&mu_);
    pass_live_.assign(live_.begin(), live_.end());
  }
  // Outside the lock: callbacks run here.
  std::vector<std::shared_ptr<ClientConnection>>& live = pass_live_;
  absl::Time next = absl::InfiniteFuture();
  KeepalivePass pass{now,
                     options_.keepalive_timeout,
                     idle_interval_,
                     keepalive_metrics_,
                     KeepaliveSchedule::IdleChecksPerPass(options_.keepalive_interval),
                     /*denied=*/false,
                     options_.max_idle_keepalive_interval};
  // From where the last keepalive pass ran out of idle checks (keepalive.h).
  const size_t start = idle_cursor_.Start(live.size());
  for (size_t k = 0; k < live.size(); ++k) {
    const size_t i = (start + k) % live.size();
    ClientConnection& connection = *live[i];
    connection.Expire(now);
    if (keepalive_due) {
      connection.Keepalive(pass);
      idle_cursor_.After(pass, i);
    }
    next = std::min(next, connection.NextDeadline());
  }
  if (keepalive_due) {
    idle_cursor_.EndPass(start);
    // On the grid, so that the channels sharing a timer share its wake-ups (channel_timer.h).
    next_keepalive_ = ChannelTimer::OnGrid(now + options_.keepalive_interval, keepalive_grid_);
  }
  if (next != absl::InfiniteFuture()) WakeBy(next);
  live.clear();  // the references go; the capacity stays
  return next_keepalive_;
}

ChannelImpl::MethodState ChannelImpl::MethodFor(const MethodInfo& method) {
  const size_t home = absl::HashOf(&method) % kMethodCache;
  for (size_t i = 0; i < kMethodCache; ++i) {
    const CachedMethod& entry = method_cache_[(home + i) % kMethodCache];
    const MethodInfo* key = entry.key.load(std::memory_order_acquire);
    if (key == &method) return entry.state;
    if (key == nullptr) break;
  }
  {
    absl::ReaderMutexLock lock(&methods_mu_);
    auto it = methods_.find(&method);
    if (it != methods_.end()) return it->second;
  }
  const absl::string_view full_name(method.full_name);
  const MethodState state{&metrics_.ForMethod(MetricsSide::kClient, full_name),
                          ServiceId(full_name.substr(0, full_name.find('/')))};
  absl::MutexLock lock(&methods_mu_);
  if (!methods_.emplace(&method, state).second) return state;  // another thread was first
  for (size_t i = 0; i < kMethodCache; ++i) {
    CachedMethod& entry = method_cache_[(home + i) % kMethodCache];
    if (entry.key.load(std::memory_order_relaxed) == nullptr) {
      entry.state = state;
      entry.key.store(&method, std::memory_order_release);
      break;
    }
  }
  return state;
}

void ChannelImpl::ConnectionClosed(ClientConnection* connection, bool violation) {
  if (violation) violations_.fetch_add(1, std::memory_order_relaxed);
  // Its subchannel lets go too, so that its registrations go back now, not at that subchannel's
  // next connect, which may never come while another subchannel is open (Pick prefers those).
  // The caller (OnClosed) still holds the connection: none of this is its last reference.
  std::vector<std::shared_ptr<ClientConnection>> forgotten;
  for (auto& sub : subchannels_) {
    if (auto held = sub->Forget(connection)) forgotten.push_back(std::move(held));
  }
  std::shared_ptr<ClientConnection> removed;  // released after the lock
  absl::MutexLock lock(&mu_);
  auto it = std::find_if(live_.begin(), live_.end(),
                         [&](const auto& live) { return live.get() == connection; });
  if (it == live_.end()) return;
  removed = std::move(*it);
  live_.erase(it);
  if (destroying_) return;
  lost_.fetch_add(1, std::memory_order_relaxed);
  KickRestorer();
}

absl::Status ChannelImpl::CloseStatus(const std::string& peer, const absl::Status& why) {
  absl::MutexLock lock(&mu_);
  if (destroying_) return absl::CancelledError("the channel was destroyed");
  return absl::UnavailableError(
      absl::StrCat("the connection to ", peer, " failed: ", why.message()));
}

void ChannelImpl::NoteMessageLimit(const transport::Connection& connection) {
  const size_t max = RpcConnection::MaxInlineBody(connection);
  max_message_.store(max, std::memory_order_relaxed);
  server_advice_ms_.store(AcceptDataIdleIntervalMs(connection.peer_accept_data()),
                          std::memory_order_relaxed);
  const size_t own = device_->slots().slot_size();
  const size_t peer = connection.peer_recv_size();
  if (own == peer || slot_mismatch_said_.exchange(true)) return;
  // Negotiated, not refused: the smaller side governs both ways. Said once, at connect, so that
  // an operator sees it before the first message that does not fit (whose error says it too).
  ZRPC_LOG(kWarning, "client", "connected to ", target_, ": its receive slots are ", peer,
           " bytes (ServerOptions::slots.slot_size), this channel's ", own,
           " (ChannelOptions::slots.slot_size); messages up to ", max,
           " bytes go in a slot both ways, set by the smaller side, and larger ones as payloads "
           "(slower): set both to the same size");
}

ChannelStats ChannelImpl::stats() const {
  ChannelStats stats;
  stats.max_slot_message = max_message_.load(std::memory_order_relaxed);
  stats.server_idle_advice = absl::Milliseconds(server_advice_ms_.load(std::memory_order_relaxed));
  stats.connect_attempts = attempts_.load(std::memory_order_relaxed);
  stats.connect_failures = failures_.load(std::memory_order_relaxed);
  stats.connections_lost = lost_.load(std::memory_order_relaxed);
  stats.deadlines_exceeded = expired_.load(std::memory_order_relaxed);
  stats.late_responses = late_.load(std::memory_order_relaxed);
  stats.calls_waited_for_slot = waited_for_slot_.load(std::memory_order_relaxed);
  stats.retries = retrier_ == nullptr ? 0 : retrier_->retries();
  stats.protocol_violations = violations_.load(std::memory_order_relaxed);
  stats.bulk_bytes_staged = staging_->staged_bytes();
  stats.bulk_bytes_zero_copy = staging_->zero_copy_bytes();
  stats.staging_bytes_registered = staging_->registered_bytes();
  stats.pulled_bytes_held = receive_limits_->in_use();
  stats.memory_registrations = device_->registrations();
  {
    absl::MutexLock lock(&mu_);
    for (const auto& connection : live_) {
      stats.calls_in_flight += connection->calls_in_flight();
      stats.bulk_reads_in_flight += connection->pulling();
    }
  }
  for (const auto& sub : subchannels_) stats.backoff = std::max(stats.backoff, sub->backoff());
  for (const auto& poller : pollers_) {
    stats.shared_receives += poller->shared_receives();
    if (const transport::ArenaPool* pool = poller->arena_pool()) {
      stats.arena_pool += options_.arena_pool;
      stats.arenas_registered += pool->made();
      stats.arenas_lent += pool->lent();
    }
  }
  return stats;
}

namespace {

// Tears down channels destroyed on one of the runtime's own threads (a callback of the channel's
// own calls, typically), where the teardown cannot run: it joins the timer and the pollers, one
// of which is the thread asking. One thread for the process, started on first use; at exit it
// finishes what it was given.
class Reaper {
 public:
  static Reaper& Get() {
    static Reaper reaper;
    return reaper;
  }
  void Take(std::unique_ptr<ChannelImpl> core) {
    absl::MutexLock lock(&mu_);
    queue_.push_back(std::move(core));
  }
  ~Reaper() {
    {
      absl::MutexLock lock(&mu_);
      stop_ = true;
    }
    thread_.join();
  }

 private:
  Reaper() : thread_([this] { Loop(); }) {}
  void Loop() {
    for (;;) {
      std::unique_ptr<ChannelImpl> core;
      {
        absl::MutexLock lock(&mu_);
        auto ready = [this]()
                         ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_ || !queue_.empty(); };
        mu_.Await(absl::Condition(&ready));
        if (queue_.empty()) return;
        core = std::move(queue_.front());
        queue_.erase(queue_.begin());
      }
      core.reset();  // waits for the callback that destroyed the channel to return
    }
  }

  absl::Mutex mu_;
  std::vector<std::unique_ptr<ChannelImpl>> queue_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace

}  // namespace internal
}  // namespace zrpc

namespace zrpc {

absl::StatusOr<std::unique_ptr<ClientChannel>> CreateChannel(absl::string_view target,
                                                             const ChannelOptions& options) {
  std::string host;
  uint16_t port = 0;
  if (absl::Status s = internal::ParseHostPort(target, "target", false, &host, &port); !s.ok()) {
    return s;
  }
  if (options.connections < 1 || options.connections > 1024) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ChannelOptions::connections is ", options.connections, "; it must be in [1, 1024]"));
  }
  if (options.reconnect_backoff_initial <= absl::ZeroDuration() ||
      options.reconnect_backoff_max < options.reconnect_backoff_initial) {
    return absl::InvalidArgumentError(
        "ChannelOptions: reconnect_backoff_initial must be positive and at most "
        "reconnect_backoff_max");
  }
  if (options.retry.max_attempts < 1 || options.retry.max_attempts > 10 ||
      (options.retry.max_attempts > 1 &&
       (options.retry.initial_backoff <= absl::ZeroDuration() ||
        options.retry.max_backoff < options.retry.initial_backoff))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ChannelOptions::retry: max_attempts is ", options.retry.max_attempts,
        "; it must be in [1, 10], and with retries initial_backoff positive and at most "
        "max_backoff"));
  }
  if (options.keepalive_interval < absl::ZeroDuration() ||
      (options.keepalive_interval > absl::ZeroDuration() &&
       options.keepalive_timeout <= absl::ZeroDuration())) {
    return absl::InvalidArgumentError(
        "ChannelOptions: keepalive_interval must be zero (off) or positive, with a positive "
        "keepalive_timeout");
  }
  if (options.idle_keepalive_interval < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        "ChannelOptions::idle_keepalive_interval must be zero (idle connections unchecked) or "
        "positive");
  }
  if (options.max_idle_keepalive_interval <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        "ChannelOptions::max_idle_keepalive_interval must be positive");
  }
  if (options.connect_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("ChannelOptions::connect_timeout must be positive");
  }
  if (absl::Status s = internal::CheckInterceptors(options.interceptors, "ChannelOptions");
      !s.ok()) {
    return s;
  }
  if (absl::Status s = internal::CheckRuntimeOptions(options, "ChannelOptions"); !s.ok()) {
    return s;
  }
  if (options.park_windows) {
    return absl::InvalidArgumentError(
        "ChannelOptions::park_windows is set; only a server's windows park (its pollers accept "
        "the connections): leave it false on a channel");
  }
  ChannelOptions adjusted = options;
  adjusted.connection.min_message_size =
      std::max(adjusted.connection.min_message_size, internal::kMinRpcMessage);
  auto core =
      std::make_unique<internal::ChannelImpl>(std::string(target), std::move(host), port, adjusted);
  if (absl::Status s = core->Init(); !s.ok()) return s;
  return std::unique_ptr<ClientChannel>(new ClientChannel(std::move(core)));
}

namespace {
// Each thread's blocking calls, whatever their channel (call_interfaces.h, BlockingWait).
thread_local transport::AdaptiveSpin thread_spin;

void LearnBlockingWait(std::chrono::nanoseconds waited, std::chrono::nanoseconds cap) {
  thread_spin.Observe(waited.count(), cap.count());
}
}  // namespace

internal::BlockingWait ClientChannel::blocking_wait() const {
  if (blocking_spin_.count() == 0) return {};
  return {std::chrono::nanoseconds(thread_spin.BudgetNanos(blocking_spin_.count())), blocking_spin_,
          &LearnBlockingWait};
}

ClientChannel::ClientChannel(std::unique_ptr<internal::ChannelImpl> core, bool retry_front)
    : impl_(std::move(core)),
      retry_front_(retry_front),
      blocking_spin_(absl::ToChronoNanoseconds(impl_->options().spin)),
      intercepted_(!impl_->options().interceptors.empty()) {}
ClientChannel::~ClientChannel() {
  // From a callback on one of the runtime's threads the teardown would join the thread it runs
  // on: hand it over, and return at once (channel.h). (The retrier's own front has none.)
  if (impl_ != nullptr && internal::OnRuntimeThread()) {
    internal::Reaper::Get().Take(std::move(impl_));
  }
}

namespace internal {
namespace {
// A call to `method` that began at `timing` found no slot, `unsent` says why: for a call a retry
// may make again, memory the request is serialized into, for StartUnaryCall to hand to the
// retries (retry.h); otherwise `unsent`. Never for the retries' own front (`retry_front`), whose
// attempts are the retries'.
ABSL_ATTRIBUTE_NOINLINE absl::StatusOr<SendSlot> SlotForRetry(ChannelImpl& impl, bool retry_front,
                                                              const MethodInfo& method, size_t size,
                                                              const CallOptions& options,
                                                              absl::Status unsent,
                                                              const CallTiming& timing) {
  if (retry_front || unsent.code() != absl::StatusCode::kUnavailable || impl.retrier() == nullptr ||
      !Retried(method, options)) {
    return unsent;
  }
  auto* large = static_cast<uint8_t*>(std::malloc(size > 0 ? size : 1));
  if (large == nullptr) return unsent;
  auto* ticket = new (TakeBlock(sizeof(SlotTicket)))
      SlotTicket{nullptr, transport::SendBuffer{}, large, false, timing};
  ticket->unsent = new absl::Status(std::move(unsent));
  return SendSlot{large, size, reinterpret_cast<uintptr_t>(ticket)};
}
}  // namespace
}  // namespace internal

ABSL_ATTRIBUTE_ALWAYS_INLINE inline absl::StatusOr<SendSlot> ClientChannel::AcquireSlot(
    const MethodInfo& method, size_t size, const CallOptions& options) {
  // The call starts here: its one clock reading (the batch's, on a poller: call_clock.h) fixes
  // its deadline, and waits below end there.
  internal::CallTiming timing = internal::StartTiming(options);
  // Emptied first, so that a call failing before it is sent leaves no earlier call's trailers.
  if (options.trailing_metadata != nullptr) options.trailing_metadata->Clear();
  bool waited = false;
  absl::StatusOr<std::shared_ptr<internal::ClientConnection>> connection =
      options.wait_for_ready
          ? impl_->PickWhenReady(timing.deadline, options.cancellation.get(), &waited)
          : impl_->Pick(timing.deadline, &waited);
  if (!connection.ok()) {
    // No connection: a retry may make the call again (retry.h).
    if (ABSL_PREDICT_FALSE(method.idempotent)) {
      return internal::SlotForRetry(*impl_, retry_front_, method, size, options,
                                    connection.status(), timing);
    }
    return connection.status();
  }
  // Connecting took time: the request's remaining time (the wire's) is counted from now.
  if (waited) timing.now_nanos = internal::CallClockRefreshNanos();
  transport::Connection& c = (*connection)->connection();
  // The call's metadata goes first in the SEND (WIRE.md, "Metadata"): the message follows it.
  const size_t block = internal::RequestMetadataBlock(options);
  if (absl::Status fits =
          (*connection)->limits().CheckMessage(size + options.metadata.encoded_size(), "request");
      !fits.ok()) {
    return fits;
  }
  if (ABSL_PREDICT_FALSE(block > 0)) {
    if (absl::Status fits = internal::RpcConnection::MetadataFits(c, block); !fits.ok())
      return fits;
  }
  // A slot frees when an earlier message's send completes: wait for one, up to the deadline.
  // Never on a poller or the timer (THREADING.md): there the call waits in the connection's
  // queue instead, behind any call already waiting there.
  internal::ClientConnection* client = connection->get();
  const bool runtime_thread = internal::OnRuntimeThread();
  absl::StatusOr<transport::SendBuffer> buffer =
      runtime_thread && client->requests_waiting() > 0 && client->open()
          ? absl::ResourceExhaustedError("calls wait for a send slot")
          : internal::RpcConnection::AcquireSendBufferWaiting(
                c, !runtime_thread, [&timing, client]() -> absl::Status {
                  if (client->closed()) return absl::UnavailableError("the connection is closing");
                  // Only a wait asks: the clock is read again only then.
                  timing.now_nanos = internal::CallClockRefreshNanos();
                  if (absl::FromUnixNanos(timing.now_nanos) >= timing.deadline) {
                    return absl::DeadlineExceededError(
                        "the deadline passed while waiting for a send slot (every one is in "
                        "flight)");
                  }
                  return absl::OkStatus();
                });
  if (!buffer.ok() && runtime_thread &&
      buffer.status().code() == absl::StatusCode::kResourceExhausted && client->open()) {
    auto* body = static_cast<uint8_t*>(std::malloc(size + block > 0 ? size + block : 1));
    if (body == nullptr) {
      return absl::ResourceExhaustedError(
          absl::StrCat("out of memory for a ", size, "-byte request"));
    }
    if (block > 0) EncodeMetadataBlock(&options.metadata, nullptr, body);
    auto* ticket = new (internal::TakeBlock(sizeof(internal::SlotTicket)))
        internal::SlotTicket{*std::move(connection), transport::SendBuffer{}, body, true, timing};
    return SendSlot{body + block, size, reinterpret_cast<uintptr_t>(ticket)};
  }
  if (!buffer.ok()) {
    if (ABSL_PREDICT_FALSE(method.idempotent)) {  // the connection closing, say
      return internal::SlotForRetry(*impl_, retry_front_, method, size, options, buffer.status(),
                                    timing);
    }
    return buffer.status();
  }
  // Larger than a slot: the request goes at the front of a payload, from memory of its own, and
  // the slot carries the header.
  uint8_t* large = nullptr;
  if (ABSL_PREDICT_FALSE(block > 0)) {
    EncodeMetadataBlock(&options.metadata, nullptr, internal::RpcConnection::Body(*buffer));
  }
  if (!internal::RpcConnection::FitsSlot(c, size + block)) {
    large = static_cast<uint8_t*>(std::malloc(size));
    if (large == nullptr) {
      c.ReleaseSendBuffer(*buffer);
      return absl::ResourceExhaustedError(
          absl::StrCat("out of memory for a ", size, "-byte request"));
    }
  }
  auto* ticket = new (internal::TakeBlock(sizeof(internal::SlotTicket)))
      internal::SlotTicket{*std::move(connection), *buffer, large, false, timing};
  return SendSlot{large != nullptr ? large : internal::RpcConnection::Body(*buffer) + block, size,
                  reinterpret_cast<uintptr_t>(ticket)};
}

absl::StatusOr<SendSlot> ClientChannel::AcquireSendSlot(const MethodInfo& method, size_t size,
                                                        const CallOptions& options) {
  if (ABSL_PREDICT_FALSE(intercepted_)) return AcquireIntercepted(method, size, options);
  return AcquireSlot(method, size, options);
}

absl::StatusOr<SendSlot> ClientChannel::AcquireIntercepted(const MethodInfo& method, size_t size,
                                                           const CallOptions& options) {
  // The interceptors first: the metadata they add is encoded with the call's own, below.
  absl::StatusOr<std::unique_ptr<internal::InterceptedCall>> intercepted =
      internal::InterceptedCall::Start(impl_->options().interceptors, method, options);
  if (!intercepted.ok()) return intercepted.status();
  absl::StatusOr<SendSlot> slot = AcquireSlot(method, size, (*intercepted)->options());
  if (!slot.ok()) {
    (*intercepted)->End(slot.status());
    return slot.status();
  }
  reinterpret_cast<internal::SlotTicket*>(static_cast<uintptr_t>(slot->token))->intercepted =
      intercepted->release();
  return slot;
}

void ClientChannel::StartUnaryCall(const MethodInfo& method, SendSlot slot,
                                   OutgoingBulk request_bulk,
                                   ::google::protobuf::MessageLite* response,
                                   IncomingBulk* response_bulk, const CallOptions& caller_options,
                                   DoneCallback done) {
  std::unique_ptr<internal::SlotTicket, internal::TicketDeleter> ticket(
      reinterpret_cast<internal::SlotTicket*>(static_cast<uintptr_t>(slot.token)));
  // Everything passed by reference: this path stays as short for the calls that never retry.
  if (ABSL_PREDICT_FALSE(method.idempotent) && !retry_front_) {
    if (StartRetried(method, slot, !request_bulk.empty(), response, response_bulk, caller_options,
                     done)) {
      static_cast<void>(ticket.release());  // StartRetried's now
      return;
    }
    if (ticket->unsent != nullptr) {  // no slot, and not retried after all (a payload came)
      request_bulk.Reset();
      return done(internal::TakeUnsent(*ticket));
    }
  }
  // Through the channel's interceptors: the call goes with their options (the metadata they
  // added, encoded already), and their end runs before `done`, whichever way the call ends.
  const CallOptions* intercepted_options = &caller_options;
  if (ABSL_PREDICT_FALSE(ticket->intercepted != nullptr)) {
    std::unique_ptr<internal::InterceptedCall> intercepted(
        std::exchange(ticket->intercepted, nullptr));
    intercepted_options = &intercepted->options();
    done = internal::InterceptedCall::Wrap(std::move(intercepted), std::move(done));
  }
  const CallOptions& options = *intercepted_options;
  if (!request_bulk.empty() && !method.request_bulk) {
    ticket->ReleaseSlot();
    request_bulk.Reset();
    done(absl::InvalidArgumentError(absl::StrCat(
        method.full_name, ": a request bulk payload for a method without request_bulk")));
    return;
  }
  if (!options.response_destination.empty()) {
    const internal::Registration* registration =
        internal::BulkAccess::registration(options.response_destination);
    absl::Status refused;
    if (!method.response_bulk) {
      refused = absl::InvalidArgumentError(absl::StrCat(
          method.full_name, ": a response_destination for a method without response_bulk"));
    } else if (registration->device() != impl_->device().get()) {
      refused = absl::InvalidArgumentError(
          absl::StrCat(method.full_name,
                       ": the response_destination is registered on another device; "
                       "register it on this channel (ClientChannel::RegisterMemory)"));
    }
    if (!refused.ok()) {
      ticket->ReleaseSlot();
      request_bulk.Reset();
      done(std::move(refused));
      return;
    }
  }
  const internal::ChannelImpl::MethodState state = impl_->MethodFor(method);
  internal::ClientCall call;
  call.method = &method;
  call.response = response;
  call.sends_metadata = !options.metadata.empty();
  call.trailing = options.trailing_metadata;
  call.response_bulk = response_bulk;
  call.done = std::move(done);
  call.metrics = state.metrics;
  if (!options.response_destination.empty()) {
    call.destination = options.response_destination;
    call.landing = std::make_shared<internal::BulkGate>(/*held=*/false);
  }
  const size_t block = internal::RequestMetadataBlock(options);
  if (ticket->waiting) {
    ticket->connection->StartWaiting(state.service_id, std::exchange(ticket->large, nullptr), block,
                                     slot.size, std::move(request_bulk), std::move(call), options,
                                     ticket->timing);
    return;
  }
  OutgoingBulk large_body;
  size_t body_size = block + slot.size;
  if (uint8_t* large = std::exchange(ticket->large, nullptr)) {
    large_body = OutgoingBulk(large, slot.size, [large] { std::free(large); });
    body_size = block;
  }
  ticket->connection->Start(state.service_id, ticket->buffer, body_size, std::move(large_body),
                            std::move(request_bulk), std::move(call), options, ticket->timing);
}

ABSL_ATTRIBUTE_NOINLINE bool ClientChannel::StartRetried(const MethodInfo& method, SendSlot slot,
                                                         bool request_bulk,
                                                         ::google::protobuf::MessageLite* response,
                                                         IncomingBulk* response_bulk,
                                                         const CallOptions& options,
                                                         DoneCallback& done) {
  internal::Retrier* retrier = impl_->retrier();
  // A payload on a method without request_bulk is refused on the usual path.
  if (retrier == nullptr || request_bulk || !internal::Retried(method, options)) {
    return false;
  }
  auto* ticket = reinterpret_cast<internal::SlotTicket*>(static_cast<uintptr_t>(slot.token));
  std::string request(reinterpret_cast<const char*>(slot.data), slot.size);  // for the retries
  const absl::Time deadline = ticket->timing.deadline;
  absl::Status unsent;
  if (ABSL_PREDICT_FALSE(ticket->unsent != nullptr)) {
    // It found no connection: the first attempt is over already.
    unsent = internal::TakeUnsent(*ticket);
    internal::TicketDeleter()(ticket);
    slot = SendSlot{};
  }
  retrier->Start(method, std::move(request), slot, std::move(unsent), response, response_bulk,
                 options, deadline, done);
  return true;
}

std::unique_ptr<ClientStreamCall> ClientChannel::OpenStream(
    const MethodInfo& method, SendSlot slot, const google::protobuf::MessageLite* read_prototype,
    google::protobuf::MessageLite* response, const CallOptions& caller_options) {
  std::unique_ptr<internal::SlotTicket, internal::TicketDeleter> ticket(
      reinterpret_cast<internal::SlotTicket*>(static_cast<uintptr_t>(slot.token)));
  if (ABSL_PREDICT_FALSE(ticket->unsent != nullptr)) {
    // A slot for a unary call's retries (a MethodInfo that says unary, opened as a stream).
    return std::make_unique<internal::FailedStream>(internal::TakeUnsent(*ticket));
  }
  // Through the channel's interceptors: as StartUnaryCall; their end runs as the stream ends,
  // before its Finish returns.
  std::unique_ptr<internal::InterceptedCall> intercepted(
      std::exchange(ticket->intercepted, nullptr));
  const CallOptions& options = intercepted != nullptr ? intercepted->options() : caller_options;
  auto fail = [&](absl::Status status) -> std::unique_ptr<ClientStreamCall> {
    if (intercepted != nullptr) intercepted->End(status);
    return std::make_unique<internal::FailedStream>(std::move(status));
  };
  if (!method.streaming()) {
    ticket->ReleaseSlot();
    return fail(absl::InvalidArgumentError(
        absl::StrCat(method.full_name, ": not a streaming method; call it as a unary one")));
  }
  const internal::ChannelImpl::MethodState state = impl_->MethodFor(method);
  auto stream = std::make_shared<internal::StreamState>(
      read_prototype, impl_->options().stream_window, /*send_credit=*/0);
  internal::ClientCall call;
  call.method = &method;
  call.response = response;
  call.sends_metadata = !options.metadata.empty();
  call.trailing = options.trailing_metadata;
  call.metrics = state.metrics;
  call.stream = stream;
  if (ticket->waiting) {
    // A stream does not wait in the queue (its frames follow its opening in order, on slots of
    // their own): opened on a runtime thread with no slot free, it fails at once, as before.
    return fail(absl::ResourceExhaustedError(absl::StrCat(
        method.full_name,
        ": no send slot is free to open the stream, and a runtime thread (poller or timer) does "
        "not wait for one: open it from another thread, or raise "
        "ConnectionOptions::max_send_slots")));
  }
  call.done = [stream](absl::Status status) { stream->End(std::move(status)); };
  if (ABSL_PREDICT_FALSE(intercepted != nullptr)) {
    call.done = internal::InterceptedCall::Wrap(std::move(intercepted), std::move(call.done));
  }
  OutgoingBulk large_body;
  const size_t block = internal::RequestMetadataBlock(options);
  size_t body_size = block + slot.size;
  if (uint8_t* large = std::exchange(ticket->large, nullptr)) {
    large_body = OutgoingBulk(large, slot.size, [large] { std::free(large); });
    body_size = block;
  }
  const uint64_t id = ticket->connection->Start(
      state.service_id, ticket->buffer, body_size, std::move(large_body), OutgoingBulk(),
      std::move(call), options, ticket->timing, impl_->options().stream_window);
  auto opened =
      std::make_unique<internal::ClientStream>(ticket->connection, id, std::move(stream), method);
  if (ABSL_PREDICT_FALSE(intercepted_)) opened->SetInterceptors(&impl_->options().interceptors);
  return opened;
}

absl::Status ClientChannel::Connect(absl::Time deadline) {
  return impl_->ConnectAll(internal::ToMonotonic(deadline, internal::MonotonicNow()));
}
ChannelStats ClientChannel::stats() const { return impl_->stats(); }
absl::StatusOr<RegisteredMemory> ClientChannel::RegisterMemory(void* data, size_t size) {
  return RegisteredMemory::Register(impl_->device(), data, size);
}
const Metrics& ClientChannel::metrics() const { return impl_->metrics(); }
const std::string& ClientChannel::target() const { return impl_->target(); }

}  // namespace zrpc
