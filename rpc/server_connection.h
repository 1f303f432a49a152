// The server's side of one connection (ServerConnection) and of one call on it (ServerCallImpl).
//
// A request's life (THREADING.md has the threads):
//   poller thread: OnMessage -> Receive (header checked, payload paired) -> service and method
//     looked up (UNIMPLEMENTED answered here) -> a ServerCallImpl, registered by call id ->
//     Run inline, or queued to the handler pool.
//   handler: Service::Dispatch -> generated code parses the request in place, runs the user's
//     handler, serializes the response into a registered slot -> Finish.
//   Finish (any thread): sends the response (payload staged and written first) or the error,
//     gives back the request's receive slot and payload, forgets the call id, and frees the call.
//
// Races a call can lose, each settled by one atomic exchange on `answered_`: the handler's Finish
// against the runtime answering for it (Shutdown past its grace). The loser's response is
// discarded, never sent twice. A cancel from the client or the connection's failure only marks
// the call's context cancelled: the handler still owns the call and must still Finish it, and the
// request's memory stays valid until it does.
#ifndef ZRPC_RPC_SERVER_CONNECTION_H_
#define ZRPC_RPC_SERVER_CONNECTION_H_

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <optional>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "rpc/generated_api.h"
#include "rpc/handler_pool.h"
#include "rpc/metrics.h"
#include "rpc/rpc_connection.h"

namespace zrpc::internal {

class ServerCore;
class ServerConnection;

class ServerCallImpl final : public ServerCall, public PoolTask {
 public:
  ServerCallImpl(std::shared_ptr<ServerConnection> owner,
                 std::shared_ptr<transport::Connection> connection, Service* service,
                 const MethodInfo& method, MethodMetrics& metrics, const IncomingMessage& request,
                 absl::Time monotonic_now);  // MonotonicNow() at arrival

  ServerContext& context() override { return context_; }
  const uint8_t* request_data() const override { return request_.body.data(); }
  size_t request_size() const override { return request_.body.size(); }
  IncomingBulk TakeRequestBulk() override;
  absl::StatusOr<SendSlot> AcquireResponseSlot(size_t size) override;
  void Finish(absl::Status status, SendSlot* response, OutgoingBulk response_bulk) override;

  // PoolTask (and the inline path): runs the handler, unless the caller already gave up (its
  // deadline passed or it cancelled while the call waited): then the call ends at once with
  // DEADLINE_EXCEEDED or CANCELLED, and the handler never runs.
  void Run() override;

  // The runtime answers for the handler (Shutdown past its grace); false when it had already
  // answered. The call stays the handler's until its Finish.
  bool AnswerFor(const absl::Status& status);
  uint64_t call_id() const { return request_.header.call_id; }

 private:
  friend class ServerConnection;  // Retire destroys it in place
  ~ServerCallImpl() override = default;
  // Sends the response or the error; returns the status the client gets.
  absl::Status SendResponse(absl::Status status, SendSlot* response, OutgoingBulk response_bulk);

  std::shared_ptr<ServerConnection> owner_;
  std::shared_ptr<transport::Connection> connection_;
  Service* service_;
  const MethodInfo& method_;
  MethodMetrics& metrics_;
  const absl::Time start_;     // monotonic
  absl::Time deadline_;        // monotonic; InfiniteFuture for none
  IncomingMessage request_;
  ServerContext context_;
  std::optional<transport::SendBuffer> response_buffer_;
  // A response too large for the slot, serialized here instead (malloc'd; the slot then carries
  // only the header): it goes at the front of the payload.
  std::unique_ptr<uint8_t, decltype(&std::free)> large_response_{nullptr, &std::free};
  std::atomic<bool> answered_{false};
  bool handler_ran_ = false;  // set before Dispatch; read by Finish, which the handler calls
  bool request_released_ = false;  // the answer gave the request's slot back (SendAnswer)
};

class ServerConnection final : public RpcConnection,
                               public std::enable_shared_from_this<ServerConnection> {
 public:
  // `poller` is the one the connection is placed on.
  ServerConnection(ServerCore& core, std::shared_ptr<transport::Poller> poller);
  ~ServerConnection() override;

  void OnMessage(transport::Connection& connection,
                 const transport::ReceivedMessage& message) override;
  void OnClosed(transport::Connection& connection, const absl::Status& why) override;
  void OnDeferredFailed(transport::Connection& connection, const RpcHeader& header,
                        const absl::Status& status) override;
  void OnPulled(transport::Connection& connection, IncomingMessage& message) override;
  // Pulls `request`'s payload into memory ServerOptions::place_request_payload (`place`) gives.
  absl::Status PullPlaced(
      transport::Connection& connection, const IncomingMessage& request,
      const MethodInfo& method,
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
  // cancelled. Returns how many it answered.
  int AnswerAll(const absl::Status& status);
  // A call finished: forgets its id and destroys it, under the lock the call map's readers take,
  // and keeps its memory for the next call. The call must hold no reference to this or to its
  // transport connection any more (Finish moves them out first).
  void Retire(ServerCallImpl* call);
  // One liveness pass (the server's sweeper thread only; ServerOptions; `now` monotonic):
  // closes the connection when it held no calls and received nothing for `idle`, probes the
  // client's NIC when it holds calls and received nothing for `probe`. Counted in the stats.
  void SweepPass(absl::Time now, absl::Duration idle, absl::Duration probe);

  ServerCore& core() { return core_; }

 private:
  void HandleRequest(transport::Connection& connection, const IncomingMessage& request);
  void HandleCancel(transport::Connection& connection, const IncomingMessage& cancel);

  ServerCore& core_;
  PoolQueue pool_queue_;  // this connection's turn in the handler pool (handler_pool.h)
  // Liveness (SweepPass, sweeper thread only; monotonic times): arrivals seen at the last pass,
  // since when that count has not moved, and the last probe.
  uint64_t arrivals_seen_ = 0;
  absl::Time quiet_since_ = absl::InfinitePast();  // since the last message or payload received
  absl::Time idle_since_ = absl::InfinitePast();   // since then, or since it last held calls
  absl::Time last_probe_ = absl::InfinitePast();
  absl::Mutex mu_;
  std::shared_ptr<transport::Connection> connection_ ABSL_GUARDED_BY(mu_);
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  absl::flat_hash_map<uint64_t, ServerCallImpl*> calls_ ABSL_GUARDED_BY(mu_);
  // Memory of finished calls, reused by the next ones: HandleRequest takes a block and Retire
  // gives it back, each under mu_, which they take anyway for calls_. So a call allocates
  // nothing in steady state; at most recv_credits calls are in flight, which bounds the blocks.
  std::vector<void*> call_memory_ ABSL_GUARDED_BY(mu_);
};

}  // namespace zrpc::internal

#endif  // ZRPC_RPC_SERVER_CONNECTION_H_
