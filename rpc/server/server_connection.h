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
#ifndef ZRPC_RPC_SERVER_SERVER_CONNECTION_H_
#define ZRPC_RPC_SERVER_SERVER_CONNECTION_H_

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <optional>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "rpc/connection/rpc_connection.h"
#include "rpc/generated_api.h"
#include "rpc/metrics.h"
#include "rpc/server/handler_pool.h"
#include "rpc/stream/stream_state.h"

namespace zrpc::internal {

class ServerImpl;
class ServerConnection;

// A stream to end once the connection's lock is let go. Ending a stream tells its asynchronous
// form (StreamPump), whose callbacks may finish the call there and then, and a call's Finish
// takes that lock (Retire): so what gives calls up under it (a cancel, the connection's close,
// Shutdown's answers, a bad frame) collects their streams here and ends them after.
struct StreamEnding {
  std::shared_ptr<StreamState> state;
  absl::Status status;
};
using StreamEndings = std::vector<StreamEnding>;
inline void EndStreams(StreamEndings& endings) {
  for (StreamEnding& ending : endings) ending.state->End(std::move(ending.status));
  endings.clear();
}

// A streaming call (rpc/streaming.h) is the same object with a StreamState: the call is also
// the handler's StreamCall, its opening request's slot goes back at OpenStream, its handler runs
// on a thread of its own (StreamThreads), and its end is the same Finish. An AsyncService's
// streaming handler runs on the handler pool instead and returns at once: its stream
// (OpenAsyncStream) is a StreamPump over the same state, and its Finish the pump's last send.
class ServerCallImpl final : public ServerCall, public PoolTask, public StreamCall {
 public:
  // `stream_window`: for a stream open, the window this side grants the client (0 otherwise).
  ServerCallImpl(std::shared_ptr<ServerConnection> owner,
                 std::shared_ptr<transport::Connection> connection, Service* service,
                 const MethodInfo& method, MethodMetrics& metrics, const IncomingMessage& request,
                 absl::Time monotonic_now,  // MonotonicNow() at arrival
                 uint16_t stream_window = 0);

  ServerContext& context() override { return context_; }
  const uint8_t* request_data() const override { return request_.body.data(); }
  size_t request_size() const override { return request_.body.size(); }
  IncomingBulk TakeRequestBulk() override;
  absl::StatusOr<SendSlot> AcquireResponseSlot(size_t size) override;
  void Finish(absl::Status status, SendSlot* response, OutgoingBulk response_bulk) override;
  StreamCall* OpenStream(const google::protobuf::MessageLite* read_prototype) override;
  // The asynchronous form (an AsyncService's handler): no thread; the StreamPump of
  // rpc/stream/stream_pump.h sends through this call until its Finish.
  std::unique_ptr<ServerAsyncStream> OpenAsyncStream(
      const google::protobuf::MessageLite* read_prototype) override;

  // StreamCall: the handler's end of the stream. Waits end at the call's deadline.
  bool Write(const google::protobuf::MessageLite& message) override;
  google::protobuf::MessageLite* Read() override;

  // The stream's messages and flow control, for the poller (null for a unary call).
  const std::shared_ptr<StreamState>& stream() const { return stream_; }
  // The caller gave up (cancel, deadline, its connection, Shutdown): the context says so and
  // the stream's reads and writes stop waiting. Under the connection's lock, `later` takes the
  // stream's end (see StreamEnding).
  void GiveUp(StreamEndings* later = nullptr);
  // The stream failed here (a message that does not parse, one that cannot be sent): reads and
  // writes stop, and the call answers `status` whatever its handler returns. `later`: as
  // GiveUp's.
  void FailStream(absl::Status status, StreamEndings* later = nullptr);

  // PoolTask (and the inline path): runs the handler, unless the caller already gave up (its
  // deadline passed or it cancelled while the call waited): then the call ends at once with
  // DEADLINE_EXCEEDED or CANCELLED, and the handler never runs.
  void Run() override;

  // The runtime answers for the handler (Shutdown past its grace); false when it had already
  // answered. The call stays the handler's until its Finish.
  bool AnswerFor(const absl::Status& status, StreamEndings* later);
  uint64_t call_id() const { return request_.header.call_id; }
  const MethodInfo& method_info() const { return method_; }

 private:
  friend class ServerConnection;   // Retire destroys it in place
  friend class AsyncServerSender;  // the asynchronous form's sending
  ~ServerCallImpl() override = default;
  // Ends the stream (if any) with `why`, now or, with `later`, once the caller lets go of the
  // connection's lock.
  void EndStream(absl::Status why, StreamEndings* later);
  // Sends the response or the error; returns the status the client gets.
  absl::Status SendResponse(absl::Status status, SendSlot* response, OutgoingBulk response_bulk);
  // A stream message (or, with `message` null, a credit frame) in a send buffer of its own,
  // waiting for one while all are in flight, until the call's deadline or end. A runtime thread
  // (poller, timer) never waits: without `no_slot` the stream then fails; with it, `*no_slot`
  // is set and the stream goes on (the caller tries again later). `quota_taken`: the staging
  // quota a large message needs was taken (RpcConnection::StreamQuotaOrWait); given back if it
  // does not go. `abandoned` (if set) ends a wait when it turns true.
  bool SendOnStream(const RpcHeader& header, const google::protobuf::MessageLite* message,
                    bool quota_taken = false, bool* no_slot = nullptr,
                    const std::atomic<bool>* abandoned = nullptr);

  std::shared_ptr<ServerConnection> owner_;
  std::shared_ptr<transport::Connection> connection_;
  Service* service_;
  const MethodInfo& method_;
  MethodMetrics& metrics_;
  const absl::Time start_;  // monotonic
  absl::Time deadline_;     // monotonic; InfiniteFuture for none
  IncomingMessage request_;
  ServerContext context_;
  std::optional<transport::SendBuffer> response_buffer_;
  // A response too large for the slot, serialized here instead (malloc'd; the slot then carries
  // only the header): it goes at the front of the payload.
  std::unique_ptr<uint8_t, decltype(&std::free)> large_response_{nullptr, &std::free};
  std::atomic<bool> answered_{false};
  bool handler_ran_ = false;       // set before Dispatch; read by Finish, which the handler calls
  bool request_released_ = false;  // the request's slot went back (SendAnswer, OpenStream)
  std::shared_ptr<StreamState> stream_;  // streaming calls only
  absl::Mutex failure_mu_;
  absl::Status stream_failure_ ABSL_GUARDED_BY(failure_mu_);
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
  // cancelled. Returns how many it answered.
  int AnswerAll(const absl::Status& status);
  // A call finished: forgets its id, moves its references to this and to its transport
  // connection into `*owner` and `*connection` (dropped by the caller after the lock: they may be
  // the last), and destroys it, all under the lock the call map's readers take (AnswerAll uses
  // those references under it), and keeps its memory for the next call.
  void Retire(ServerCallImpl* call, std::shared_ptr<ServerConnection>* owner,
              std::shared_ptr<transport::Connection>* connection);
  // One liveness pass (the server's sweeper thread only; ServerOptions; `now` monotonic):
  // closes the connection when it held no calls and received nothing for `idle`, probes the
  // client's NIC when it holds calls and received nothing for `probe`. Counted in the stats.
  void SweepPass(absl::Time now, absl::Duration idle, absl::Duration probe);

  ServerImpl& server() { return server_; }

 private:
  void HandleRequest(transport::Connection& connection, const IncomingMessage& request);
  void HandleCancel(transport::Connection& connection, const IncomingMessage& cancel);
  // A stream message, half-close or credit from the client.
  void HandleStreamFrame(transport::Connection& connection, const IncomingMessage& frame);

  ServerImpl& server_;
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
  int streams_ ABSL_GUARDED_BY(mu_) = 0;  // of those, streams (max_streams_per_connection)
  // Requests being pulled (larger than the arena), not yet calls: whether a cancel came for
  // each meanwhile, so that OnPulled drops it instead of serving it. A stream served after its
  // client gave up would keep its handler waiting for credits that never come.
  absl::flat_hash_map<uint64_t, bool> pulled_requests_ ABSL_GUARDED_BY(mu_);
  // Memory of finished calls, reused by the next ones: HandleRequest takes a block and Retire
  // gives it back, each under mu_, which they take anyway for calls_. So a call allocates
  // nothing in steady state; at most recv_credits calls are in flight, which bounds the blocks.
  std::vector<void*> call_memory_ ABSL_GUARDED_BY(mu_);
};

}  // namespace zrpc::internal

#endif  // ZRPC_RPC_SERVER_SERVER_CONNECTION_H_
