// Service: what a Server dispatches to. Generated service base classes (Foo::Service,
// Foo::AsyncService) implement it; an application subclasses those, never Service itself, and
// adds the object to a Server with Server::AddService (rpc/server.h).
//
// MethodInfo and ServiceInfo describe a service's methods as the .proto declares them; methods
// are identified on the wire and in dispatch by their index, never by name on the hot path.
//
// Contract: a Service must outlive the Server it is registered with. Dispatch may run on several
// runtime threads at once (rpc/THREADING.md).
#ifndef ZRPC_RPC_SERVICE_H_
#define ZRPC_RPC_SERVICE_H_

namespace zrpc {

struct MethodInfo {
  const char* full_name;  // "package.Service/Method"
  int index;              // position in the service's method table, as sent on the wire
  bool request_bulk;      // the request carries a bulk payload ((zrpc.method).request_bulk)
  bool response_bulk;     // the response carries one ((zrpc.method).response_bulk)
  bool client_streaming;  // the client sends a stream of requests (rpc/streaming.h)
  bool server_streaming;  // the server sends a stream of responses
  // The .proto marks it safe to call again (option idempotency_level = IDEMPOTENT or
  // NO_SIDE_EFFECTS): a channel retries a unary call to it that failed UNAVAILABLE, even one that
  // may have run (rpc/channel.h, "Retries"). Last, so that a MethodInfo initialized without it
  // reads false.
  bool idempotent;
  bool streaming() const { return client_streaming || server_streaming; }
};

struct ServiceInfo {
  const char* full_name;      // "package.Service"
  const MethodInfo* methods;  // method_count entries, methods[i].index == i
  int method_count;
};

class ServerCall;  // the runtime's side of one call (rpc/impl/call_interfaces.h)

// What the runtime dispatches to: generated service base classes implement this.
class Service {
 public:
  virtual ~Service() = default;
  virtual const ServiceInfo& service_info() const = 0;
  // `method_index` is in [0, service_info().method_count): the runtime checks it first.
  virtual void Dispatch(int method_index, ServerCall* call) = 0;
  // Whether the streaming handlers are asynchronous (an AsyncService's: they return at once and
  // own their stream), so the runtime gives them no thread of their own.
  virtual bool serves_streams_async() const { return false; }
  // Whether every handler is asynchronous (an AsyncService's: it returns at once and owns its
  // call), so a unary method runs inline on the poller thread unless the server is told
  // otherwise (ServerOptions::inline_by_default, Server::SetInline).
  virtual bool handlers_async() const { return false; }
};

}  // namespace zrpc

#endif  // ZRPC_RPC_SERVICE_H_
