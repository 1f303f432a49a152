// ServerInterceptor and ClientInterceptor: hooks around each call a server serves
// (ServerOptions::interceptors) or a channel makes (ChannelOptions::interceptors), and each
// message of its stream, for authentication, tracing, logging and quotas that belong to no one
// handler or caller.
//
// A server runs its interceptors' OnCallStart in the order given, before the handler, on the
// thread that runs the handler (a pool thread, a stream's thread, or the poller for an inline
// handler: it must not block there). The first that fails the call ends the chain: the caller
// gets its status (with any trailing metadata added so far), the handler does not run and the
// interceptors after it are not asked. Once the call is answered, the interceptors whose
// OnCallStart succeeded see its end, in reverse order, on the thread that finished it. A
// server with no interceptor pays a load and a branch per call, nothing more.
//
// Contract: an interceptor is shared by every call of its server, from many threads at once;
// it must outlive the server and keep no per-call state of its own except through the
// ServerContext it is given (which is the handler's: what OnCallStart sets there, the handler
// reads).
#ifndef ZRPC_RPC_INTERCEPTOR_H_
#define ZRPC_RPC_INTERCEPTOR_H_

#include <google/protobuf/message_lite.h>

#include "absl/status/status.h"
#include "rpc/metadata.h"
#include "rpc/server_context.h"
#include "rpc/service.h"

namespace zrpc {

// Which way a stream's message goes, for OnStreamMessage: received by this side (the client's
// messages on a server, the server's on a channel) or sent by it.
enum class StreamDirection { kReceived, kSent };

class ServerInterceptor {
 public:
  virtual ~ServerInterceptor() = default;

  // Before the handler of a call to `method` (unary or streaming) runs. May read what the
  // caller sent (context.client_metadata(), peer(), auth_key_id()), add trailing metadata
  // (AddTrailingMetadata) and set the call's trace (SetTrace). OK lets the call go on; anything
  // else is the caller's answer instead of the handler's. Not run for a call given up before
  // its handler would have run (its deadline passed, it was cancelled).
  virtual ::absl::Status OnCallStart(ServerContext& context, const MethodInfo& method) {
    static_cast<void>(context);
    static_cast<void>(method);
    return ::absl::OkStatus();
  }

  // Each message of a streaming call, on the thread that reads or writes it: a message the
  // client sent as the handler's Read returns it (kReceived; before the handler sees it), one the
  // handler writes before it is sent (kSent). Received messages pass the interceptors in the
  // order given, sent ones in reverse (the order of OnCallStart and OnCallEnd). OK lets the
  // message go on; anything else fails the call with that status: the Read returns no message,
  // or the Write sends nothing and returns false, and the caller gets the status whatever the
  // handler returns. On an asynchronous stream a received message's check runs where the read
  // completes (a poller, the sweeper), and a sent one's on the thread that starts the Write, so
  // it must not block. It may run for one call on two threads at once (a reader and a writer):
  // what it keeps in the context must allow that. Only the stream's messages come here: a unary
  // call's two, a server-streaming call's request and a client-streaming call's response do not
  // (OnCallStart and OnCallEnd frame them). A message's bulk payload (rpc/streaming.h, "Bulk
  // payloads") is not shown: the hook sees the message alone.
  virtual ::absl::Status OnStreamMessage(ServerContext& context, const MethodInfo& method,
                                         StreamDirection direction,
                                         const ::google::protobuf::MessageLite& message) {
    static_cast<void>(context);
    static_cast<void>(method);
    static_cast<void>(direction);
    static_cast<void>(message);
    return ::absl::OkStatus();
  }

  // After the call was answered: `status` is what the caller was sent (OK, the handler's or an
  // earlier interceptor's error, or the runtime's, such as a response too large to send), or
  // UNAVAILABLE when the runtime answered for the call first (the connection failed, the
  // server's shutdown grace ran out) or the answer could not be sent. The answer has gone (OK:
  // handed to the connection; one whose payload then waits for staging memory and cannot get
  // it reaches the caller as an error this does not see): observe, don't change it. Its time
  // counts in the method's latency (ServerStats, /metrics).
  virtual void OnCallEnd(ServerContext& context, const MethodInfo& method,
                         const ::absl::Status& status) {
    static_cast<void>(context);
    static_cast<void>(method);
    static_cast<void>(status);
  }
};

// A channel runs its interceptors' OnCallStart in the order given as each call starts (unary
// or streaming), on the thread that starts it, before anything is sent; the first that fails the
// call ends the chain, and the call fails with its status, nothing sent. Once the call has
// ended, those whose OnCallStart succeeded see its end in reverse order, on the thread that ends
// it (a poller, or the caller's when it failed before it was sent), before the caller hears:
// before a blocking call returns, its DoneCallback runs or a stream's Finish returns. A channel
// with no interceptor pays a load and a branch per call. Same contract as ServerInterceptor's:
// shared by every call, from many threads; it must outlive the channel, and must not block.
class ClientInterceptor {
 public:
  virtual ~ClientInterceptor() = default;

  // Before a call to `method` goes: `metadata` is what the call will send (CallOptions::metadata
  // and what the interceptors before this one added), which this one may add to (Metadata::Add's
  // rules and bound apply). OK lets the call go on; anything else fails it with that status.
  virtual ::absl::Status OnCallStart(const MethodInfo& method, Metadata& metadata) {
    static_cast<void>(method);
    static_cast<void>(metadata);
    return ::absl::OkStatus();
  }

  // Each message of a streaming call, on the thread that writes or reads it: one the caller
  // writes, before it is sent (kSent), and one the server sent, as a Read returns it (kReceived;
  // before the caller sees it). Sent messages pass the interceptors in the order given, received
  // ones in reverse. OK lets the message go on; anything else fails the call with that status
  // (the server is told the call was cancelled): the Write sends nothing and returns false, or
  // the Read returns no message, and Finish returns the status once the call has ended (the
  // interceptors' OnCallEnd first). On an asynchronous stream a received message's check runs
  // where the Read completes (a poller), so it must not block. It may run for one call on two
  // threads at once (a reader and a writer). As on a server, only the stream's messages come
  // here, not a unary call's or the single message of a one-way stream's other side.
  virtual ::absl::Status OnStreamMessage(const MethodInfo& method, StreamDirection direction,
                                         const ::google::protobuf::MessageLite& message) {
    static_cast<void>(method);
    static_cast<void>(direction);
    static_cast<void>(message);
    return ::absl::OkStatus();
  }

  // The call ended with `status` (OK, the server's error, or the runtime's: a deadline, a cancel,
  // a lost connection, a later interceptor's refusal); `trailing` is the server's trailing
  // metadata (empty when none came).
  virtual void OnCallEnd(const MethodInfo& method, const ::absl::Status& status,
                         const Metadata& trailing) {
    static_cast<void>(method);
    static_cast<void>(status);
    static_cast<void>(trailing);
  }
};

}  // namespace zrpc

#endif  // ZRPC_RPC_INTERCEPTOR_H_
