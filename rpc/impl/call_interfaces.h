// The interfaces the runtime implements and generated code calls: Channel (the client's side of
// a connection), ServerCall (the server's side of one call), the ends of a stream (StreamCall,
// ClientStreamCall, ServerAsyncStream) and SendSlot, the registered memory a message is
// serialized into. rpc/generated_api.h says how generated code uses them.
//
// rpc/impl/ is for generated code and the runtime, not for applications: nothing here is a
// stable API, and any of it may change in any release (rpc/impl/README.md).
#ifndef ZRPC_RPC_IMPL_CALL_INTERFACES_H_
#define ZRPC_RPC_IMPL_CALL_INTERFACES_H_

#include <google/protobuf/message_lite.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "rpc/bulk.h"
#include "rpc/call_options.h"
#include "rpc/server_context.h"
#include "rpc/service.h"

namespace zrpc {

// One end of a stream in flight, implemented by the runtime; the typed readers and writers of
// rpc/streaming.h wrap it. Blocking: at most one thread reads and one writes at a time.
class StreamCall {
 public:
  // The asynchronous forms' completions (ClientStreamCall::StartRead, ServerAsyncStream): the
  // peer's next message (valid while the callback runs), or null once there are no more; whether
  // a message was sent.
  using ReadDone = internal::InlineFunction<void(::google::protobuf::MessageLite*), 64>;
  using WriteDone = internal::InlineFunction<void(bool), 64>;

  virtual ~StreamCall() = default;
  // Sends `message`, serialized straight into a registered send slot, once the peer has room
  // for it (per-stream flow control: rpc/stream/stream_state.h). False when the stream has ended
  // (the final status says why), this side closed its writes, or the message could not go (then the
  // stream fails with the reason). `bulk` (may be empty) goes beside it, for a method whose
  // messages this way carry one (rpc/streaming.h, "Bulk payloads"); it is released on every path.
  virtual bool Write(const ::google::protobuf::MessageLite& message, OutgoingBulk bulk) = 0;
  // The peer's next message, parsed when it arrived; valid until the next Read. Null once the
  // peer sends no more (it half-closed or finished) or the stream ended. `*bulk` (when set) takes
  // the message's bulk payload (empty when it has none); without it a payload is released.
  virtual ::google::protobuf::MessageLite* Read(IncomingBulk* bulk) = 0;
};

// The client's end: also closes its writes and waits for the final status.
class ClientStreamCall : public StreamCall {
 public:
  // Tells the server this side sends no more messages (half-close). False when the stream has
  // ended or writes were closed already.
  virtual bool WritesDone() = 0;
  // Waits for the call's final status: the server's, or why the call ended here (deadline,
  // cancel, connection lost). Closes this side's writes first if WritesDone was not called.
  // Messages not read by then are dropped and credited back as they come: to stop a server that
  // would go on sending, Cancel first. Once only.
  virtual ::absl::Status Finish() = 0;
  // Gives up on the call (CANCELLED), telling the server. Any thread; nothing once it ended.
  virtual void Cancel() = 0;

  // ---- The asynchronous form (rpc/streaming.h, "Asynchronous streams"). Each returns at once
  // and its callback runs exactly once, later or before it returns; a stream's callbacks never
  // run two at a time, nor one inside another. At most one read and one write outstanding (a
  // second one's callback runs at once, on the calling thread, with null or false), and never
  // mixed with the blocking calls above on one stream.
  // The peer's next message (valid while the callback runs), or null once there are no more;
  // `*bulk` (when set: alive until `done` runs) takes its bulk payload first, as Read's.
  virtual void StartRead(ReadDone done, IncomingBulk* bulk) = 0;
  // Sends `message` (alive until `done` runs) once the peer has room: serialized into a send
  // slot then, on the thread that starts it or on the runtime thread that brings the room;
  // `bulk` beside it, as Write's.
  virtual void StartWrite(const ::google::protobuf::MessageLite& message, OutgoingBulk bulk,
                          WriteDone done) = 0;
  // Half-closes, after the write outstanding if there is one.
  virtual void StartWritesDone() = 0;
  // Closes the writes (StartWritesDone) if they are open, drops what comes unread from now on
  // (credited back), and runs `done` with the final status once the call has ended and the
  // outstanding read and write have completed. Once.
  virtual void StartFinish(DoneCallback done) = 0;
};

// Registered memory for one outgoing message, owned by the runtime. `token` is the runtime's
// own handle for the slot; generated code only writes `size` bytes at `data`.
struct SendSlot {
  uint8_t* data = nullptr;
  size_t size = 0;
  uint64_t token = 0;
};

// The server's end of a stream served asynchronously (an AsyncService's streaming handler; the
// typed ServerAsyncReader, ServerAsyncWriter and ServerAsyncReaderWriter of rpc/streaming.h wrap
// it), implemented by the runtime. StartRead and StartWrite behave as ClientStreamCall's. Its
// owner is the handler's wrapper; destroying it drops the callbacks not yet run and the
// outstanding write (its message may die with the owner), finishes a call not finished with
// INTERNAL, and waits for a callback running on another thread to return.
class ServerAsyncStream {
 public:
  virtual ~ServerAsyncStream() = default;
  virtual void StartRead(StreamCall::ReadDone done, IncomingBulk* bulk) = 0;
  virtual void StartWrite(const ::google::protobuf::MessageLite& message, OutgoingBulk bulk,
                          StreamCall::WriteDone done) = 0;
  // Ends the call once the outstanding write has completed: with `status` OK, answers with the
  // response in `response` (from ServerCall::AcquireResponseSlot, taken before this); otherwise
  // sends the error. A read outstanding then completes with null. Once; any thread.
  virtual void StartFinish(::absl::Status status, ::std::optional<SendSlot> response) = 0;
};

namespace internal {
class ChannelAccess;

// How a blocking call waits for its answer (CallWaiter): it polls for `spin`, then sleeps, and
// tells `learn` (when set) how long it waited, with `cap`. The runtime's channels learn per
// calling thread (transport/adaptive_spin.h): `spin` is then about twice what that thread's
// recent calls waited, up to `cap` (ChannelOptions::spin), and zero after a call that waited
// longer than the cap (but for a probe of the whole cap every eighth such call). `learn` is a
// plain function of the runtime, not of the channel: the wait ends after the call, when the
// channel may be gone.
struct BlockingWait {
  ::std::chrono::nanoseconds spin{0};
  ::std::chrono::nanoseconds cap{0};
  void (*learn)(::std::chrono::nanoseconds waited, ::std::chrono::nanoseconds cap) = nullptr;
};
}  // namespace internal

// The client side of a connection, implemented by the runtime (ClientChannel). Applications hold
// one and hand it to a generated Stub; the calls below are the stubs' alone, private as gRPC
// keeps ChannelInterface's, and reached through internal::ChannelAccess.
class Channel {
 public:
  virtual ~Channel() = default;

 private:
  friend class internal::ChannelAccess;

  // Reserves memory of exactly `size` bytes for a request to `method`: a registered slot, or for
  // a message larger than a slot memory the runtime sends at the front of a payload
  // (rpc/WIRE.md). Fails with kResourceExhausted when `size` exceeds
  // ChannelOptions::max_message_size (naming it) or no slot frees up before `options.deadline`.
  // The call starts here (its clock, its metadata, a channel's interceptors): StartUnaryCall or
  // OpenStream follows on the same thread, with the same method and options.
  virtual ::absl::StatusOr<SendSlot> AcquireSendSlot(const MethodInfo& method, size_t size,
                                                     const CallOptions& options) = 0;

  // Sends the request in `slot` (taking it back) to `method`, with `request_bulk` beside it
  // (empty unless method.request_bulk). Releases `request_bulk` once the NIC no longer reads it
  // and always before `done` runs, also when the call fails or its deadline passes first (the
  // failure then waits for the WRITE to complete or flush). When the response arrives it is
  // parsed into `*response`, and for a method with response_bulk its payload is moved into
  // `*response_bulk` (non-null exactly then, and empty on entry: AsyncUnaryCall resets it on
  // the caller's thread). Both must stay alive until `done` runs; on error `*response_bulk`
  // stays empty.
  virtual void StartUnaryCall(const MethodInfo& method, SendSlot slot, OutgoingBulk request_bulk,
                              ::google::protobuf::MessageLite* response,
                              IncomingBulk* response_bulk, const CallOptions& options,
                              DoneCallback done) = 0;

  // How a blocking call (UnaryCall) waits for its answer (CallWaiter): asked before the call
  // starts. The default never polls.
  virtual internal::BlockingWait blocking_wait() const { return {}; }

  // Opens a stream to `method` (a streaming method: rpc/streaming.h), with the request in
  // `slot` for a server-streaming method (an empty slot, AcquireSendSlot(0), for the others).
  // The peer's messages are parsed as `read_prototype`'s type (null: the peer sends none); a
  // client-streaming method's single response is parsed into `*response` (null for the others),
  // which must stay alive until Finish returns. Never null: a stream that could not open has
  // already ended, and its Finish says why. Takes `slot` back on every path.
  virtual ::std::unique_ptr<ClientStreamCall> OpenStream(
      const MethodInfo& method, SendSlot slot,
      const ::google::protobuf::MessageLite* read_prototype,
      ::google::protobuf::MessageLite* response, const CallOptions& options) = 0;
};

namespace internal {

// The one way in to Channel's private calls, for the templates generated code runs
// (rpc/impl/unary_call.h, rpc/streaming.h).
class ChannelAccess {
 public:
  static ::absl::StatusOr<SendSlot> AcquireSendSlot(Channel* channel, const MethodInfo& method,
                                                    size_t size, const CallOptions& options) {
    return channel->AcquireSendSlot(method, size, options);
  }
  static void StartUnaryCall(Channel* channel, const MethodInfo& method, SendSlot slot,
                             OutgoingBulk request_bulk, ::google::protobuf::MessageLite* response,
                             IncomingBulk* response_bulk, const CallOptions& options,
                             DoneCallback done) {
    channel->StartUnaryCall(method, slot, ::std::move(request_bulk), response, response_bulk,
                            options, ::std::move(done));
  }
  static BlockingWait blocking_wait(const Channel* channel) { return channel->blocking_wait(); }
  static ::std::unique_ptr<ClientStreamCall> OpenStream(
      Channel* channel, const MethodInfo& method, SendSlot slot,
      const ::google::protobuf::MessageLite* read_prototype,
      ::google::protobuf::MessageLite* response, const CallOptions& options) {
    return channel->OpenStream(method, slot, read_prototype, response, options);
  }
};

// A stream that ended before it opened: every read and write fails, and Finish says why.
class FailedStream final : public ClientStreamCall {
 public:
  explicit FailedStream(::absl::Status status) : status_(::std::move(status)) {}
  bool Write(const ::google::protobuf::MessageLite&, OutgoingBulk) override { return false; }
  ::google::protobuf::MessageLite* Read(IncomingBulk* bulk) override {
    if (bulk != nullptr) bulk->Reset();
    return nullptr;
  }
  bool WritesDone() override { return false; }
  ::absl::Status Finish() override { return status_; }
  void Cancel() override {}
  void StartRead(ReadDone done, IncomingBulk* bulk) override {
    if (bulk != nullptr) bulk->Reset();
    done(nullptr);
  }
  void StartWrite(const ::google::protobuf::MessageLite&, OutgoingBulk, WriteDone done) override {
    done(false);
  }
  void StartWritesDone() override {}
  void StartFinish(DoneCallback done) override { done(status_); }

 private:
  ::absl::Status status_;
};

}  // namespace internal

// The server side of one call in flight, implemented by the runtime.
//
// Lifetime and threads: a ServerCall stays valid until Finish, and no longer. Finish may be
// called after Dispatch has returned and from any thread (an AsyncService handler keeps the call
// in a PendingCall and finishes it when its answer is ready), so the runtime reclaims a call at
// its Finish, never because Dispatch returned. Generated code uses a call from one thread at a
// time (a handler that hands its PendingCall to another thread synchronises that handoff, as for
// any object) and never touches it once Finish has begun. It reads request_data() only before
// the handler runs.
class ServerCall {
 public:
  virtual ~ServerCall() = default;
  virtual ServerContext& context() = 0;
  // The serialized request, in the registered receive buffer it arrived in; valid until Finish.
  virtual const uint8_t* request_data() const = 0;
  virtual size_t request_size() const = 0;
  // The request's bulk payload, in place (empty for a method without request_bulk; the runtime
  // refuses a request that carries one anyway). A payload nobody takes is released at Finish.
  // One taken may outlive Finish and the ServerCall: its releaser is the runtime's, not this.
  virtual IncomingBulk TakeRequestBulk() = 0;
  // Memory of exactly `size` bytes for the response (a registered slot, or for a larger message
  // memory sent at the front of a payload); kResourceExhausted past
  // ServerOptions::max_message_size.
  virtual ::absl::StatusOr<SendSlot> AcquireResponseSlot(size_t size) = 0;
  // Ends the call: with `status` OK, sends the response in `*response` and `response_bulk`
  // beside it (empty unless the method has response_bulk); otherwise sends the error (and
  // `response` is null, `response_bulk` empty). Called exactly once.
  virtual void Finish(::absl::Status status, SendSlot* response, OutgoingBulk response_bulk) = 0;
  // For a streaming method, once the request (if any) was parsed: the stream, valid until
  // Finish. Gives the opening request's receive slot back and, when `read_prototype` is set
  // (the client streams), grants the client its window. Null for a unary call, or a runtime
  // without streams.
  virtual StreamCall* OpenStream(const ::google::protobuf::MessageLite* /*read_prototype*/) {
    return nullptr;
  }
  // OpenStream's asynchronous form (an AsyncService's streaming handler), owned by the caller.
  // Null for a unary call, or a runtime without asynchronous streams.
  virtual ::std::unique_ptr<ServerAsyncStream> OpenAsyncStream(
      const ::google::protobuf::MessageLite* /*read_prototype*/) {
    return nullptr;
  }
};

}  // namespace zrpc

#endif  // ZRPC_RPC_IMPL_CALL_INTERFACES_H_
