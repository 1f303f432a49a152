// ServerImpl: the state behind zrpc::Server (server.h), shared with its connections and calls.
// Owns, in creation order: the device (shared with other servers and channels of the process),
// the staging pool, the pollers, the handler pool, the listener (destroyed in reverse).
#ifndef ZRPC_RPC_SERVER_SERVER_IMPL_H_
#define ZRPC_RPC_SERVER_SERVER_IMPL_H_

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "rpc/bulk/staging.h"
#include "rpc/generated_api.h"
#include "rpc/health/health_service.h"
#include "rpc/metrics.h"
#include "rpc/server.h"
#include "rpc/server/call_counts.h"
#include "rpc/server/handler_pool.h"
#include "rpc/server/server_connection.h"
#include "rpc/server/stream_threads.h"
#include "transport/device.h"
#include "transport/listener.h"
#include "transport/poller.h"

namespace zrpc::internal {

// The idle interval a server with `connections` open asks its clients for, so that their idle
// pings come to about `budget` a second together (ServerOptions::idle_keepalive_budget), at most a
// third of `max_idle` (ServerOptions::max_connection_idle; zero: no bound), so that clients
// keeping to it are not closed as idle. Zero: no advice.
absl::Duration IdleIntervalAdvice(size_t connections, double budget, absl::Duration max_idle);
// How long an idle connection may stay silent before the server probes its client's NIC:
// `idle_probe` (ServerOptions::idle_probe_interval), or half as long again as `advice` when that
// is longer, so that clients who ping at the advised interval (drawn from [3/4, 1] of it, checked
// on passes a second or so apart) are never probed. Zero `idle_probe`: never (InfiniteDuration).
absl::Duration IdleSilenceBeforeProbe(absl::Duration idle_probe, absl::Duration advice);

class ServerImpl final : public transport::AcceptHandler {
 public:
  // A service as dispatch sees it: the object, and per method whether it runs inline.
  struct ServiceEntry {
    Service* service;
    std::vector<bool> inline_methods;
    std::vector<MethodMetrics*> metrics;  // by method index
    bool async_streams = false;           // Service::serves_streams_async: no stream threads
  };

  static absl::StatusOr<std::unique_ptr<ServerImpl>> Create(const ServerOptions& options);
  ~ServerImpl() override;

  absl::Status AddService(Service* service);
  absl::Status SetInline(absl::string_view method, bool inline_handler);
  absl::Status Start();
  void Shutdown(absl::Duration grace);
  uint16_t port() const;
  std::string address() const;
  ServerStats stats() const;
  absl::Status SetAuthKeys(std::vector<transport::AuthKey> keys);
  // Null without ServerOptions::health_service.
  HealthService* health() const { return health_.get(); }

  // transport::AcceptHandler (listener thread).
  absl::StatusOr<transport::Placement> Place(const std::string& peer) override;
  void OnAccepted(std::shared_ptr<transport::Connection> connection) override;
  void OnRefused(const std::string& peer, transport::ConnectionHandler* placed,
                 const absl::Status& why) override;

  // For connections and calls.
  // The service with `id`; null when none. Immutable once serving, so no lock.
  const ServiceEntry* FindService(uint32_t id) const {
    auto it = services_.find(id);
    return it == services_.end() ? nullptr : &it->second;
  }
  // Not serving new calls any more (Shutdown has begun).
  bool draining() const { return draining_.load(std::memory_order_acquire); }
  // The connections as /connections shows them: one line each, or (`json`) one JSON document.
  // Any thread; waits for no connection's domain.
  std::string ConnectionsPage(bool json) const;
  // Started and not draining: what /readyz says (Server::Start's metrics endpoint). Any thread.
  bool ready() const { return listening_.load(std::memory_order_acquire) && !draining(); }
  void CallStarted();
  void CallDone();
  // `connection` (to `peer`) closed: it leaves the server's list, and the last few to close stay
  // on /connections with their last error (kRecentlyClosed), so an operator sees why.
  void ConnectionClosed(ServerConnection* connection, std::string peer);
  static constexpr size_t kRecentlyClosed = 16;
  HandlerPool& pool() { return *pool_; }
  StreamThreads& stream_threads() { return stream_threads_; }
  void CountStreamRefused() { streams_refused_.fetch_add(1, std::memory_order_relaxed); }
  void CountAsyncStream() { async_streams_.fetch_add(1, std::memory_order_relaxed); }
  // An asynchronous stream whose frame found no send slot on a runtime thread: `waiter` is
  // pumped again at the timer's next pass, within a millisecond (the sweeper thread doubles as
  // that timer). Once each, however often it asks before then. The fallback: its connection
  // tells it first when a send completion frees a slot (RpcConnection::WaitForSendSlot).
  void WaitForSlot(std::weak_ptr<StreamListener> waiter);
  // Ends `stream` with DEADLINE_EXCEEDED at `deadline` (monotonic), on the sweeper: an
  // asynchronous stream has no thread whose waits would end there, and a client's cancel may
  // never come.
  void WatchDeadline(absl::Time deadline, std::weak_ptr<StreamState> stream);
  const Metrics& metrics() const { return metrics_; }
  void CountKeepalive() { keepalives_.fetch_add(1, std::memory_order_relaxed); }
  // IdleIntervalAdvice for this server now, in milliseconds: what its answer to a ping carries.
  uint32_t IdleIntervalAdviceMs();
  // What its accept reply carries: the same, at most two thirds of idle_probe_interval, so that a
  // new connection's first check (drawn from (0, 1] of it) comes before the server would close
  // it as one that never spoke. Its answers then ask for the whole advice.
  uint32_t AcceptAdviceMs();
  StagingPool& staging() { return *staging_; }
  const std::shared_ptr<ReceiveLimits>& receive_limits() const { return receive_limits_; }
  const std::shared_ptr<transport::Device>& device() const { return device_; }
  const ServerOptions& options() const { return options_; }
  // Send slots a connection's stream frames leave free (AcquireSendBuffer's leave_free): one
  // for the answer of each call the connection may hold (a receive credit each) and each
  // stream's final answer, and 4 for errors and keepalive answers. A stream's messages may wait
  // for the client's transport credits, each in a slot; an answer never waits for one, so it
  // must find one free.
  static uint32_t AnswerSlots(const ServerOptions& options) {
    return options.listener.connection.recv_credits +
           static_cast<uint32_t>(options.max_streams_per_connection) + 4;
  }
  uint32_t answer_slots() const { return AnswerSlots(options_); }
  void CountUnimplemented() { unimplemented_.fetch_add(1, std::memory_order_relaxed); }
  void CountCancel() { cancels_.fetch_add(1, std::memory_order_relaxed); }
  void CountViolation() { closed_violations_.fetch_add(1, std::memory_order_relaxed); }
  void CountSkipped() { skipped_.fetch_add(1, std::memory_order_relaxed); }
  void CountIdleClosed() { idle_closed_.fetch_add(1, std::memory_order_relaxed); }
  void CountProbe() { probes_.fetch_add(1, std::memory_order_relaxed); }
  void CountIdleProbe() { idle_probes_.fetch_add(1, std::memory_order_relaxed); }
  void CountAnswerDropped() { answers_dropped_.fetch_add(1, std::memory_order_relaxed); }

 private:
  explicit ServerImpl(const ServerOptions& options)
      : options_(options), stream_threads_(options.max_streams) {}
  // The liveness thread (ServerOptions::liveness_probe_interval, idle_probe_interval,
  // max_connection_idle).
  void SweepLoop();
  // The health service's kick: its Flush runs on the sweeper (HealthService).
  void KickHealth();

  ServerOptions options_;  // as given, with the limits Create derives; fixed once created
  std::shared_ptr<transport::Device> device_;
  std::unique_ptr<StagingPool> staging_;
  std::shared_ptr<ReceiveLimits> receive_limits_;
  // The poller for a connection being accepted: the next with room, or one more (max_pollers).
  std::shared_ptr<transport::Poller> PickPoller();

  // Shared with received payloads users still hold (rpc_connection.h). Grown by PickPoller on the
  // listener's thread, read by stats(), emptied by Shutdown.
  mutable absl::Mutex pollers_mu_;
  std::vector<std::shared_ptr<transport::Poller>> pollers_ ABSL_GUARDED_BY(pollers_mu_);
  size_t next_poller_ ABSL_GUARDED_BY(pollers_mu_) = 0;
  bool poller_failure_logged_ ABSL_GUARDED_BY(pollers_mu_) = false;
  absl::Time next_poller_attempt_ ABSL_GUARDED_BY(pollers_mu_) = absl::InfinitePast();  // monotonic
  int max_pollers_ = 1;          // fixed once created
  bool manual_pollers_ = false;  // as OpenRuntime found it: added pollers are driven the same way
  std::unique_ptr<HandlerPool> pool_;
  StreamThreads stream_threads_;
  std::unique_ptr<transport::Listener> listener_ ABSL_GUARDED_BY(mu_);
  // The listener's authentication counts as Shutdown found them (it destroys the listener).
  transport::Listener::AuthCounts auth_counts_ ABSL_GUARDED_BY(mu_);
  uint32_t peak_connections_ ABSL_GUARDED_BY(mu_) = 0;  // the listener's, once it is gone

  // Added first when ServerOptions::health_service says so. Destroyed before the pollers and
  // the pool (declared after them), when no call is left: the destructor's Shutdown ended its
  // watchers and waited for every call.
  std::unique_ptr<HealthService> health_;
  absl::flat_hash_map<uint32_t, ServiceEntry> services_;
  Metrics metrics_;
  bool started_ = false;
  uint16_t port_ = 0;
  std::atomic<bool> draining_{false};
  std::atomic<bool> listening_{false};  // Start succeeded (started_, for other threads)
  bool shut_down_ = false;

  // Every connection placed and not yet closed (or refused), for Shutdown and stats. Keyed by
  // the handler as the transport names it, so a lookup never needs a cast.
  mutable absl::Mutex mu_;
  absl::flat_hash_map<const transport::ConnectionHandler*, std::shared_ptr<ServerConnection>>
      connections_ ABSL_GUARDED_BY(mu_);
  // The last kRecentlyClosed connections to close, newest last: for /connections.
  struct ClosedConnection {
    std::string peer;
    absl::Duration age;  // from placed to closed
    absl::Time closed;
    RpcConnection::LastError last_error;
  };
  std::deque<ClosedConnection> recently_closed_ ABSL_GUARDED_BY(mu_);
  CallCounts calls_;  // started and retired: ServerStats, and what Shutdown waits for

  std::atomic<uint64_t> accepted_{0};
  std::atomic<uint64_t> closed_{0};
  std::atomic<uint64_t> unimplemented_{0};
  std::atomic<uint64_t> cancels_{0};
  std::atomic<uint64_t> keepalives_{0};
  std::atomic<uint64_t> closed_violations_{0};
  std::atomic<uint64_t> skipped_{0};
  std::atomic<uint64_t> idle_closed_{0};
  std::atomic<uint64_t> probes_{0};
  std::atomic<uint64_t> idle_probes_{0};
  std::atomic<uint64_t> answers_dropped_{0};
  std::atomic<uint64_t> streams_refused_{0};
  std::atomic<uint64_t> async_streams_{0};

  // std:: primitives so the sweep's waits run on the steady clock (monotonic.h).
  std::mutex sweep_mu_;
  std::condition_variable sweep_cv_;
  bool sweep_stop_ = false;   // under sweep_mu_
  bool health_kick_ = false;  // under sweep_mu_: the health service asks for a Flush
  // Under sweep_mu_: the sweeper doubles as the asynchronous streams' timer.
  StreamWaiters slot_waiters_;                                       // WaitForSlot
  absl::Time slot_retry_at_;                                         // when they try again
  std::multimap<absl::Time, std::weak_ptr<StreamState>> deadlines_;  // WatchDeadline
  size_t deadlines_pruned_ = 0;  // entries left by the last pruning
  std::thread sweeper_;
};

}  // namespace zrpc::internal

#endif  // ZRPC_RPC_SERVER_SERVER_IMPL_H_
