// zrpc's public API in one include: servers and channels, their options, calls and streams, bulk
// payloads and registered memory, metrics and the /metrics endpoint.
//
//   #include "rpc/zrpc.h"
//   #include "my/pkg/greeter.zrpc.h"    // the generated stubs and service base classes
//
// Each header it includes states its own contract; rpc/README.md maps them. Headers under
// rpc/impl/ are for generated code, and nothing else under rpc/ is for applications.
#ifndef ZRPC_RPC_ZRPC_H_
#define ZRPC_RPC_ZRPC_H_

#include "rpc/bulk.h"
#include "rpc/call_options.h"
#include "rpc/channel.h"
#include "rpc/interceptor.h"
#include "rpc/metrics.h"
#include "rpc/metrics_http.h"
#include "rpc/options.h"
#include "rpc/pending_call.h"
#include "rpc/registered_memory.h"
#include "rpc/server.h"
#include "rpc/server_context.h"
#include "rpc/service.h"
#include "rpc/streaming.h"
#include "rpc/trace_interceptor.h"

#endif  // ZRPC_RPC_ZRPC_H_
