// Streaming rpcs: the typed readers and writers generated code hands to callers and handlers,
// and the templates its stubs and dispatch call. Wire format: rpc/WIRE.md, "Streams";
// flow control: rpc/stream/stream_state.h.
//
// Template arguments, one rule for every zrpc type that names an rpc's messages (the streams
// here, PendingCall in rpc/pending_call.h): they come as the .proto's rpc declares them, the
// request type, then the response type; a type that handles only one of them takes that one.
// For rpc Chat(stream Q) returns (stream A), the client's ends are ClientReaderWriter<Q, A> and
// AsyncClientReaderWriter<Q, A> (written, read, as in gRPC), and the server's are
// ServerReaderWriter<Q, A> and ServerAsyncReaderWriter<Q, A> (read, written). So the server's
// blocking ServerReaderWriter takes its arguments in the opposite order to gRPC's
// ServerReaderWriter<W, R>, on purpose: an rpc's types read the same in every zrpc type, client
// or server, blocking or asynchronous.
//
//   rpc ListFeatures(Rectangle) returns (stream Feature);     // server streaming
//   rpc RecordRoute(stream Point) returns (RouteSummary);     // client streaming
//   rpc RouteChat(stream RouteNote) returns (stream RouteNote);  // bidirectional
//
// Client (the stub's methods return these by value; each is one call):
//
//   zrpc::ClientReader<Feature> reader = stub.ListFeatures(rect, options);
//   Feature f;
//   while (reader.Read(&f)) Use(f);
//   absl::Status status = reader.Finish();
//
//   RouteSummary summary;
//   zrpc::ClientWriter<Point> writer = stub.RecordRoute(&summary, options);
//   for (const Point& p : points) if (!writer.Write(p)) break;
//   writer.WritesDone();
//   absl::Status status = writer.Finish();  // summary is filled in when OK
//
//   zrpc::ClientReaderWriter<RouteNote, RouteNote> chat = stub.RouteChat(options);
//   // one thread writes (Write, then WritesDone), another may read at the same time
//   absl::Status status = chat.Finish();
//
// Server (Foo::Service's handler for each streaming method; it returns the final status):
//
//   absl::Status ListFeatures(zrpc::ServerContext&, const Rectangle& rect,
//                             zrpc::ServerWriter<Feature>* writer) override;
//   absl::Status RecordRoute(zrpc::ServerContext&, zrpc::ServerReader<Point>* reader,
//                            RouteSummary* summary) override;
//   absl::Status RouteChat(zrpc::ServerContext&,
//                          zrpc::ServerReaderWriter<RouteNote, RouteNote>* stream) override;
//
// Semantics, as gRPC's: Write blocks while the peer's window is full and returns false once the
// stream has ended (the peer finished, failed or gave up); Read blocks for the next message and
// returns false once the peer sends no more. A call ends with its final status: the handler's
// return value, or the deadline, a cancel, the connection's loss. Finish waits for it; a client
// that destroys its reader or writer before Finish cancels the call. Each message is serialized
// straight into a registered send slot and parsed straight from the receive slot it arrived in.
// Sizes: a message that fits a message slot (ChannelStats::max_slot_message; 4,040 bytes by
// default) goes in a SEND; a larger one, up to the peer's arena (256 KiB by default), is staged
// and written into the peer's arena ahead of its SEND, and one larger still, up to
// max_message_size (4 MiB by default, as gRPC), is pulled by the receiver, as a large unary
// message is (WIRE.md, "Streams"): nothing to set, and order holds (a message behind a pulled
// one, or the end, waits for it). Past this side's max_message_size the Write fails with
// RESOURCE_EXHAUSTED, and the stream with it; past the receiver's max_message_size the receiver
// fails the stream (with the same code).
//
// Bulk payloads. A streaming method marked in its .proto, request_bulk for a client-streaming or
// bidirectional one, response_bulk for a server-streaming or bidirectional one,
//
//   rpc Upload(stream Chunk) returns (Done) { option (zrpc.method).request_bulk = true; }
//
// lets each message that way carry one bulk payload beside it (rpc/bulk.h): Write(message,
// OutgoingBulk) and Read(message, IncomingBulk*), blocking and asynchronous, on both ends. The
// payload is always exposed for the receiver to pull (RDMA READ into memory of its own, within
// its max_bulk_size and max_pulled_bytes), never written into its arena, so a reader that holds
// payloads holds its own memory and never the connection's, and it keeps its place in the
// stream as a pulled message does. The bytes stay alive and unchanged until the payload's
// release runs: once the peer has read them (or never will, and says so), or the connection
// closes. That is not tied to the call's end, so bytes that die sooner need a release callback
// (or OutgoingBulk::Copy). A payload on a message of a method not marked that way fails the
// Write (INVALID_ARGUMENT, and the stream with it); a Read without an IncomingBulk* releases the
// payload of a message that has one. Each payload costs a registration on each side (or a memory
// window, on the sender, where the device has type-2 windows); bytes written again while the peer
// has not yet read them the first time (one buffer sent twice in a row) go as a copy. A release
// callback may run inside the Write that took the payload (when it could not go): it must not
// call into that stream. At most 1,024 payloads per connection wait exposed for their readers
// (a peer that never reads pins no more); past that a Write fails RESOURCE_EXHAUSTED.
// Finish drops (and credits back) what was not read: to stop a server that would go on
// sending, Cancel first.
//
// Asynchronous streams (the stub's Async<Method>: AsyncClientReader, AsyncClientWriter,
// AsyncClientReaderWriter) wait for nothing: Read, Write and Finish return at once and report
// through a callback, which runs exactly once.
//
//   zrpc::AsyncClientReader<Feature> reader = stub.AsyncListFeatures(rect, options);
//   // Read(&feature, on_read): on_read(true) with `feature` filled in, or on_read(false) once
//   // the server sends no more; reading again from on_read is the usual loop.
//   reader.Finish([](absl::Status status) { ... });
//
// - At most one Read and one Write outstanding per stream (a second one fails at once); the
//   message a Write names and the message a Read fills stay alive until its callback runs.
// - A stream's callbacks run one at a time, never one inside another: an operation started from
//   a callback completes after that callback returns, whatever is queued, so reading a stream
//   to its end from its callbacks takes no stack. They run on the thread that starts the
//   operation when it can complete at once, else on the runtime thread that completes it (the
//   poller that brings a message or the server's room, the thread that ends the call), so like
//   a DoneCallback they must not block.
// - A Write that waits for the server's room holds a pointer, not a send slot: the message is
//   serialized straight into a slot when the room comes. On a runtime thread nothing waits for
//   a send slot or the staging quota (that thread frees them): a frame that finds none waits,
//   unsent, to be tried again when quota comes back or when the connection's next send
//   completion frees a slot (the channel's timer, within a millisecond, is the fallback for a
//   slot given back otherwise). Started from a thread of the application, a Read, Write or Finish
//   may wait there for a slot (as a blocking call would), never for the server.
// - Finish closes the writes (after the outstanding Write) if WritesDone was not called, drops
//   what comes unread from then on, and runs its callback with the final status once the call
//   has ended and the outstanding Read and Write have completed (a client-streaming call's
//   response is filled in by then). Destroying the stream cancels a call not finished and drops
//   the callbacks that have not run; one running on another thread has returned when the
//   destructor does.
//
// Asynchronous server streams (Foo::AsyncService's streaming handlers) need no thread either:
//
//   void Count(::std::unique_ptr<zrpc::ServerAsyncWriter<CountRequest, Number>> call) override;
//   void Sum(::std::unique_ptr<zrpc::ServerAsyncReader<Number, Total>> call) override;
//   void Double(::std::unique_ptr<zrpc::ServerAsyncReaderWriter<Number, Number>> call) override;
//
// (template arguments in the rule's order: request, then response). The handler runs on the
// handler pool, owns its call and returns at once. Read and Write behave as the client's
// (callbacks once each, never nested or overlapping, at most one of each outstanding; the
// message a Write names and the one a Read fills stay alive until its callback runs).
// Finish(status) ends the call after the outstanding Write (a client-streaming call answers
// *response() when OK); a Read outstanding then completes with false. It reports nothing: the
// call is over for the handler. Callbacks run on the thread that starts an operation when it can
// complete at once, else on the runtime thread that completes it (a poller with a message or
// the client's room, or a send completion that frees a slot for a frame that found none; the
// server's sweeper, which retries such frames as a fallback and ends a stream at its deadline; the
// thread that ends the call), so they must not block. Destroying the object drops the callbacks
// that have not run and waits for one running on another thread; a call not finished then answers
// INTERNAL, and one finished with a Write still outstanding answers ABORTED (that message was not
// sent): keep the object until the last Write's callback has run. Such streams count against
// ServerOptions::max_streams_per_connection, not max_streams.
//
// Threads: a Foo::Service runs each streaming handler on a thread of its own (not the handler
// pool: a stream may block for as long as its peer likes), at most ServerOptions::
// max_streams_per_connection per connection. At most one thread reads and one writes a stream at
// a time; on a client, never from a runtime thread (a DoneCallback): a blocking stream waits for
// those threads.
#ifndef ZRPC_RPC_STREAMING_H_
#define ZRPC_RPC_STREAMING_H_

#include <google/protobuf/message_lite.h>

#include <cassert>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "rpc/call_options.h"
#include "rpc/impl/call_interfaces.h"
#include "rpc/impl/server_unary.h"
#include "rpc/server_context.h"
#include "rpc/service.h"

namespace zrpc {

namespace internal {

// What the three client wrappers share: the call, and its cancel on destruction.
class ClientStreamBase {
 public:
  ClientStreamBase(ClientStreamBase&&) noexcept = default;
  ClientStreamBase& operator=(ClientStreamBase&& other) noexcept {
    if (this != &other) {
      CancelIfUnfinished();
      call_ = ::std::move(other.call_);
      finished_ = other.finished_;
    }
    return *this;
  }
  ~ClientStreamBase() { CancelIfUnfinished(); }

  // Waits for the final status (see ClientStreamCall::Finish). Once only; a second call returns
  // FAILED_PRECONDITION.
  ::absl::Status Finish() {
    if (finished_ || call_ == nullptr) {
      return ::absl::FailedPreconditionError("Finish called twice on one stream");
    }
    finished_ = true;
    return call_->Finish();
  }
  // Gives up on the call (any thread): reads and writes fail, Finish returns CANCELLED.
  void Cancel() {
    if (call_ != nullptr) call_->Cancel();
  }

 protected:
  explicit ClientStreamBase(::std::unique_ptr<ClientStreamCall> call) : call_(::std::move(call)) {}
  ClientStreamCall* call() const { return call_.get(); }

 private:
  void CancelIfUnfinished() {
    if (call_ != nullptr && !finished_) {
      call_->Cancel();
      static_cast<void>(call_->Finish());
    }
  }
  ::std::unique_ptr<ClientStreamCall> call_;
  bool finished_ = false;
};

// What the three asynchronous client wrappers share: the call, its cancel on destruction.
class AsyncClientStreamBase {
 public:
  AsyncClientStreamBase(AsyncClientStreamBase&&) noexcept = default;
  AsyncClientStreamBase& operator=(AsyncClientStreamBase&& other) noexcept {
    if (this != &other) {
      Drop();
      call_ = ::std::move(other.call_);
      finishing_ = other.finishing_;
    }
    return *this;
  }
  ~AsyncClientStreamBase() { Drop(); }

  // Runs `done` with the final status (see ClientStreamCall::StartFinish). Once only; a second
  // call's `done` gets FAILED_PRECONDITION at once.
  void Finish(DoneCallback done) {
    if (finishing_ || call_ == nullptr) {
      done(::absl::FailedPreconditionError("Finish called twice on one stream"));
      return;
    }
    finishing_ = true;
    call_->StartFinish(::std::move(done));
  }
  // Gives up on the call (any thread): reads and writes fail, Finish reports CANCELLED.
  void Cancel() {
    if (call_ != nullptr) call_->Cancel();
  }

 protected:
  explicit AsyncClientStreamBase(::std::unique_ptr<ClientStreamCall> call)
      : call_(::std::move(call)) {}
  ClientStreamCall* call() const { return call_.get(); }

 private:
  void Drop() {
    // The call's destructor drops the callbacks not yet run, cancels a call still going on (in
    // that order: a cancel first would complete them), and waits for a callback running on
    // another thread, which may still use this object (a read loop starting its next Read):
    // call_ stays valid until then.
    if (call_ != nullptr) {
      delete call_.get();
      static_cast<void>(call_.release());
    }
  }
  ::std::unique_ptr<ClientStreamCall> call_;
  bool finishing_ = false;
};

// Starts an asynchronous read into `*out` (a swap with the parsed message: no copy). `Stream`:
// ClientStreamCall or ServerAsyncStream.
template <typename Stream, typename Message>
void StartReadInto(Stream* stream, Message* out, StreamCallback done,
                   IncomingBulk* bulk = nullptr) {
  if (stream == nullptr) return done(false);  // moved from
  stream->StartRead(
      [out, done = ::std::move(done)](::google::protobuf::MessageLite* next) mutable {
        if (next != nullptr) out->Swap(static_cast<Message*>(next));
        done(next != nullptr);
      },
      bulk);
}

template <typename Stream, typename Message>
void StartWriteOf(Stream* stream, const Message& message, StreamCallback done,
                  OutgoingBulk bulk = OutgoingBulk()) {
  if (stream == nullptr) return done(false);  // moved from
  stream->StartWrite(message, ::std::move(bulk),
                     [done = ::std::move(done)](bool sent) mutable { done(sent); });
}

// A streaming call's final response, serialized straight into a registered slot (`response`
// null: an empty one); the slot's error when none can be had. (FinishUnary does the same for
// unary calls on the concrete type, which spares the virtual calls on their path.)
inline ::absl::StatusOr<SendSlot> SerializeResponse(
    ServerCall* call, const ::google::protobuf::MessageLite* response) {
  ::absl::StatusOr<SendSlot> slot =
      call->AcquireResponseSlot(response == nullptr ? 0 : response->ByteSizeLong());
  if (slot.ok() && response != nullptr) response->SerializeWithCachedSizesToArray(slot->data);
  return slot;
}

// What the three asynchronous server streams share: the call until Finish, and the stream.
class ServerAsyncStreamBase {
 public:
  ServerAsyncStreamBase(const ServerAsyncStreamBase&) = delete;
  ServerAsyncStreamBase& operator=(const ServerAsyncStreamBase&) = delete;
  // Drops the callbacks not yet run and the outstanding Write; finishes a call not finished with
  // INTERNAL; waits for a callback running on another thread (rpc/streaming.h).
  ~ServerAsyncStreamBase() = default;

  // The call's deadline and what else the runtime tells a handler. Only before Finish.
  ServerContext& context() {
    assert(call_ != nullptr && "context() after Finish");
    return call_->context();
  }
  const MethodInfo& method() const { return *method_; }

 protected:
  ServerAsyncStreamBase(ServerCall* call, const MethodInfo& method,
                        ::std::unique_ptr<ServerAsyncStream> stream)
      : call_(call), method_(&method), stream_(::std::move(stream)) {}
  ServerAsyncStream* stream() const { return stream_.get(); }
  // What destruction does (see above), first thing in each derived destructor: a callback
  // running on another thread may still use the derived class's members, and this, until it
  // returns, so stream_ stays valid while its destructor waits for that.
  void Drop() {
    if (stream_ != nullptr) {
      delete stream_.get();
      static_cast<void>(stream_.release());
    }
  }
  // Ends the call (after the outstanding Write): with `status` OK answers `response` (null: an
  // empty one), serialized now straight into a registered slot. Once (a second call asserts in
  // debug builds and does nothing in release builds).
  void FinishWith(::absl::Status status, const ::google::protobuf::MessageLite* response) {
    assert(call_ != nullptr && "Finish called twice on one stream");
    ServerCall* call = ::std::exchange(call_, nullptr);
    if (call == nullptr) return;
    ::std::optional<SendSlot> slot;
    if (status.ok()) {
      ::absl::StatusOr<SendSlot> serialized = SerializeResponse(call, response);
      if (serialized.ok()) {
        slot = *serialized;
      } else {
        status = serialized.status();
      }
    }
    stream_->StartFinish(::std::move(status), slot);
  }

 private:
  ServerCall* call_;  // null once finished
  const MethodInfo* method_;
  ::std::unique_ptr<ServerAsyncStream> stream_;
};

// Moves the stream's message into `*out` (a swap: no copy).
template <typename Message>
bool ReadInto(StreamCall* stream, Message* out, IncomingBulk* bulk = nullptr) {
  ::google::protobuf::MessageLite* next = stream->Read(bulk);
  if (next == nullptr) return false;
  out->Swap(static_cast<Message*>(next));
  return true;
}

}  // namespace internal

// A server-streaming call: reads the server's messages, then its status.
template <typename Response>
class ClientReader : public internal::ClientStreamBase {
 public:
  explicit ClientReader(::std::unique_ptr<ClientStreamCall> call)
      : ClientStreamBase(::std::move(call)) {}
  // The next message into `*response`; false once the server sends no more (then Finish).
  bool Read(Response* response) { return internal::ReadInto(call(), response); }
  // The same, with the message's bulk payload in `*bulk` (empty when it has none); for a method
  // marked response_bulk (see "Bulk payloads" above).
  bool Read(Response* response, IncomingBulk* bulk) {
    return internal::ReadInto(call(), response, bulk);
  }
};

// A client-streaming call: writes messages, half-closes, then waits for the one response (in
// the message given when the call opened) and the status.
template <typename Request>
class ClientWriter : public internal::ClientStreamBase {
 public:
  explicit ClientWriter(::std::unique_ptr<ClientStreamCall> call)
      : ClientStreamBase(::std::move(call)) {}
  bool Write(const Request& request) { return call()->Write(request, OutgoingBulk()); }
  // The same with a bulk payload beside it, for a method marked request_bulk (see "Bulk
  // payloads" above).
  bool Write(const Request& request, OutgoingBulk bulk) {
    return call()->Write(request, ::std::move(bulk));
  }
  bool WritesDone() { return call()->WritesDone(); }
};

// A bidirectional call: one thread may write while another reads.
template <typename Request, typename Response>
class ClientReaderWriter : public internal::ClientStreamBase {
 public:
  explicit ClientReaderWriter(::std::unique_ptr<ClientStreamCall> call)
      : ClientStreamBase(::std::move(call)) {}
  bool Write(const Request& request) { return call()->Write(request, OutgoingBulk()); }
  bool Write(const Request& request, OutgoingBulk bulk) {
    return call()->Write(request, ::std::move(bulk));
  }
  bool WritesDone() { return call()->WritesDone(); }
  bool Read(Response* response) { return internal::ReadInto(call(), response); }
  bool Read(Response* response, IncomingBulk* bulk) {
    return internal::ReadInto(call(), response, bulk);
  }
};

// The asynchronous forms (see "Asynchronous streams" above).
template <typename Response>
class AsyncClientReader : public internal::AsyncClientStreamBase {
 public:
  explicit AsyncClientReader(::std::unique_ptr<ClientStreamCall> call)
      : AsyncClientStreamBase(::std::move(call)) {}
  // The next message into `*response`: done(true), or done(false) once there are no more.
  void Read(Response* response, StreamCallback done) {
    internal::StartReadInto(call(), response, ::std::move(done));
  }
  // The same, with the message's bulk payload in `*bulk` (alive until `done` runs).
  void Read(Response* response, IncomingBulk* bulk, StreamCallback done) {
    internal::StartReadInto(call(), response, ::std::move(done), bulk);
  }
};

template <typename Request>
class AsyncClientWriter : public internal::AsyncClientStreamBase {
 public:
  explicit AsyncClientWriter(::std::unique_ptr<ClientStreamCall> call)
      : AsyncClientStreamBase(::std::move(call)) {}
  // Sends `request` (alive until `done` runs): done(true) once it has gone, done(false) when the
  // stream has ended or the writes were closed.
  void Write(const Request& request, StreamCallback done) {
    internal::StartWriteOf(call(), request, ::std::move(done));
  }
  // The same with a bulk payload beside it (whose bytes live until its release runs).
  void Write(const Request& request, OutgoingBulk bulk, StreamCallback done) {
    internal::StartWriteOf(call(), request, ::std::move(done), ::std::move(bulk));
  }
  // Half-closes, after the outstanding Write if any.
  void WritesDone() {
    if (call() != nullptr) call()->StartWritesDone();
  }
};

template <typename Request, typename Response>
class AsyncClientReaderWriter : public internal::AsyncClientStreamBase {
 public:
  explicit AsyncClientReaderWriter(::std::unique_ptr<ClientStreamCall> call)
      : AsyncClientStreamBase(::std::move(call)) {}
  void Write(const Request& request, StreamCallback done) {
    internal::StartWriteOf(call(), request, ::std::move(done));
  }
  void Write(const Request& request, OutgoingBulk bulk, StreamCallback done) {
    internal::StartWriteOf(call(), request, ::std::move(done), ::std::move(bulk));
  }
  void WritesDone() {
    if (call() != nullptr) call()->StartWritesDone();
  }
  void Read(Response* response, StreamCallback done) {
    internal::StartReadInto(call(), response, ::std::move(done));
  }
  void Read(Response* response, IncomingBulk* bulk, StreamCallback done) {
    internal::StartReadInto(call(), response, ::std::move(done), bulk);
  }
};

// The server's end of a server-streaming call.
template <typename Response>
class ServerWriter {
 public:
  explicit ServerWriter(StreamCall* stream) : stream_(stream) {}
  // False once the client is gone or gave up: stop writing and return.
  bool Write(const Response& response) { return stream_->Write(response, OutgoingBulk()); }
  // The same with a bulk payload beside it, for a method marked response_bulk.
  bool Write(const Response& response, OutgoingBulk bulk) {
    return stream_->Write(response, ::std::move(bulk));
  }

 private:
  StreamCall* stream_;
};

// The server's end of a client-streaming call.
template <typename Request>
class ServerReader {
 public:
  explicit ServerReader(StreamCall* stream) : stream_(stream) {}
  // The client's next message; false once it half-closed (or gave up).
  bool Read(Request* request) { return internal::ReadInto(stream_, request); }
  // The same, with the message's bulk payload in `*bulk`, for a method marked request_bulk.
  bool Read(Request* request, IncomingBulk* bulk) {
    return internal::ReadInto(stream_, request, bulk);
  }

 private:
  StreamCall* stream_;
};

// The server's end of a bidirectional call. The request type (read) comes first, by the rule at
// the top of this file: gRPC's ServerReaderWriter takes the written type first.
template <typename Request, typename Response>
class ServerReaderWriter {
 public:
  explicit ServerReaderWriter(StreamCall* stream) : stream_(stream) {}
  bool Write(const Response& response) { return stream_->Write(response, OutgoingBulk()); }
  bool Write(const Response& response, OutgoingBulk bulk) {
    return stream_->Write(response, ::std::move(bulk));
  }
  bool Read(Request* request) { return internal::ReadInto(stream_, request); }
  bool Read(Request* request, IncomingBulk* bulk) {
    return internal::ReadInto(stream_, request, bulk);
  }

 private:
  StreamCall* stream_;
};

// The asynchronous server forms (an AsyncService's streaming handlers), owned by the handler
// through the ::std::unique_ptr it is given; see "Asynchronous server streams" above. Template
// arguments by the rule at the top: the request type, then the response type.

// A server-streaming call: the request, and the responses to write.
template <typename Request, typename Response>
class ServerAsyncWriter : public internal::ServerAsyncStreamBase {
 public:
  ServerAsyncWriter(ServerCall* call, const MethodInfo& method, Request request,
                    ::std::unique_ptr<ServerAsyncStream> stream)
      : ServerAsyncStreamBase(call, method, ::std::move(stream)), request_(::std::move(request)) {}
  ~ServerAsyncWriter() { Drop(); }
  const Request& request() const { return request_; }
  // Sends `response` (alive until `done` runs) once the client has room: done(true) once it has
  // gone, done(false) when the stream has ended (the client gave up, or it could not go).
  void Write(const Response& response, StreamCallback done) {
    internal::StartWriteOf(stream(), response, ::std::move(done));
  }
  // The same with a bulk payload beside it (whose bytes live until its release runs).
  void Write(const Response& response, OutgoingBulk bulk, StreamCallback done) {
    internal::StartWriteOf(stream(), response, ::std::move(done), ::std::move(bulk));
  }
  // Ends the call with `status`, after the outstanding Write.
  void Finish(::absl::Status status) { FinishWith(::std::move(status), nullptr); }

 private:
  Request request_;
};

// A client-streaming call: the requests to read, and the one response.
template <typename Request, typename Response>
class ServerAsyncReader : public internal::ServerAsyncStreamBase {
 public:
  ServerAsyncReader(ServerCall* call, const MethodInfo& method,
                    ::std::unique_ptr<ServerAsyncStream> stream)
      : ServerAsyncStreamBase(call, method, ::std::move(stream)) {}
  ~ServerAsyncReader() { Drop(); }
  // The client's next message into `*request` (alive until `done` runs): done(true), or
  // done(false) once it half-closed (or gave up).
  void Read(Request* request, StreamCallback done) {
    internal::StartReadInto(stream(), request, ::std::move(done));
  }
  // The same, with the message's bulk payload in `*bulk` (alive until `done` runs).
  void Read(Request* request, IncomingBulk* bulk, StreamCallback done) {
    internal::StartReadInto(stream(), request, ::std::move(done), bulk);
  }
  // What Finish(OK) sends: fill it in first.
  Response* response() { return &response_; }
  // Ends the call: with `status` OK answers *response(); otherwise sends the error.
  void Finish(::absl::Status status) { FinishWith(::std::move(status), &response_); }

 private:
  Response response_;
};

// A bidirectional call: one Read and one Write may be outstanding at once.
template <typename Request, typename Response>
class ServerAsyncReaderWriter : public internal::ServerAsyncStreamBase {
 public:
  ServerAsyncReaderWriter(ServerCall* call, const MethodInfo& method,
                          ::std::unique_ptr<ServerAsyncStream> stream)
      : ServerAsyncStreamBase(call, method, ::std::move(stream)) {}
  ~ServerAsyncReaderWriter() { Drop(); }
  void Read(Request* request, StreamCallback done) {
    internal::StartReadInto(stream(), request, ::std::move(done));
  }
  void Read(Request* request, IncomingBulk* bulk, StreamCallback done) {
    internal::StartReadInto(stream(), request, ::std::move(done), bulk);
  }
  void Write(const Response& response, StreamCallback done) {
    internal::StartWriteOf(stream(), response, ::std::move(done));
  }
  void Write(const Response& response, OutgoingBulk bulk, StreamCallback done) {
    internal::StartWriteOf(stream(), response, ::std::move(done), ::std::move(bulk));
  }
  void Finish(::absl::Status status) { FinishWith(::std::move(status), nullptr); }
};

namespace internal {

// Opens a stream: for a server-streaming method, with `request` serialized straight into a
// registered slot; otherwise with an empty opening message. `response` (client streaming only)
// must outlive the call's Finish.
template <typename Response>
::std::unique_ptr<ClientStreamCall> OpenClientStream(Channel* channel, const MethodInfo& method,
                                                     const ::google::protobuf::MessageLite* request,
                                                     ::google::protobuf::MessageLite* response,
                                                     const CallOptions& options) {
  const size_t size = request == nullptr ? 0 : request->ByteSizeLong();
  ::absl::StatusOr<SendSlot> slot = ChannelAccess::AcquireSendSlot(channel, method, size, options);
  if (!slot.ok()) {
    return ::std::make_unique<FailedStream>(::absl::Status(
        slot.status().code(),
        ::std::string(method.full_name) + ": " + ::std::string(slot.status().message())));
  }
  if (request != nullptr) request->SerializeWithCachedSizesToArray(slot->data);
  const ::google::protobuf::MessageLite* read_prototype =
      method.server_streaming ? &Response::default_instance() : nullptr;
  return ChannelAccess::OpenStream(channel, method, *::std::move(slot), read_prototype, response,
                                   options);
}

// Finishes a stream whose handler returned `status`: OK ends it with an empty response.
inline void FinishStream(ServerCall* call, ::absl::Status status) {
  if (!status.ok()) {
    call->Finish(::std::move(status), nullptr, OutgoingBulk());
    return;
  }
  ::absl::StatusOr<SendSlot> slot = SerializeResponse(call, nullptr);
  if (!slot.ok()) {
    call->Finish(slot.status(), nullptr, OutgoingBulk());
    return;
  }
  call->Finish(::absl::OkStatus(), &*slot, OutgoingBulk());
}

// Opens the server's end; null (and the call finished) for a runtime without streams.
inline StreamCall* OpenServerStream(ServerCall* call, const MethodInfo& method,
                                    const ::google::protobuf::MessageLite* read_prototype) {
  StreamCall* stream = call->OpenStream(read_prototype);
  if (stream == nullptr) {
    call->Finish(::absl::UnimplementedError(::std::string(method.full_name) +
                                            ": this server does not serve streams"),
                 nullptr, OutgoingBulk());
  }
  return stream;
}

// Opens the server's end in the asynchronous form; null (and the call finished) for a runtime
// without it.
inline ::std::unique_ptr<ServerAsyncStream> OpenServerAsyncStream(
    ServerCall* call, const MethodInfo& method,
    const ::google::protobuf::MessageLite* read_prototype) {
  ::std::unique_ptr<ServerAsyncStream> stream = call->OpenAsyncStream(read_prototype);
  if (stream == nullptr) {
    call->Finish(::absl::UnimplementedError(::std::string(method.full_name) +
                                            ": this server does not serve asynchronous streams"),
                 nullptr, OutgoingBulk());
  }
  return stream;
}

// The asynchronous dispatch of each streaming kind (an AsyncService's): the handler gets its
// call's ServerAsync{Writer,Reader,ReaderWriter} and returns at once; the call ends at its
// Finish (or its destruction).
template <typename Request, typename Response, typename Handler>
void HandleServerStreamingLater(ServerCall* call, const MethodInfo& method, Handler&& handler) {
  Request request;
  if (!ParseRequest(call, &request)) return;
  ::std::unique_ptr<ServerAsyncStream> stream = OpenServerAsyncStream(call, method, nullptr);
  if (stream == nullptr) return;
  handler(::std::make_unique<ServerAsyncWriter<Request, Response>>(
      call, method, ::std::move(request), ::std::move(stream)));
}

template <typename Request, typename Response, typename Handler>
void HandleClientStreamingLater(ServerCall* call, const MethodInfo& method, Handler&& handler) {
  ::std::unique_ptr<ServerAsyncStream> stream =
      OpenServerAsyncStream(call, method, &Request::default_instance());
  if (stream == nullptr) return;
  handler(
      ::std::make_unique<ServerAsyncReader<Request, Response>>(call, method, ::std::move(stream)));
}

template <typename Request, typename Response, typename Handler>
void HandleBidiStreamingLater(ServerCall* call, const MethodInfo& method, Handler&& handler) {
  ::std::unique_ptr<ServerAsyncStream> stream =
      OpenServerAsyncStream(call, method, &Request::default_instance());
  if (stream == nullptr) return;
  handler(::std::make_unique<ServerAsyncReaderWriter<Request, Response>>(call, method,
                                                                         ::std::move(stream)));
}

// Dispatch of a server-streaming method: handler(context, request, &writer) -> status.
template <typename Request, typename Response, typename Handler>
void HandleServerStreaming(ServerCall* call, const MethodInfo& method, Handler&& handler) {
  Request request;
  if (!ParseRequest(call, &request)) return;
  StreamCall* stream = OpenServerStream(call, method, nullptr);
  if (stream == nullptr) return;
  ServerWriter<Response> writer(stream);
  FinishStream(call, handler(call->context(), request, &writer));
}

// Dispatch of a client-streaming method: handler(context, &reader, &response) -> status.
template <typename Request, typename Response, typename Handler>
void HandleClientStreaming(ServerCall* call, const MethodInfo& method, Handler&& handler) {
  StreamCall* stream = OpenServerStream(call, method, &Request::default_instance());
  if (stream == nullptr) return;
  ServerReader<Request> reader(stream);
  Response response;
  ::absl::Status status = handler(call->context(), &reader, &response);
  FinishUnary(call, ::std::move(status), response, OutgoingBulk());
}

// Dispatch of a bidirectional method: handler(context, &stream) -> status.
template <typename Request, typename Response, typename Handler>
void HandleBidiStreaming(ServerCall* call, const MethodInfo& method, Handler&& handler) {
  StreamCall* stream = OpenServerStream(call, method, &Request::default_instance());
  if (stream == nullptr) return;
  ServerReaderWriter<Request, Response> both(stream);
  FinishStream(call, handler(call->context(), &both));
}

}  // namespace internal
}  // namespace zrpc

#endif  // ZRPC_RPC_STREAMING_H_
