// ClientStream: the client's end of one stream (rpc/streaming.h), over the ClientConnection the
// stream opened on. The call sits in the connection's call table like a unary call (so a
// deadline, a cancel or the connection's loss ends it the same way, exactly once) with a
// StreamState beside it, which the poller fills with the server's messages and credits; the
// call's ending ends the state, which wakes the application's reads and writes.
//
// The asynchronous form (StartRead, StartWrite, StartWritesDone, StartFinish) waits for nothing:
// a StreamPump (stream_pump.h) carries it out, sending through this stream's connection; a
// frame that finds no send slot on a runtime thread is tried again when a send completion frees
// one, or at the channel timer's next pass, the fallback (ClientConnection::WaitForSlot).
// Destroying the stream drops the callbacks not run, cancels the call (which ends any wait of a
// send the pump is in) and then waits for a pump running on another thread to stop.
#ifndef ZRPC_RPC_CLIENT_CLIENT_STREAM_H_
#define ZRPC_RPC_CLIENT_CLIENT_STREAM_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "rpc/client/client_connection.h"
#include "rpc/generated_api.h"
#include "rpc/interceptor.h"
#include "rpc/stream/stream_pump.h"
#include "rpc/stream/stream_state.h"

namespace zrpc::internal {

class ClientStream final : public ClientStreamCall {
 public:
  // `id` is the call's (0: it ended before it was sent, and `state` has ended), a call to
  // `method` (which outlives it); a client-streaming method's writes are closed by WritesDone,
  // or by Finish if it did not.
  ClientStream(std::shared_ptr<ClientConnection> connection, uint64_t id,
               std::shared_ptr<StreamState> state, const MethodInfo& method)
      : connection_(std::move(connection)),
        id_(id),
        state_(std::move(state)),
        method_(&method),
        writes_done_(!method.client_streaming) {}
  // Cancels a call not finished, and waits for its end (its response, if any, is the caller's
  // memory).
  ~ClientStream() override;

  bool Write(const google::protobuf::MessageLite& message, OutgoingBulk bulk) override;
  google::protobuf::MessageLite* Read(IncomingBulk* bulk) override;
  bool WritesDone() override;
  absl::Status Finish() override;
  void Cancel() override;

  // The channel's interceptors (rpc/interceptor.h) see each message of the stream: `chain` is
  // the channel's options', which outlive the stream. Once, before any use.
  void SetInterceptors(const std::vector<std::shared_ptr<ClientInterceptor>>* chain) {
    chain_ = chain;
  }

  void StartRead(ReadDone done, IncomingBulk* bulk) override;
  void StartWrite(const google::protobuf::MessageLite& message, OutgoingBulk bulk,
                  WriteDone done) override;
  void StartWritesDone() override;
  void StartFinish(DoneCallback done) override;

 private:
  class Sender;  // the asynchronous form's sending
  // The asynchronous form's state, listening to the state from its first use.
  StreamPump& async();

  const std::shared_ptr<ClientConnection> connection_;
  const uint64_t id_;
  const std::shared_ptr<StreamState> state_;
  // Refuses a blocking stream operation on a runtime thread (poller, timer): it would wait for
  // the very thread it runs on. The call ends FAILED_PRECONDITION, naming `what`.
  bool RefusedOnRuntimeThread(const char* what);
  // The interceptors' OnStreamMessage for `message` (sent: in order; received: in reverse): true
  // when none is set or all let it go on; otherwise the stream ends with the refusal here at
  // once (nothing more is sent or read), the call is aborted (the server told), and false.
  bool Intercept(StreamDirection direction, const google::protobuf::MessageLite& message);
  // A bulk payload on a method whose requests carry none: the call is aborted (INVALID_ARGUMENT,
  // the server told) and true.
  bool RefusedBulk(const OutgoingBulk& bulk);

  const MethodInfo* const method_;
  const std::vector<std::shared_ptr<ClientInterceptor>>* chain_ = nullptr;

  std::atomic<bool> writes_done_;  // WritesDone, or Finish in its place
  // Orders a message's send against the half-close (a Write that waited for credit while another
  // thread closed the writes must not send after the half-close: the server would take that for
  // a protocol violation).
  absl::Mutex send_mu_;
  std::shared_ptr<StreamPump>
      async_;  // shared with the loop that pumps it (which may outlive this)
  std::once_flag async_once_;
};

}  // namespace zrpc::internal

#endif  // ZRPC_RPC_CLIENT_CLIENT_STREAM_H_
