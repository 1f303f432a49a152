// ServerConnection: the server's side of one connection; its calls are ServerCallImpl
// (server_call.h).
//
// A request's life (THREADING.md has the threads):
//   poller thread: OnMessage -> Receive (header checked, payload paired) -> service and method
//     looked up (UNIMPLEMENTED answered here) -> a ServerCallImpl, appended to the connection's
//     calls (a stream also by its call id) -> Run inline, or queued to the handler pool.
//   handler: Service::Dispatch -> generated code parses the request in place, runs the user's
//     handler, serializes the response into a registered slot -> Finish.
//   Finish (any thread): sends the response (payload staged and written first) or the error,
//     gives back the request's receive slot and payload; then, in the connection's domain
//     (transport/connection.h's DomainTask), forgets the call id and frees the call.
//
// Threads. The calls (calls_ and what goes with it) live in the transport connection's domain:
// the poller's batch (requests, cancels, stream frames, pulls, the close) and Finish's retiring
// task touch them with no lock; Shutdown's answers run as a task too. mu_ guards only the
// reference to the transport connection that the sweeper and Shutdown use.
#ifndef ZRPC_RPC_SERVER_SERVER_CONNECTION_H_
#define ZRPC_RPC_SERVER_SERVER_CONNECTION_H_

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "rpc/common/monotonic.h"
#include "rpc/connection/rpc_connection.h"
#include "rpc/generated_api.h"
#include "rpc/metrics.h"
#include "rpc/server/handler_pool.h"
#include "rpc/server/idle_since.h"
#include "rpc/server/server_call.h"
#include "rpc/stream/stream_state.h"

namespace zrpc::internal {

class ServerImpl;

// What a sweeper pass holds connections to (zero durations: never).
struct SweepLimits {
  absl::Duration probe;         // ServerOptions::liveness_probe_interval: holding calls, or
                                // silent after a word
  absl::Duration idle_probe;    // ServerOptions::idle_probe_interval: a connection never heard
                                // (or half as long again as it was advised, when longer)
  absl::Duration idle_silence;  // IdleSilenceBeforeProbe now: idle and heard before
  absl::Duration max_idle;      // ServerOptions::max_connection_idle
};

class ServerConnection final : public RpcConnection,
                               public std::enable_shared_from_this<ServerConnection> {
 public:
  // `poller` is the one the connection is placed on.
  ServerConnection(ServerImpl& server, std::shared_ptr<transport::Poller> poller);
  ~ServerConnection() override;

  void OnMessage(transport::Connection& connection,
                 const transport::ReceivedMessage& message) override;
  void OnClosed(transport::Connection& connection, const absl::Status& why) override;
  void OnDeferredFailed(transport::Connection& connection, const RpcHeader& header,
                        const absl::Status& status) override;
  void OnPulled(transport::Connection& connection, IncomingMessage& message) override;
  // Pulls `request`'s payload into memory ServerOptions::place_request_payload (`place`) gives.
  absl::Status PullPlaced(
      transport::Connection& connection, const IncomingMessage& request, const MethodInfo& method,
      const std::function<absl::StatusOr<PayloadPlacement>(const MethodInfo&, size_t)>& place);

  // Remembers the connection once accepted (messages may come first: they carry it too), unless
  // it closed already: the reference is dropped at OnClosed, since the connection co-owns this
  // handler (a cycle until then).
  void Attach(std::shared_ptr<transport::Connection> connection);
  // Whether everything handed to the transport (answers included) has reached the client.
  bool SendsDrained();
  // Closes the connection (Shutdown); OnClosed follows.
  void Close();
  // Shutdown past its grace: answers every call still running with `status` and marks it
  // cancelled, in the connection's domain (at once, or by the thread that holds it).
  void AnswerAll(const absl::Status& status);
  // AnswerAll's work, in the domain.
  void AnswerAllInDomain(const absl::Status& status);
  // A call finished (in the domain: its Finish's task): forgets its id and destroys it, and
  // keeps its memory for the next call. After the close, the last call lets go of hold_.
  void Retire(ServerCallImpl* call);
  // Whether the sweeper's pass looks at this connection (its thread only): always while it holds
  // calls or moves a payload, else only if its last look was at or before `looked_by` (the pass's
  // time less an eighth of the idle settings; InfinitePast: never again after the first, since
  // last_look_ starts at InfinitePast). A few loads: the sweeper asks it of every connection under
  // the server's lock, and takes references to those it looks at only.
  // With `probing` (liveness_probe_interval set), one that spoke since its last probe is looked
  // at on every pass too, until it is probed or has kept talking for twice the interval.
  bool DueForSweep(absl::Time looked_by, bool probing) const {
    return calls_count_.load(std::memory_order_relaxed) > 0 || Transferring() ||
           last_look_ <= looked_by ||
           (probing && (spoke_since_probe_ || spoke_.load(std::memory_order_relaxed)));
  }
  // One liveness pass over a connection DueForSweep chose (the server's sweeper thread only;
  // `now` monotonic; ServerOptions' liveness settings, rpc/options.h): probes the client's NIC
  // when the connection holds calls and received nothing for `limits.probe`, once when it spoke
  // (anything but a ping) since its last probe and then received nothing for `limits.probe`, or
  // holds none and received nothing for `limits.idle_silence` (or half as long again as the
  // interval it was advised last, when longer); closes it when it holds none and received nothing
  // for `limits.max_idle`, or never received a word within `limits.idle_probe` (or that). Counted
  // in the stats.
  void SweepPass(absl::Time now, const SweepLimits& limits);
  // The idle interval this server asked of the client last (in its accept reply, then in each
  // answer to a ping), in milliseconds: the sweeper waits for a client keeping to it.
  void NoteAdvice(uint32_t ms) { advised_ms_.store(ms, std::memory_order_relaxed); }

  ServerImpl& server() { return server_; }
  absl::Time placed() const { return placed_; }  // MonotonicNow() when the server placed it
  // The server has interceptors (ServerOptions::interceptors): one load for each call to check.
  bool intercepted() const { return intercepted_; }

  // What /connections shows of it (ServerImpl::ConnectionsPage). Any thread; never waits for the
  // connection's domain (a handler may hold it): `transport` is empty while another thread does,
  // and `peer` too before the connection is attached.
  struct View {
    std::string peer;
    uint32_t auth_key_id = 0;
    absl::Duration age;  // since the server placed it
    size_t calls = 0;    // in flight
    bool open = false;
    LastError last_error;
    std::optional<transport::ConnectionStats> transport;
  };
  View Look() const;

 private:
  void HandleRequest(transport::Connection& connection, const IncomingMessage& request);
  void HandleCancel(transport::Connection& connection, const IncomingMessage& cancel);
  // A stream message, half-close or credit from the client.
  void HandleStreamFrame(transport::Connection& connection, const IncomingMessage& frame);
  // A stream message pulled (HandleStreamFrame started it) has landed: into its place.
  void StreamPulled(transport::Connection& connection, IncomingMessage& message);
  // Ends stream `id` for `status` unless it is OK: kFailedPrecondition is the client's
  // violation (the connection closes), anything else fails the stream with it.
  void FailStreamUnless(transport::Connection& connection, uint64_t id, const absl::Status& status);
  // The call in flight with id `id` (a stream's first; one of them, in no set order, should a
  // client reuse a unary call's id), or null. FindCall looks among the streams, then scans;
  // FindScanned only scans (the caller looked among the streams already).
  ServerCallImpl* FindCall(uint64_t id) const;
  ServerCallImpl* FindScanned(uint64_t id) const;

  ServerImpl& server_;
  PoolQueue pool_queue_;  // this connection's turn in the handler pool (handler_pool.h)
  // Liveness (SweepPass, sweeper thread only; monotonic times): arrivals seen at the last look,
  // since when that count has not moved, the last probe, and the last look.
  uint64_t arrivals_seen_ = 0;
  absl::Time last_look_ = absl::InfinitePast();
  absl::Time quiet_since_ = absl::InfinitePast();  // since the last message or payload received
  IdleSince idle_;  // since then, or since a look first found it holding no calls
  absl::Time last_probe_ = absl::InfinitePast();
  bool spoke_since_probe_ = false;              // spoke_ seen since the last probe
  absl::Time spoke_at_ = absl::InfinitePast();  // the look that last saw spoke_
  const absl::Time placed_ = MonotonicNow();
  const bool intercepted_;
  mutable absl::Mutex mu_;
  std::shared_ptr<transport::Connection> connection_ ABSL_GUARDED_BY(mu_);
  bool closed_ ABSL_GUARDED_BY(mu_) = false;

  // In the transport connection's domain (see the top), so no lock:
  // The calls in flight, in no order: a call knows its place (ServerCallImpl::place_), and
  // Retire moves the last one into the hole. No hash per unary call: only a cancel looks a
  // unary call up by id, by a scan, and the calls of one connection are bounded by its receive
  // credits (a request holds its receive slot until its answer goes).
  std::vector<ServerCallImpl*> calls_;
  // Of those, the streams by call id: every stream frame looks its call up (and at most
  // max_streams_per_connection of them).
  absl::flat_hash_map<uint64_t, ServerCallImpl*> streams_;
  // The transport connection, from the first call until the close and the last call's end:
  // calls point at it (and at this, which it keeps) without a reference each. Taken once per
  // connection, not per call; given up by DropAfterExit.
  std::shared_ptr<transport::Connection> hold_;
  bool domain_closed_ = false;  // OnClosed ran
  // Requests being pulled (larger than the arena), not yet calls: whether a cancel came for
  // each meanwhile, so that OnPulled drops it instead of serving it. A stream served after its
  // client gave up would keep its handler waiting for credits that never come.
  absl::flat_hash_map<uint64_t, bool> pulled_requests_;
  // Memory of finished calls, reused by the next ones: HandleRequest takes a block and Retire
  // gives it back. So a call allocates nothing in steady state; at most recv_credits calls are
  // in flight, which bounds the blocks.
  std::vector<void*> call_memory_;
  // calls_.size(), for the sweeper's look from its own thread.
  std::atomic<size_t> calls_count_{0};
  // A message other than a ping arrived since the sweeper's last look (poller thread stores,
  // sweeper takes).
  std::atomic<bool> spoke_{false};
  std::atomic<uint32_t> advised_ms_{0};  // NoteAdvice
};

}  // namespace zrpc::internal

#endif  // ZRPC_RPC_SERVER_SERVER_CONNECTION_H_
