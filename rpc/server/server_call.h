// ServerCallImpl: the server's side of one call, unary or streaming: what generated code sees as
// ServerCall (rpc/impl/call_interfaces.h), and a streaming handler's StreamCall.
//
// Files: server_call.cc (the unary call: run, respond, finish) and server_stream.cc (the
// stream: reads, writes, the asynchronous form, and the connection's stream frames).
//
// Races a call can lose, each settled on `answered_`: the handler's Finish against the runtime
// answering for it (Shutdown past its grace, in the connection's domain), by an atomic exchange,
// or by a load and a store when the Finish runs in that domain too (ClaimAnswer). The loser's
// response is discarded, never sent twice. A cancel from the client or the connection's failure
// only marks the call's context cancelled: the handler still owns the call and must still Finish
// it, and the request's memory stays valid until it does.
#ifndef ZRPC_RPC_SERVER_SERVER_CALL_H_
#define ZRPC_RPC_SERVER_SERVER_CALL_H_

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <optional>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "rpc/common/monotonic.h"
#include "rpc/connection/rpc_connection.h"
#include "rpc/generated_api.h"
#include "rpc/interceptor.h"
#include "rpc/metrics.h"
#include "rpc/server/handler_pool.h"
#include "rpc/stream/stream_state.h"

namespace zrpc::internal {

class ServerConnection;

// A stream to end once a walk over the connection's calls is done. Ending a stream tells its
// asynchronous form (StreamPump), whose callbacks may finish the call there and then, and a
// call's Finish inside the connection's domain retires it at once (Retire, removing it from the
// map being walked): so what gives calls up (a cancel, the connection's close, Shutdown's
// answers, a bad frame) collects their streams here and ends them after.
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
//
// A call holds plain pointers to its connection (ServerConnection) and transport connection: the
// ServerConnection keeps the transport connection, which keeps it, alive until its last call is
// retired (ServerConnection::hold_). Its retirement is a task in the transport connection's
// domain (Finish), where the ServerConnection's map of calls lives.
class ServerCallImpl final : public ServerCall,
                             public PoolTask,
                             public StreamCall,
                             private transport::DomainTask {
 public:
  // `stream_window`: for a stream open, the window this side grants the client (0 otherwise).
  ServerCallImpl(ServerConnection& owner, transport::Connection& connection, Service* service,
                 const MethodInfo& method, MethodMetrics& metrics, const IncomingMessage& request,
                 int64_t arrival_nanos,  // CallClockNanos() at arrival
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
  bool Write(const google::protobuf::MessageLite& message, OutgoingBulk bulk) override;
  google::protobuf::MessageLite* Read(IncomingBulk* bulk) override;
  // A bulk payload on a stream message of a method whose responses carry none: the stream fails
  // (INVALID_ARGUMENT) and true.
  bool RefusedBulk(const OutgoingBulk& bulk);

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

  // The runtime answers for the handler (Shutdown past its grace; in the connection's domain);
  // false when it had already answered. The call stays the handler's until its Finish.
  bool AnswerFor(const absl::Status& status, StreamEndings* later);
  uint64_t call_id() const { return request_.header.call_id; }
  // Whether the server's interceptors started on this call (and so see its stream's messages).
  bool intercepted() const { return intercepted_ > 0; }
  // Their OnStreamMessage for a stream's `message` (received: in order; sent: in reverse). True
  // when all let it go on; otherwise the stream fails with the refusal (FailStream), and false.
  bool InterceptMessage(StreamDirection direction, const google::protobuf::MessageLite& message);
  const MethodInfo& method_info() const { return method_; }

 private:
  // Finish's side of AnswerFor's race: true when the handler's answer is the one that goes.
  bool ClaimAnswer();
  friend class ServerConnection;   // Retire destroys it in place
  friend class AsyncServerSender;  // the asynchronous form's sending
  ~ServerCallImpl() override = default;
  // DomainTask: Finish's last step, in the connection's domain: the call leaves the map and is
  // destroyed (ServerConnection::Retire).
  void RunInDomain(transport::Connection& connection) override;
  // Ends the stream (if any) with `why`, now or, with `later`, once the caller lets go of the
  // connection's lock.
  void EndStream(absl::Status why, StreamEndings* later);
  // The caller gave up (a cancel, the deadline by the call clock's reading: call_clock.h).
  bool GivenUp() const;
  // The interceptors' OnCallStart, in order (ServerOptions::interceptors, rpc/interceptor.h):
  // true when all let the call go on; otherwise the call is finished with the refusal, and false.
  bool StartInterceptors();
  // Their OnCallEnd, in reverse, for those whose OnCallStart succeeded: `status` is the answer.
  void EndInterceptors(const absl::Status& status);

  // Sends the response or the error; returns the status the client gets.
  absl::Status SendResponse(absl::Status status, SendSlot* response, OutgoingBulk response_bulk);
  // A stream message (or, with `message` null, a credit frame) in a send buffer of its own,
  // waiting for one while all are in flight, until the call's deadline or end. A runtime thread
  // (poller, timer) never waits: without `no_slot` the stream then fails; with it, `*no_slot`
  // is set and the stream goes on (the caller tries again later). `quota_taken`: the staging
  // quota a large message needs was taken (RpcConnection::StreamQuotaOrWait); given back if it
  // does not go. `abandoned` (if set) ends a wait when it turns true. `bulk`: a payload beside
  // the message (RpcConnection::SendStreamFrame's).
  bool SendOnStream(const RpcHeader& header, const google::protobuf::MessageLite* message,
                    bool quota_taken = false, bool* no_slot = nullptr,
                    const std::atomic<bool>* abandoned = nullptr, OutgoingBulk* bulk = nullptr);

  ServerConnection* const owner_;
  transport::Connection* const connection_;
  size_t place_ = 0;  // in owner_->calls_ (its domain's)
  Service* service_;
  const MethodInfo& method_;
  MethodMetrics& metrics_;
  // The deadline as the stream waits take it (monotonic; InfiniteFuture for none).
  absl::Time deadline() const {
    return deadline_nanos_ == kNoDeadlineNanos ? absl::InfiniteFuture()
                                               : absl::FromUnixNanos(deadline_nanos_);
  }

  const int64_t start_nanos_;  // monotonic (rpc/common/monotonic.h)
  int64_t deadline_nanos_;     // monotonic; kNoDeadlineNanos for none
  IncomingMessage request_;
  ServerContext context_;
  std::optional<transport::SendBuffer> response_buffer_;
  // A response too large for the slot, serialized here instead (malloc'd; the slot then carries
  // only the header): it goes at the front of the payload.
  std::unique_ptr<uint8_t, decltype(&std::free)> large_response_{nullptr, &std::free};
  // Bytes of the trailing metadata block written in front of the response in its slot
  // (AcquireResponseSlot), 0 for none.
  size_t response_block_ = 0;
  std::atomic<bool> answered_{false};
  bool handler_ran_ = false;  // set before Dispatch; read by Finish, which the handler calls
  // Interceptors whose OnCallStart succeeded: their OnCallEnd runs in Finish. Zero for a server
  // without any, which Finish checks and nothing more.
  uint32_t intercepted_ = 0;
  bool request_released_ = false;        // the request's slot went back (SendAnswer, OpenStream)
  std::shared_ptr<StreamState> stream_;  // streaming calls only
  absl::Mutex failure_mu_;
  absl::Status stream_failure_ ABSL_GUARDED_BY(failure_mu_);
};

}  // namespace zrpc::internal

#endif  // ZRPC_RPC_SERVER_SERVER_CALL_H_
