// ServerInterceptor: a server's hooks around each call it serves, for authentication, tracing,
// logging and quotas that belong to no one handler (ServerOptions::interceptors).
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

#include "absl/status/status.h"
#include "rpc/server_context.h"
#include "rpc/service.h"

namespace zrpc {

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

  // After the call was answered: `status` is what the caller was sent (OK, the handler's or an
  // earlier interceptor's error, or the runtime's, such as a response too large to send), or
  // UNAVAILABLE when the runtime answered for the call first (the connection failed, the
  // server's shutdown grace ran out). The answer has gone: observe, don't change it.
  virtual void OnCallEnd(ServerContext& context, const MethodInfo& method,
                         const ::absl::Status& status) {
    static_cast<void>(context);
    static_cast<void>(method);
    static_cast<void>(status);
  }
};

}  // namespace zrpc

#endif  // ZRPC_RPC_INTERCEPTOR_H_
