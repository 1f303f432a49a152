// Server (rpc/server.h) and ServerImpl: options, services, the listener, pollers, the sweeper
// thread, Shutdown.

#include "rpc/server.h"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "rpc/common/monotonic.h"
#include "rpc/common/runtime.h"
#include "rpc/common/shared_device.h"
#include "rpc/connection/rpc_header.h"
#include "rpc/server/server_impl.h"
#include "transport/log.h"
#include "transport/process_limits.h"

namespace zrpc {
namespace internal {

absl::StatusOr<std::unique_ptr<ServerImpl>> ServerImpl::Create(const ServerOptions& given) {
  // A server's size is not known at creation: kBySize (rpc/options.h) means its defaults.
  ServerOptions options = given;
  ServerSizesForBySize(options);
  if (absl::Status s = CheckRuntimeOptions(options, "ServerOptions"); !s.ok()) return s;
  if (options.handler_threads < 1 || options.handler_threads > 1024) {
    return absl::InvalidArgumentError(absl::StrCat("ServerOptions::handler_threads is ",
                                                   options.handler_threads,
                                                   "; it must be in [1, 1024]"));
  }
  if (options.max_streams_per_connection < 1 || options.max_streams < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ServerOptions::max_streams_per_connection is ", options.max_streams_per_connection,
        " and max_streams ", options.max_streams, "; each must be at least 1"));
  }
  if (absl::Status s = CheckInterceptors(options.interceptors, "ServerOptions"); !s.ok()) return s;
  if (options.max_pollers < 0 || options.max_pollers > 64) {
    return absl::InvalidArgumentError(
        absl::StrCat("ServerOptions::max_pollers is ", options.max_pollers,
                     "; it must be in [0, 64] (at or below pollers: pollers, none added)"));
  }
  if (options.park_windows && options.shared_receive_queue == 0) {
    return absl::InvalidArgumentError(
        "ServerOptions::park_windows is set with shared_receive_queue = 0: windows park on a "
        "shared receive queue's floors; set shared_receive_queue (4,096 by default) or leave "
        "park_windows false");
  }
  for (const auto& [name, value] : {std::pair<const char*, absl::Duration>{
                                        "liveness_probe_interval", options.liveness_probe_interval},
                                    {"idle_probe_interval", options.idle_probe_interval},
                                    {"max_connection_idle", options.max_connection_idle}}) {
    if (value < absl::ZeroDuration()) {
      return absl::InvalidArgumentError(absl::StrCat("ServerOptions::", name, " is ",
                                                     absl::FormatDuration(value),
                                                     "; it must be zero (never) or positive"));
    }
  }
  if (!(options.idle_keepalive_budget >= 0)) {  // NaN too
    return absl::InvalidArgumentError(absl::StrCat("ServerOptions::idle_keepalive_budget is ",
                                                   options.idle_keepalive_budget,
                                                   "; it must be zero (no advice) or positive"));
  }
  uint32_t shared_receive_queue = SharedQueueWithinLockedMemory(
      options.shared_receive_queue, options.slots.slot_size, options.pollers,
      options.listener.connection.idle_recv_credits, "server");
  const int max_pollers = std::max(options.pollers, options.max_pollers);
  if (const uint64_t queued = static_cast<uint64_t>(max_pollers) * shared_receive_queue;
      queued >= options.slots.max_slots) {
    // The pollers could not fill their queues from the pool and leave it slots for sends and
    // credit frames, while admission had counted their places: refused here.
    return absl::InvalidArgumentError(absl::StrCat(
        "ServerOptions: ", max_pollers, " pollers (pollers = ", options.pollers, ", max_pollers = ",
        options.max_pollers, ") with shared receive queues of ", shared_receive_queue,
        " receives take ", queued, " slots, more than slots.max_slots = ", options.slots.max_slots,
        " holds with slots left for sends: lower pollers, max_pollers or shared_receive_queue, or "
        "raise slots.max_slots"));
  }
  // The device decides whether receives are shared: opened now, after every check of the options
  // alone (OpenRuntime below finds the same one, the process's, held here meanwhile), so that
  // admission is sized for what the pollers will have.
  absl::StatusOr<std::shared_ptr<transport::Device>> device =
      SharedDevice(options.device, options.slots);
  if (!device.ok()) return device.status();
  if (SharedQueueOnDevice(**device, shared_receive_queue, "server") != shared_receive_queue) {
    shared_receive_queue = 0;
    options.park_windows = false;  // windows park on a shared queue's floors
  }
  ServerOptions adjusted = options;
  adjusted.shared_receive_queue = shared_receive_queue;
  adjusted.arena_pool = ArenaPoolWithinLockedMemory(
      options.arena_pool, options.listener.connection.arena_size, options.pollers, "server");
  const uint32_t arena_piece =
      adjusted.arena_pool > 0 ? adjusted.listener.connection.arena_size : 0;
  transport::ConnectionOptions& connection = adjusted.listener.connection;
  connection.min_message_size = std::max(connection.min_message_size, kMinRpcMessage);
  // Every call a connection may hold (one per receive credit) and every stream can hold its
  // answer too, plus errors and keepalive answers: fewer send slots would make answers fail
  // instead of wait. Stream frames leave those free, and have 8 at least of their own.
  connection.max_send_slots =
      std::max<uint32_t>(connection.max_send_slots, ServerImpl::AnswerSlots(adjusted) + 8);
  std::unique_ptr<ServerImpl> core(new ServerImpl(adjusted));
  if (adjusted.health_service) {
    core->health_ = std::make_unique<HealthService>([core = core.get()] { core->KickHealth(); });
    if (absl::Status added = core->AddService(core->health_.get()); !added.ok()) return added;
  }
  absl::StatusOr<RuntimeParts> parts = OpenRuntime(adjusted, "ServerOptions", arena_piece);
  if (!parts.ok()) return parts.status();
  // Lent on demand when the pollers have pools: a device without type-2 memory windows makes
  // none, and its connections register arenas of their own.
  const bool lend = arena_piece > 0 && parts->pollers.front()->arena_pool() != nullptr;
  SayNoWindowsOnce(*parts->device, lend ? 0 : arena_piece, "server", "ServerOptions");
  core->options_.listener.connection.arena_on_demand = lend;
  if (!lend) core->options_.arena_pool = 0;
  core->device_ = std::move(parts->device);
  core->staging_ = std::move(parts->staging);
  core->receive_limits_ = std::move(parts->receive_limits);
  core->max_pollers_ = max_pollers;
  core->manual_pollers_ = parts->manual_pollers;
  core->pool_ = std::make_unique<HandlerPool>(options.handler_threads, options.spin);
  // Admission within what the pollers can hold: a connection refused at the door ("server
  // full") is better than one accepted and then refused its completion-queue entries or its
  // shared receive queue's window, and no single address may take every place. Every poller is
  // made alike, so those not started yet hold what the first does.
  transport::ListenerOptions& listener = core->options_.listener;
  const uint64_t per_poller = parts->pollers.front()->Capacity(listener.connection);
  const uint64_t capacity = static_cast<uint64_t>(core->max_pollers_) * per_poller;
  {
    absl::MutexLock lock(&core->pollers_mu_);
    core->pollers_ = std::move(parts->pollers);
  }
  if (capacity == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ServerOptions: the pollers have room for no connection",
        adjusted.shared_receive_queue > 0
            ? absl::StrCat(": shared_receive_queue is ", adjusted.shared_receive_queue,
                           ", less than one floor of listener.connection.idle_recv_credits = ",
                           listener.connection.idle_recv_credits)
            : " (their completion queues' entries)"));
  }
  // And within the memory the process may lock: past RLIMIT_MEMLOCK every registration fails, and
  // a connection would be accepted only to be refused its arena.
  const transport::LockedMemory memory = transport::ReadLockedMemory();
  uint64_t per_connection = transport::RegisteredPerIdleConnection(
      listener.connection, adjusted.shared_receive_queue > 0, core->device_->slots().slot_size());
  if (adjusted.shared_receive_queue > 0 && per_poller > 0) {
    // And its share of its poller's queue: a poller added later registers a whole queue for the
    // connections it will hold.
    const uint64_t queue =
        uint64_t{adjusted.shared_receive_queue} * core->device_->slots().slot_size();
    per_connection += (queue + per_poller - 1) / per_poller;
  }
  if (lend && per_poller > 0) {
    // And its share of its poller's arena pool, all of whose pieces may be lent at once.
    const uint64_t pool = uint64_t{core->options_.arena_pool} * arena_piece;
    per_connection += (pool + per_poller - 1) / per_poller;
  }
  const uint64_t fits = transport::ConnectionsWithin(memory, per_connection);
  if (fits == 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "ServerOptions: the process may lock no more memory for a connection: ",
        transport::RaiseLockedMemoryAdvice(memory, per_connection, listener.max_connections)));
  }
  if (fits < std::min<uint64_t>(listener.max_connections, capacity)) {
    ZRPC_LOG(kWarning, "rpc", "the server admits ", fits, " connections, not ",
             listener.max_connections, ": ",
             transport::RaiseLockedMemoryAdvice(memory, per_connection, listener.max_connections));
  }
  const uint32_t configured = listener.max_connections;
  listener.max_connections = static_cast<uint32_t>(
      std::max<uint64_t>(1, std::min<uint64_t>({listener.max_connections, capacity, fits})));
  // One address takes at most half of what the server holds, so that it can never fill it,
  // unless the limit per address was set to max_connections or more and the server holds all it
  // was set to: that is meant (a proxy in front of every client, a one-host test) and stands.
  const bool whole =
      listener.max_connections_per_peer >= configured && listener.max_connections == configured;
  const uint32_t per_peer_bound = whole ? listener.max_connections : listener.max_connections / 2;
  listener.max_connections_per_peer =
      std::max<uint32_t>(1, std::min(listener.max_connections_per_peer, per_peer_bound));
  return core;
}

ServerImpl::~ServerImpl() { Shutdown(absl::ZeroDuration()); }

absl::Status ServerImpl::AddService(Service* service) {
  if (started_ || shut_down_) {
    return absl::FailedPreconditionError("AddService must come before Start");
  }
  const ServiceInfo& info = service->service_info();
  const uint32_t id = ServiceId(info.full_name);
  if (id == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(info.full_name, " hashes to service id 0, which the wire reserves"));
  }
  if (auto it = services_.find(id); it != services_.end()) {
    const char* other = it->second.service->service_info().full_name;
    return absl::AlreadyExistsError(
        absl::string_view(other) == info.full_name
            ? absl::StrCat(info.full_name, " is already served")
            : absl::StrFormat("%s and %s have the same service id 0x%08x (FNV-1a of the full "
                              "name); rename one",
                              info.full_name, other, id));
  }
  if (id == kKeepaliveServiceId) {
    return absl::InvalidArgumentError("zrpc.Keepalive is reserved for the runtime's keepalives");
  }
  // An AsyncService's handlers return at once, so its unary methods run inline by default: a
  // hand-off to the pool would cost more than the handler (THREADING.md, "Server").
  ServiceEntry entry{
      service,
      std::vector<bool>(info.method_count, options_.inline_by_default || service->handlers_async()),
      {},
      service->serves_streams_async()};
  for (int i = 0; i < info.method_count; ++i) {
    if (info.methods[i].streaming()) entry.inline_methods[i] = false;
    entry.metrics.push_back(&metrics_.ForMethod(MetricsSide::kServer, info.methods[i].full_name));
  }
  services_.emplace(id, std::move(entry));
  return absl::OkStatus();
}

absl::Status ServerImpl::SetInline(absl::string_view method, bool inline_handler) {
  if (started_ || shut_down_) {
    return absl::FailedPreconditionError("SetInline must come before Start");
  }
  for (auto& [id, entry] : services_) {
    const ServiceInfo& info = entry.service->service_info();
    for (int i = 0; i < info.method_count; ++i) {
      if (method == info.methods[i].full_name) {
        if (inline_handler && info.methods[i].streaming()) {
          return absl::InvalidArgumentError(
              absl::StrCat(method,
                           " is a streaming method: its handler runs on a thread of its own, never "
                           "inline on a poller (it may block for as long as its stream lasts)"));
        }
        entry.inline_methods[i] = inline_handler;
        return absl::OkStatus();
      }
    }
  }
  return absl::NotFoundError(absl::StrCat("no method \"", method,
                                          "\" in the services added so far (a method is named "
                                          "\"package.Service/Method\")"));
}

absl::Status ServerImpl::SetAuthKeys(std::vector<transport::AuthKey> keys) {
  absl::MutexLock lock(&mu_);
  if (listener_ != nullptr) return listener_->SetAuthKeys(std::move(keys));
  if (started_) return absl::FailedPreconditionError("the server was shut down");
  if (!keys.empty()) {
    if (auto ring = transport::AuthKeyring::Create(keys); !ring.ok()) return ring.status();
  }
  options_.listener.connection.auth_keys = std::move(keys);
  return absl::OkStatus();
}

absl::Status ServerImpl::Start() {
  if (started_ || shut_down_) {
    return absl::FailedPreconditionError(shut_down_ ? "the server was shut down"
                                                    : "the server already started");
  }
  absl::StatusOr<std::unique_ptr<transport::Listener>> listener = transport::Listener::Create(
      *device_, options_.address, options_.port, this, options_.listener);
  if (!listener.ok()) return listener.status();
  if (health_ != nullptr) {
    // Before the listener answers anyone (its thread starts below): a client's first Check
    // already says SERVING.
    health_->SetIfUnset("", health::v1::HealthCheckResponse::SERVING);
    for (const auto& [id, entry] : services_) {
      health_->SetIfUnset(entry.service->service_info().full_name,
                          health::v1::HealthCheckResponse::SERVING);
    }
  }
  {
    absl::MutexLock lock(&mu_);
    listener_ = *std::move(listener);
    port_ = listener_->port();
  }
  started_ = true;
  sweeper_ = std::thread([this] { SweepLoop(); });
  listening_.store(true, std::memory_order_release);
  return absl::OkStatus();
}

void ServerImpl::WaitForSlot(std::weak_ptr<StreamListener> waiter) {
  {
    std::lock_guard<std::mutex> lock(sweep_mu_);
    // A millisecond for the pollers to free slots, then every waiter tries again.
    if (slot_waiters_.empty()) slot_retry_at_ = MonotonicNow() + SlotRetry();
    if (!slot_waiters_.Add(std::move(waiter))) return;
  }
  sweep_cv_.notify_one();
}

void ServerImpl::WatchDeadline(absl::Time deadline, std::weak_ptr<StreamState> stream) {
  bool earliest;
  {
    std::lock_guard<std::mutex> lock(sweep_mu_);
    // Streams that finished leave their entries until their deadlines: past twice what the last
    // pruning left, those are dropped, so the map stays within twice the streams alive.
    if (deadlines_.size() >= std::max<size_t>(1024, 2 * deadlines_pruned_)) {
      for (auto it = deadlines_.begin(); it != deadlines_.end();) {
        it = it->second.expired() ? deadlines_.erase(it) : std::next(it);
      }
      deadlines_pruned_ = deadlines_.size();
    }
    earliest = deadlines_.empty() || deadline < deadlines_.begin()->first;
    deadlines_.emplace(deadline, std::move(stream));
  }
  if (earliest) sweep_cv_.notify_one();
}

void ServerImpl::KickHealth() {
  {
    std::lock_guard<std::mutex> lock(sweep_mu_);
    health_kick_ = true;
  }
  sweep_cv_.notify_one();
}

void ServerImpl::SweepLoop() {
  MarkRuntimeTimerThread();  // stream callbacks run here (slot retries, deadlines)
  // A pass at least every second, and often enough for short settings (tests).
  const absl::Duration idle_probe = options_.idle_probe_interval;
  const absl::Duration max_idle = options_.max_connection_idle;
  const bool sweeps = idle_probe > absl::ZeroDuration() || max_idle > absl::ZeroDuration() ||
                      options_.liveness_probe_interval > absl::ZeroDuration();
  // Idle connections are looked at every eighth of the shorter idle setting.
  absl::Duration idle_look = absl::InfiniteDuration();
  if (idle_probe > absl::ZeroDuration()) idle_look = idle_probe / 8;
  if (max_idle > absl::ZeroDuration()) idle_look = std::min(idle_look, max_idle / 8);
  absl::Duration period = absl::Seconds(1);
  period = std::min(period, idle_look * 2);
  if (options_.liveness_probe_interval > absl::ZeroDuration()) {
    period = std::min(period, options_.liveness_probe_interval / 2);
  }
  period = std::max(period, absl::Milliseconds(10));
  absl::Time next_sweep = MonotonicNow() + period;
  // The connections a pass looks at: one vector for every pass, so that a pass allocates nothing
  // (it runs by the clock, and count_calls_test holds the server to no allocation per call).
  std::vector<std::shared_ptr<ServerConnection>> open;
  // The health service's watchers are looked at when it asks, and every second while there are
  // any (a watcher whose client gave up says so to no one).
  absl::Time next_health_flush = absl::InfinitePast();
  for (;;) {
    std::vector<std::weak_ptr<StreamListener>> retry;
    std::vector<std::shared_ptr<StreamState>> overdue;
    absl::Time now;
    bool flush_health = false;
    {
      std::unique_lock<std::mutex> lock(sweep_mu_);
      // Asleep until the next sweep, slot retry or stream deadline, whichever is first; told of
      // a new first one.
      for (;;) {
        if (sweep_stop_) return;
        now = MonotonicNow();
        absl::Time wake = sweeps ? next_sweep : now + absl::Hours(1);
        if (!slot_waiters_.empty()) wake = std::min(wake, slot_retry_at_);
        if (!deadlines_.empty()) wake = std::min(wake, deadlines_.begin()->first);
        if (health_ != nullptr && health_->watchers() > 0) {
          wake = std::min(wake, next_health_flush);
        }
        if (health_kick_ || wake <= now) break;
        sweep_cv_.wait_for(lock, absl::ToChronoNanoseconds(wake - now));
      }
      flush_health = std::exchange(health_kick_, false) || now >= next_health_flush;
      if (!slot_waiters_.empty() && slot_retry_at_ <= now) retry = slot_waiters_.Take();
      while (!deadlines_.empty() && deadlines_.begin()->first <= now) {
        if (std::shared_ptr<StreamState> stream = deadlines_.begin()->second.lock()) {
          overdue.push_back(std::move(stream));
        }
        deadlines_.erase(deadlines_.begin());
      }
      deadlines_pruned_ = std::min(deadlines_pruned_, deadlines_.size());
    }
    // Outside the lock: these run stream callbacks, which may ask for the next retry.
    for (const std::shared_ptr<StreamState>& stream : overdue) {
      stream->End(absl::DeadlineExceededError("the call's deadline passed"));
    }
    StreamWaiters::Tell(retry);
    if (flush_health && health_ != nullptr) {
      health_->Flush();  // on this runtime thread its Writes never wait for a send slot
      next_health_flush = now + absl::Seconds(1);
    }
    if (!sweeps || now < next_sweep) continue;
    next_sweep = now + period;
    // Idle connections are looked at every eighth of the idle settings (ServerConnection::
    // SweepPass), so the pass takes references to the connections due only: a reference to each
    // of ten thousand every second was a third of the server's idle CPU (benchmarks/README).
    const absl::Time looked_by =
        idle_look != absl::InfiniteDuration() ? now - idle_look : absl::InfinitePast();
    SweepLimits limits;
    limits.probe = options_.liveness_probe_interval;
    limits.idle_probe = idle_probe;
    limits.max_idle = max_idle;
    {
      absl::MutexLock lock(&mu_);
      limits.idle_silence = IdleSilenceBeforeProbe(
          idle_probe, IdleIntervalAdvice(connections_.size(), options_.idle_keepalive_budget,
                                         options_.max_connection_idle));
      for (auto& [handler, connection] : connections_) {
        if (connection->DueForSweep(looked_by, limits.probe > absl::ZeroDuration())) {
          open.push_back(connection);
        }
      }
    }
    for (auto& connection : open) connection->SweepPass(now, limits);
    open.clear();  // the references go; the capacity stays
  }
}

std::shared_ptr<transport::Poller> ServerImpl::PickPoller() {
  const transport::ConnectionOptions& options = options_.listener.connection;
  std::shared_ptr<transport::Poller> fallback;
  {
    absl::MutexLock lock(&pollers_mu_);
    const size_t count = pollers_.size();
    if (count == 0) return nullptr;  // Shutdown took them
    const size_t first = next_poller_++ % count;
    // Round robin over those with room; with none, one more poller if max_pollers allows.
    for (size_t i = 0; i < count; ++i) {
      const std::shared_ptr<transport::Poller>& poller = pollers_[(first + i) % count];
      if (poller->HasRoomFor(options)) return poller;
    }
    fallback = pollers_[first];  // full: its Register refuses the connection, saying why
    if (count >= static_cast<size_t>(max_pollers_) || draining() ||
        MonotonicNow() < next_poller_attempt_) {
      return fallback;
    }
  }
  // Made outside the lock (a CQ, a thread, a shared queue's slots take a while, and stats() must
  // not wait for them): only the listener's thread adds pollers, one at a time, and Shutdown
  // stops that thread before it takes the pollers.
  absl::StatusOr<std::shared_ptr<transport::Poller>> added = StartPoller(
      *device_, options_, manual_pollers_,
      options_.listener.connection.arena_on_demand ? options_.listener.connection.arena_size : 0);
  absl::MutexLock lock(&pollers_mu_);
  if (!added.ok()) {
    // Tried again a second later at the earliest: a storm of connections must not make the
    // listener build and fail a poller for each.
    next_poller_attempt_ = MonotonicNow() + absl::Seconds(1);
    if (!poller_failure_logged_) {
      poller_failure_logged_ = true;
      ZRPC_LOG(kWarning, "rpc", "the server could not add poller ", pollers_.size() + 1, " of ",
               max_pollers_, " (it goes on with ", pollers_.size(),
               " and tries again at most once a second): ", added.status().ToString());
    }
    return fallback;
  }
  pollers_.push_back(*std::move(added));
  return pollers_.back();
}

absl::StatusOr<transport::Placement> ServerImpl::Place(const std::string&) {
  if (draining()) return absl::UnavailableError("the server is shutting down");
  std::shared_ptr<transport::Poller> poller = PickPoller();
  if (poller == nullptr) return absl::UnavailableError("the server is shutting down");
  auto connection = std::make_shared<ServerConnection>(*this, poller);
  ServerConnection* handler = connection.get();
  {
    absl::MutexLock lock(&mu_);
    connections_.emplace(handler, connection);
  }
  // The transport connection co-owns its handler (listener.h): whichever of this thread's
  // OnAccepted and the poller's OnClosed comes last, the handler is alive for both.
  transport::Placement placement{poller.get(), handler, std::move(connection)};
  // The keepalive advice from the start (WIRE.md, "Accept data"): a connection made in a storm
  // spreads its first idle check over the interval asked for, instead of checking within the
  // client's own 20 s and learning the advice only from that answer.
  const uint32_t advice = AcceptAdviceMs();
  handler->NoteAdvice(advice);
  placement.accept_data = EncodeAcceptData(advice);
  return placement;
}

void ServerImpl::OnAccepted(std::shared_ptr<transport::Connection> connection) {
  accepted_.fetch_add(1, std::memory_order_relaxed);
  // Alive: `connection` owns its handler (see Place), even when OnClosed already ran.
  auto* handler = static_cast<ServerConnection*>(connection->handler());
  handler->Attach(std::move(connection));
}

void ServerImpl::OnRefused(const std::string&, transport::ConnectionHandler* placed,
                           const absl::Status&) {
  if (placed == nullptr) return;
  std::shared_ptr<ServerConnection> dropped;  // released after the lock
  absl::MutexLock lock(&mu_);
  auto it = connections_.find(placed);
  if (it == connections_.end()) return;
  dropped = std::move(it->second);
  connections_.erase(it);
}

void ServerImpl::ConnectionClosed(ServerConnection* connection, std::string peer) {
  ClosedConnection record{std::move(peer), MonotonicNow() - connection->placed(), absl::Now(),
                          connection->last_error()};
  std::shared_ptr<ServerConnection> closed;
  absl::MutexLock lock(&mu_);
  auto it = connections_.find(connection);
  if (it == connections_.end()) return;
  closed = std::move(it->second);
  connections_.erase(it);
  closed_.fetch_add(1, std::memory_order_relaxed);
  if (recently_closed_.size() == kRecentlyClosed) recently_closed_.pop_front();
  recently_closed_.push_back(std::move(record));
  // `closed` is released after the lock; its calls, if any, still hold it.
}

absl::Duration IdleIntervalAdvice(size_t connections, double budget, absl::Duration max_idle) {
  if (budget <= 0 || connections == 0) return absl::ZeroDuration();
  // No bound from idle_probe_interval: a quiet idle connection that spoke before is probed, not
  // closed (IdleSilenceBeforeProbe waits longer than the advice), so a late ping loses nothing.
  absl::Duration interval = absl::Seconds(static_cast<double>(connections) / budget);
  // max_connection_idle does close: pings well within it (they count as words).
  if (max_idle > absl::ZeroDuration()) interval = std::min(interval, max_idle / 3);
  return interval;
}

absl::Duration IdleSilenceBeforeProbe(absl::Duration idle_probe, absl::Duration advice) {
  if (idle_probe <= absl::ZeroDuration()) return absl::InfiniteDuration();
  return std::max(idle_probe, advice + advice / 2);
}

uint32_t ServerImpl::IdleIntervalAdviceMs() {
  size_t open;
  {
    absl::MutexLock lock(&mu_);
    open = connections_.size();
  }
  const absl::Duration advice =
      IdleIntervalAdvice(open, options_.idle_keepalive_budget, options_.max_connection_idle);
  return static_cast<uint32_t>(
      std::min<int64_t>(absl::ToInt64Milliseconds(advice), std::numeric_limits<uint32_t>::max()));
}

uint32_t ServerImpl::AcceptAdviceMs() {
  const uint32_t advice = IdleIntervalAdviceMs();
  if (options_.idle_probe_interval <= absl::ZeroDuration()) return advice;
  const int64_t most = absl::ToInt64Milliseconds(options_.idle_probe_interval * 2 / 3);
  return static_cast<uint32_t>(std::min<int64_t>(advice, most));
}

void ServerImpl::CallStarted() { calls_.Started(); }

void ServerImpl::CallDone() {
  // Counting the retirement is a call's last touch of the core: once no call is in flight
  // during Shutdown, Shutdown may return and the core be freed. So while draining it happens
  // under mu_, whose release also wakes Shutdown; otherwise nothing waits, and nothing follows
  // it. (A drain that begins between the check and the count is seen by Shutdown's next
  // periodic look: it never waits on a wake-up alone.) Per thread, no atomic add: call_counts.h.
  if (draining()) {
    absl::MutexLock lock(&mu_);
    calls_.Retired();
    return;
  }
  calls_.Retired();
}

void ServerImpl::Shutdown(absl::Duration grace) {
  if (shut_down_) return;
  shut_down_ = true;
  const absl::Time grace_end = MonotonicNow() + grace;  // monotonic.h, like every time below
  draining_.store(true, std::memory_order_release);
  // Watchers hear NOT_SERVING now, before the grace period, and their streams finish: a balancer
  // stops sending here, and Shutdown does not wait for streams that would last for ever.
  if (health_ != nullptr) health_->Shutdown();
  {
    // No new connections; unfinished handshakes are dropped. Destroyed outside mu_: its thread
    // may be in OnAccept, which takes it.
    std::unique_ptr<transport::Listener> listener;
    {
      absl::MutexLock lock(&mu_);
      listener = std::move(listener_);
      if (listener != nullptr) {
        peak_connections_ = listener->peak_connections();
        auth_counts_ = listener->auth_counts();
      }
    }
  }

  // Waits under mu_ until `done` or `deadline`, looking again at least every 10 ms: a count
  // may reach zero without a wake-up (CallDone).
  auto wait = [this](bool (*done)(ServerImpl*),
                     absl::Time deadline) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    while (!done(this) && MonotonicNow() < deadline) {
      mu_.AwaitWithTimeout(absl::Condition(done, this),
                           std::min(absl::Milliseconds(10), deadline - MonotonicNow()));
    }
  };
  auto no_calls_left = +[](ServerImpl* core) { return core->calls_.in_flight() == 0; };
  std::vector<std::shared_ptr<ServerConnection>> open;
  {
    absl::MutexLock lock(&mu_);
    wait(no_calls_left, grace_end);
    for (auto& [handler, connection] : connections_) open.push_back(connection);
  }
  const absl::Status unavailable =
      absl::UnavailableError("the server shut down before the call finished");
  for (auto& connection : open) connection->AnswerAll(unavailable);
  // Answers handed to the transport may still wait for credits or sit in the send queue:
  // closing now would cut them off, and the client would see a disconnect instead of its
  // answer. Wait until they reached the clients, up to the grace period's end but at least
  // kAnswerFlush (so answers given past the grace go out too); a client that stops returning
  // credits costs that much and no more.
  constexpr absl::Duration kAnswerFlush = absl::Milliseconds(500);
  const absl::Time flush_end = std::max(grace_end, MonotonicNow() + kAnswerFlush);
  for (auto& connection : open) {
    while (!connection->SendsDrained() && MonotonicNow() < flush_end) {
      absl::SleepFor(absl::Microseconds(200));
    }
  }
  for (auto& connection : open) connection->Close();
  open.clear();
  {
    // Handlers still running hold their connections; each returns and finishes (its answer
    // discarded). Nothing can be taken back from a handler that never returns: wait for it.
    absl::MutexLock lock(&mu_);
    wait(no_calls_left, absl::InfiniteFuture());
    // Every connection's OnClosed comes from its poller; drained connections leave the map.
    auto all_closed =
        +[](ServerImpl* core) ABSL_NO_THREAD_SAFETY_ANALYSIS { return core->connections_.empty(); };
    wait(all_closed, MonotonicNow() + absl::Seconds(5));
  }
  // The sweeper is also the asynchronous streams' slot retry (WaitForSlot): it stops once every
  // call has finished.
  if (sweeper_.joinable()) {
    {
      std::lock_guard<std::mutex> lock(sweep_mu_);
      sweep_stop_ = true;
    }
    sweep_cv_.notify_one();
    sweeper_.join();
  }
  // Null when Create failed before making it (OpenRuntime's error): the destructor comes here.
  if (pool_ != nullptr) pool_->Shutdown();
  stream_threads_.JoinAll();  // every stream's call finished above: its thread is returning
  // Closes and drains what is still registered; a payload a user still holds keeps its poller
  // object (and CQ) until released, with the loop stopped.
  std::vector<std::shared_ptr<transport::Poller>> pollers;
  {
    absl::MutexLock lock(&pollers_mu_);
    pollers.swap(pollers_);
  }
  for (auto& poller : pollers) poller->Shutdown();
  pollers.clear();
  absl::MutexLock lock(&mu_);
  connections_.clear();
}

uint16_t ServerImpl::port() const { return port_; }

namespace {

// `text` as the inside of a JSON string. An error's message may quote what a peer sent: every
// byte outside printable ASCII becomes \u00XX (a byte, not a code point: the page stays valid
// JSON whatever the bytes were).
std::string JsonEscape(absl::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (const char c : text) {
    const unsigned char u = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') {
      out.push_back('\\');
      out.push_back(c);
    } else if (u < 0x20 || u >= 0x7f) {
      absl::StrAppend(&out, absl::StrFormat("\\u%04x", u));
    } else {
      out.push_back(c);
    }
  }
  return out;
}

// A connection's last error on /connections: `null` or {"message":..., "seconds_ago":...} in
// JSON; ` last_error="..." (N s ago)` in text, quoted and escaped so that one connection stays one
// line whatever the message holds; nothing when there is none.
void AppendLastError(std::string* out, const RpcConnection::LastError& error, absl::Time now,
                     bool json) {
  const double ago = absl::ToDoubleSeconds(now - error.when);
  if (json) {
    if (error.what.empty()) return absl::StrAppend(out, "null");
    return absl::StrAppend(out, "{\"message\":\"", JsonEscape(error.what),
                           absl::StrFormat("\",\"seconds_ago\":%.3f}", ago));
  }
  if (error.what.empty()) return;
  absl::StrAppend(out, " last_error=\"", absl::CHexEscape(error.what), "\"",
                  absl::StrFormat(" (%.3fs ago)", ago));
}

}  // namespace

std::string ServerImpl::ConnectionsPage(bool json) const {
  const absl::Time now = absl::Now();
  std::vector<std::shared_ptr<ServerConnection>> open;
  std::deque<ClosedConnection> closed;
  {
    absl::MutexLock lock(&mu_);
    open.reserve(connections_.size());
    for (const auto& [handler, connection] : connections_) open.push_back(connection);
    closed = recently_closed_;
  }
  std::vector<ServerConnection::View> views;
  views.reserve(open.size());
  for (const auto& connection : open) views.push_back(connection->Look());
  open.clear();  // no reference kept past the look
  // Oldest first.
  std::sort(views.begin(), views.end(),
            [](const ServerConnection::View& a, const ServerConnection::View& b) {
              return a.age > b.age;
            });
  std::string out;
  if (json) {
    // Peers are numeric addresses ("ip:port", "[v6]:port"): nothing in them needs escaping.
    absl::StrAppend(&out, "{\"connections\":[");
    for (size_t i = 0; i < views.size(); ++i) {
      const ServerConnection::View& v = views[i];
      absl::StrAppend(&out, i == 0 ? "" : ",", "\n{\"peer\":\"", v.peer,
                      "\",\"auth_key_id\":", v.auth_key_id,
                      absl::StrFormat(",\"age_seconds\":%.3f", absl::ToDoubleSeconds(v.age)),
                      ",\"open\":", v.open ? "true" : "false", ",\"calls_in_flight\":", v.calls,
                      ",\"last_error\":");
      AppendLastError(&out, v.last_error, now, true);
      absl::StrAppend(&out, ",\"transport\":");
      if (!v.transport) {
        absl::StrAppend(&out, "null}");  // its domain was busy: asked again at the next look
        continue;
      }
      const transport::ConnectionStats& t = *v.transport;
      absl::StrAppend(
          &out, "{\"messages_sent\":", t.messages_sent,
          ",\"messages_received\":", t.messages_received, ",\"bulk_sent\":", t.bulk_sent,
          ",\"bulk_received\":", t.bulk_received, ",\"sends_outstanding\":", t.sends_outstanding,
          ",\"waiting\":", t.waiting, ",\"recv_window\":", t.recv_window,
          ",\"peer_recv_credits\":", t.peer_recv_credits, ",\"arena_in_use\":", t.arena_in_use,
          ",\"arena_lent\":", t.arena_lent ? "true" : "false", ",\"bytes_sent\":", t.bytes_sent,
          ",\"bytes_received\":", t.bytes_received, ",\"registered_bytes\":", t.registered_bytes,
          ",\"window_parked\":", t.window_parked ? "true" : "false", "}}");
    }
    absl::StrAppend(&out, "\n],\"recently_closed\":[");
    for (size_t i = 0; i < closed.size(); ++i) {
      const ClosedConnection& c = closed[i];
      absl::StrAppend(
          &out, i == 0 ? "" : ",", "\n{\"peer\":\"", c.peer, "\"",
          absl::StrFormat(",\"age_seconds\":%.3f,\"closed_seconds_ago\":%.3f",
                          absl::ToDoubleSeconds(c.age), absl::ToDoubleSeconds(now - c.closed)),
          ",\"last_error\":");
      AppendLastError(&out, c.last_error, now, true);
      absl::StrAppend(&out, "}");
    }
    absl::StrAppend(&out, "\n]}\n");
    return out;
  }
  absl::StrAppend(&out, "# ", views.size(),
                  " connections, oldest first: peer, key id, age, state, calls in flight, "
                  "messages and bulk payloads sent and received, sends outstanding and waiting, "
                  "receive window, arena bytes in use and whether lent, window parked, bytes "
                  "sent and received, registered bytes held; the last error, if any\n");
  for (const ServerConnection::View& v : views) {
    absl::StrAppend(&out, v.peer.empty() ? "-" : v.peer, " key=", v.auth_key_id,
                    absl::StrFormat(" age=%.3fs", absl::ToDoubleSeconds(v.age)),
                    v.open ? " open" : " closing", " calls=", v.calls);
    if (!v.transport) {
      absl::StrAppend(&out, " (busy: the rest at the next look)");
    } else {
      const transport::ConnectionStats& t = *v.transport;
      absl::StrAppend(
          &out, " sent=", t.messages_sent, "+", t.bulk_sent, " received=", t.messages_received, "+",
          t.bulk_received, " outstanding=", t.sends_outstanding, " waiting=", t.waiting,
          " window=", t.recv_window, " arena=", t.arena_in_use, t.arena_lent ? " lent" : "",
          t.window_parked ? " parked" : "", " bytes_sent=", t.bytes_sent,
          " bytes_received=", t.bytes_received, " registered=", t.registered_bytes);
    }
    AppendLastError(&out, v.last_error, now, false);
    absl::StrAppend(&out, "\n");
  }
  absl::StrAppend(&out, "# ", closed.size(),
                  " recently closed, newest last: peer, age when closed, closed how long ago; the "
                  "last error, if any\n");
  for (const ClosedConnection& c : closed) {
    absl::StrAppend(&out, c.peer.empty() ? "-" : c.peer,
                    absl::StrFormat(" age=%.3fs closed=%.3fs ago", absl::ToDoubleSeconds(c.age),
                                    absl::ToDoubleSeconds(now - c.closed)));
    AppendLastError(&out, c.last_error, now, false);
    absl::StrAppend(&out, "\n");
  }
  return out;
}

std::string ServerImpl::address() const {
  return options_.address.empty() ? device_->selection().addr : options_.address;
}

ServerStats ServerImpl::stats() const {
  ServerStats stats;
  stats.connections_accepted = accepted_.load(std::memory_order_relaxed);
  stats.connections_closed = closed_.load(std::memory_order_relaxed);
  {
    absl::MutexLock lock(&mu_);
    stats.connections_open = connections_.size();
    stats.connections_peak =
        listener_ != nullptr ? listener_->peak_connections() : peak_connections_;
    const transport::Listener::AuthCounts auth =
        listener_ != nullptr ? listener_->auth_counts() : auth_counts_;
    stats.authenticated = auth.authenticated;
    stats.auth_refused_no_key = auth.refused_no_key;
    stats.auth_refused_unknown_key = auth.refused_unknown_key;
    stats.auth_refused_unexpected_key = auth.refused_unexpected_key;
    stats.auth_refused_replay = auth.refused_replay;
    stats.auth_refused_bad_tag = auth.refused_bad_tag;
    stats.auth_refused_no_tag = auth.refused_no_tag;
  }
  {
    absl::MutexLock lock(&pollers_mu_);
    stats.pollers = pollers_.size();
    for (const auto& poller : pollers_) {
      stats.parked_windows += poller->parked_windows();
      stats.knocks_heard += poller->knocks_heard();
      stats.shared_queue_low_reports += poller->shared_queue_low_reports();
    }
  }
  if (device_ != nullptr) {
    const transport::AsyncEventCounts events = device_->async_events();
    stats.device_port_down = events.port_down;
    stats.device_port_active = events.port_active;
    stats.device_queue_pair_errors = events.queue_pair_errors;
  }
  stats.calls_started = calls_.started();
  stats.calls_in_flight = calls_.in_flight();
  stats.unimplemented = unimplemented_.load(std::memory_order_relaxed);
  stats.protocol_violations = closed_violations_.load(std::memory_order_relaxed);
  stats.cancels_received = cancels_.load(std::memory_order_relaxed);
  stats.keepalives_answered = keepalives_.load(std::memory_order_relaxed);
  stats.calls_skipped = skipped_.load(std::memory_order_relaxed);
  stats.answers_dropped = answers_dropped_.load(std::memory_order_relaxed);
  stats.connections_idle_closed = idle_closed_.load(std::memory_order_relaxed);
  stats.liveness_probes = probes_.load(std::memory_order_relaxed);
  stats.idle_probes = idle_probes_.load(std::memory_order_relaxed);
  stats.streams_started = stream_threads_.started();
  stats.streams_open = stream_threads_.running();
  stats.streams_refused = streams_refused_.load(std::memory_order_relaxed);
  stats.async_streams_started = async_streams_.load(std::memory_order_relaxed);
  stats.bulk_bytes_staged = staging_->staged_bytes();
  stats.bulk_bytes_zero_copy = staging_->zero_copy_bytes();
  stats.staging_bytes_registered = staging_->registered_bytes();
  stats.pulled_bytes_held = receive_limits_->in_use();
  stats.memory_registrations = device_->registrations();
  return stats;
}

}  // namespace internal

absl::StatusOr<std::unique_ptr<Server>> Server::Create(const ServerOptions& options) {
  absl::StatusOr<std::unique_ptr<internal::ServerImpl>> core =
      internal::ServerImpl::Create(options);
  if (!core.ok()) return core.status();
  return std::unique_ptr<Server>(new Server(*std::move(core), options.metrics_address));
}

Server::Server(std::unique_ptr<internal::ServerImpl> core, std::string metrics_address)
    : impl_(std::move(core)), metrics_address_(std::move(metrics_address)) {}
Server::~Server() {
  absl::MutexLock lock(&metrics_mu_);
  metrics_http_.reset();  // no scrape renders from a core being destroyed
}
absl::Status Server::AddService(Service* service) { return impl_->AddService(service); }
void Server::SetServingStatus(absl::string_view service, bool serving) {
  if (impl_->health() == nullptr) return;
  impl_->health()->Set(service, serving ? health::v1::HealthCheckResponse::SERVING
                                        : health::v1::HealthCheckResponse::NOT_SERVING);
}
absl::Status Server::SetInline(absl::string_view method, bool inline_handler) {
  return impl_->SetInline(method, inline_handler);
}
absl::Status Server::Start() {
  // The metrics endpoint binds first, so that a taken metrics port fails Start before any
  // client can connect; it is dropped again if the server itself cannot start.
  std::unique_ptr<MetricsHttpServer> http;
  absl::MutexLock lock(&metrics_mu_);
  if (!metrics_address_.empty() && metrics_http_ == nullptr) {
    // /healthz: the process answers. /readyz: started and not shutting down (Shutdown flips it
    // first, before its grace period, so a balancer stops sending new clients here).
    MetricsHttpServer::Pages pages;
    pages["/healthz"] = [] { return MetricsHttpServer::Page{"200 OK", "ok\n"}; };
    pages["/connections"] = [this] {
      return MetricsHttpServer::Page{"200 OK", impl_->ConnectionsPage(false)};
    };
    pages["/connections.json"] = [this] {
      return MetricsHttpServer::Page{"200 OK", impl_->ConnectionsPage(true), "application/json"};
    };
    pages["/readyz"] = [this] {
      if (impl_->ready()) return MetricsHttpServer::Page{"200 OK", "ready\n"};
      return MetricsHttpServer::Page{"503 Service Unavailable", impl_->draining()
                                                                    ? "not ready: shutting down\n"
                                                                    : "not ready: not started\n"};
    };
    absl::StatusOr<std::unique_ptr<MetricsHttpServer>> started = MetricsHttpServer::Start(
        metrics_address_, [this] { return PrometheusText(); }, absl::Seconds(2), std::move(pages));
    if (!started.ok()) {
      return absl::Status(started.status().code(), absl::StrCat("ServerOptions::metrics_address: ",
                                                                started.status().message()));
    }
    http = *std::move(started);
  }
  if (absl::Status s = impl_->Start(); !s.ok()) return s;
  if (http != nullptr) metrics_http_ = std::move(http);
  return absl::OkStatus();
}
void Server::Shutdown(absl::Duration grace) {
  impl_->Shutdown(grace);
  absl::MutexLock lock(&metrics_mu_);
  metrics_http_.reset();
}
uint16_t Server::metrics_port() const {
  absl::MutexLock lock(&metrics_mu_);
  return metrics_http_ == nullptr ? 0 : metrics_http_->port();
}

std::string Server::PrometheusText() const {
  std::string text = impl_->metrics().PrometheusText();
  const ServerStats s = stats();
  struct Family {
    const char* name;
    const char* type;
    const char* help;
    uint64_t value;
  };
  const Family families[] = {
      {"zrpc_server_connections_accepted_total", "counter", "Connections accepted.",
       s.connections_accepted},
      {"zrpc_server_connections_open", "gauge", "Connections open now.", s.connections_open},
      {"zrpc_server_connections_closed_total", "counter",
       "Connections accepted and since closed, for any reason.", s.connections_closed},
      {"zrpc_server_connections_peak", "gauge",
       "Most connections open or handshaking at once since the server started.",
       s.connections_peak},
      {"zrpc_server_pollers", "gauge",
       "Pollers running (ServerOptions::pollers, and those added up to max_pollers).", s.pollers},
      {"zrpc_server_connections_idle_closed_total", "counter",
       "Idle connections closed: never a word within ServerOptions::idle_probe_interval, or "
       "silent past max_connection_idle.",
       s.connections_idle_closed},
      {"zrpc_server_calls_in_flight", "gauge", "Calls started and not yet finished.",
       s.calls_in_flight},
      {"zrpc_server_unimplemented_total", "counter",
       "Requests for a service or method this server lacks.", s.unimplemented},
      {"zrpc_server_protocol_violations_total", "counter",
       "Connections closed for breaking the protocol.", s.protocol_violations},
      {"zrpc_server_cancels_received_total", "counter", "Cancels received from clients.",
       s.cancels_received},
      {"zrpc_server_keepalives_answered_total", "counter", "Keepalive pings answered.",
       s.keepalives_answered},
      {"zrpc_server_calls_skipped_total", "counter",
       "Calls whose caller gave up before a handler ran them.", s.calls_skipped},
      {"zrpc_server_answers_dropped_total", "counter",
       "Answers not sent because the caller had given up.", s.answers_dropped},
      {"zrpc_server_liveness_probes_total", "counter",
       "Probes of silent clients that hold calls or spoke since their last probe.",
       s.liveness_probes},
      {"zrpc_server_idle_probes_total", "counter",
       "Probes of idle connections silent past ServerOptions::idle_probe_interval.", s.idle_probes},
      {"zrpc_server_parked_windows", "gauge",
       "Connections whose receive window is parked (ServerOptions::park_windows).",
       s.parked_windows},
      {"zrpc_server_knocks_heard_total", "counter",
       "Knocks of parked clients asking for their window back.", s.knocks_heard},
      {"zrpc_server_shared_queue_low_total", "counter",
       "Reports of a shared receive queue below its low-water mark (a poller behind, or no slots).",
       s.shared_queue_low_reports},
      {"zrpc_device_port_down_total", "counter", "The RDMA port went down (the device's event).",
       s.device_port_down},
      {"zrpc_device_port_active_total", "counter",
       "The RDMA port became active (the device's event).", s.device_port_active},
      {"zrpc_device_queue_pair_errors_total", "counter",
       "Queue pairs the device failed (fatal, request, access or path migration errors).",
       s.device_queue_pair_errors},
      {"zrpc_server_authenticated_total", "counter",
       "Connections whose client proved it holds a key (listener.connection.auth_keys).",
       s.authenticated},
      {"zrpc_server_auth_refused_no_key_total", "counter",
       "Connection requests refused for presenting no key.", s.auth_refused_no_key},
      {"zrpc_server_auth_refused_unknown_key_total", "counter",
       "Connection requests refused for a key id this server does not hold.",
       s.auth_refused_unknown_key},
      {"zrpc_server_auth_refused_unexpected_key_total", "counter",
       "Connection requests refused for presenting a key to a server without keys.",
       s.auth_refused_unexpected_key},
      {"zrpc_server_auth_refused_replay_total", "counter",
       "Connection requests refused for repeating a recent nonce.", s.auth_refused_replay},
      {"zrpc_server_auth_refused_bad_tag_total", "counter",
       "Connections refused for a client tag that did not match.", s.auth_refused_bad_tag},
      {"zrpc_server_auth_refused_no_tag_total", "counter",
       "Connections refused for sending no tag (another frame, a hang-up, the timeout).",
       s.auth_refused_no_tag},
      {"zrpc_server_bulk_staged_bytes_total", "counter",
       "Response payload bytes copied into staging memory before sending.", s.bulk_bytes_staged},
      {"zrpc_server_bulk_zero_copy_bytes_total", "counter",
       "Response payload bytes sent straight from registered application memory.",
       s.bulk_bytes_zero_copy},
      {"zrpc_server_staging_registered_bytes", "gauge", "Staging memory registered now.",
       s.staging_bytes_registered},
      {"zrpc_server_pulled_bytes_held", "gauge",
       "Memory held by request payloads pulled from clients and not yet released.",
       s.pulled_bytes_held},
      {"zrpc_server_memory_registrations_total", "counter",
       "Memory registrations made on the server's device (each a system call pinning pages).",
       s.memory_registrations},
      {"zrpc_server_stream_threads_started_total", "counter",
       "Streams whose (blocking) handler got a thread of its own.", s.streams_started},
      {"zrpc_server_stream_threads_open", "gauge",
       "Stream handler threads running now (ServerOptions::max_streams).", s.streams_open},
      {"zrpc_server_async_streams_started_total", "counter",
       "Streams an AsyncService's handler took, with no thread.", s.async_streams_started},
      {"zrpc_server_streams_refused_total", "counter",
       "Streams refused past max_streams_per_connection or max_streams.", s.streams_refused},
  };
  for (const Family& f : families) AppendPrometheusFamily(text, f.name, f.type, f.help, f.value);
  return text;
}
uint16_t Server::port() const { return impl_->port(); }
std::string Server::address() const { return impl_->address(); }
ServerStats Server::stats() const { return impl_->stats(); }
absl::Status Server::SetAuthKeys(std::vector<transport::AuthKey> keys) {
  return impl_->SetAuthKeys(std::move(keys));
}
absl::StatusOr<RegisteredMemory> Server::RegisterMemory(void* data, size_t size) {
  return RegisteredMemory::Register(impl_->device(), data, size);
}
const Metrics& Server::metrics() const { return impl_->metrics(); }

}  // namespace zrpc
