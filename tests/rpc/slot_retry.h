// For one test's scope, the timers' retry of what found no send slot (a client's channel timer,
// a server's sweeper: rpc/connection/rpc_connection.h, SlotRetry) waits an hour instead of a
// millisecond: what waits for a slot must then go on the send completions' notices alone
// (RpcConnection::WaitForSendSlot, OnSendSlotFree). A timer that passes for other reasons (a
// channel's keepalives) still tells what waits: turn those off in such a test.
#ifndef ZRPC_TESTS_RPC_SLOT_RETRY_H_
#define ZRPC_TESTS_RPC_SLOT_RETRY_H_

#include "absl/time/time.h"
#include "rpc/connection/rpc_connection.h"

namespace zrpc_test {

class NoTimedSlotRetry {
 public:
  NoTimedSlotRetry() { zrpc::internal::SetSlotRetryForTesting(absl::Hours(1)); }
  ~NoTimedSlotRetry() { zrpc::internal::SetSlotRetryForTesting(zrpc::internal::kSlotRetry); }
  NoTimedSlotRetry(const NoTimedSlotRetry&) = delete;
  NoTimedSlotRetry& operator=(const NoTimedSlotRetry&) = delete;
};

}  // namespace zrpc_test

#endif  // ZRPC_TESTS_RPC_SLOT_RETRY_H_
