// The process limit a growing server meets first: locked memory.
//
// Every byte registered with an RDMA device is pinned, and pinned pages count against
// RLIMIT_MEMLOCK unless the process has CAP_IPC_LOCK (ib_umem_get). Debian's default soft limit is
// 8 MiB: about twenty idle connections of their own receives (388 KiB), about thirty on an RPC
// server's default shared receive queue cut to fit (rpc/server). Past the limit a registration
// fails with ENOMEM, and a server refuses the connection it was for; the RPC server instead bounds
// its admission by the limit at creation and says so, naming the limit and the value that would
// hold max_connections (rpc/server). The bound counts what idle connections register; send slots
// the pool grows for, pulled payloads and the application's own registrations come on top, so a
// limit just large enough for max_connections still fails some registrations under load. Open files
// are no such limit: an open connection holds no file descriptor of its own on either side, and a
// connect attempt holds one only until it succeeds or fails (tests/transport/connection_test), so
// only each poller and listener do (a few each).
#ifndef ZRPC_TRANSPORT_PROCESS_LIMITS_H_
#define ZRPC_TRANSPORT_PROCESS_LIMITS_H_

#include <cstdint>
#include <string>

#include "transport/options.h"

namespace zrpc::transport {

struct LockedMemory {
  // No limit applies: RLIMIT_MEMLOCK is infinite, or the process has CAP_IPC_LOCK.
  bool unlimited = true;
  uint64_t limit = 0;   // the soft limit, bytes (when limited)
  uint64_t locked = 0;  // pinned by the process now (VmPin), bytes
};

// This process's, now. CAP_IPC_LOCK is read from the process's effective set, which inside a
// user namespace may show a capability the kernel does not honour for pinning (it checks the
// initial namespace's): such a process is taken as unlimited and meets the limit at
// registration instead.
LockedMemory ReadLockedMemory();

// Bytes the process has pinned now (registered memory): VmPin.
uint64_t PinnedBytes();

// Registered bytes an idle connection with `options` holds: its arena (none when lent on demand:
// the poller's pool is counted apart), and its receives' and its credit frames' pool slots (with
// a shared receive queue, only the credit frames').
uint64_t RegisteredPerIdleConnection(const ConnectionOptions& options, bool shared_receives,
                                     uint64_t slot_size);

// Connections of `per_connection` registered bytes that fit in what `memory` leaves, or
// UINT64_MAX when unlimited.
uint64_t ConnectionsWithin(const LockedMemory& memory, uint64_t per_connection);

// What to tell an operator whose limit holds fewer than `wanted` connections: the limit, what is
// locked, what one connection takes, and the value to set.
std::string RaiseLockedMemoryAdvice(const LockedMemory& memory, uint64_t per_connection,
                                    uint64_t wanted);

}  // namespace zrpc::transport

#endif  // ZRPC_TRANSPORT_PROCESS_LIMITS_H_
