// Verbs and librdmacm failures as absl::Status, in exactly one place.
//
// Every ibv_*/rdma_* call that can fail goes through VerbsError (errno-style failures) or
// CompletionError (a work completion whose status is not IBV_WC_SUCCESS). The message names the
// call and the errno or ibv_wc_status, and adds a hint where the cause is usually outside the
// program (RLIMIT_MEMLOCK for registration, a missing device for ENODEV/ENOSYS).
#ifndef ZRPC_TRANSPORT_VERBS_ERROR_H_
#define ZRPC_TRANSPORT_VERBS_ERROR_H_

#include <infiniband/verbs.h>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace zrpc::transport {

// The Status for `call` having failed with errno `err` (verbs calls return it directly or set
// errno; pass whichever applies). Codes: ENOMEM -> kResourceExhausted, EPERM/EACCES ->
// kPermissionDenied, ETIMEDOUT -> kDeadlineExceeded, ECONNREFUSED/ECONNRESET/ENETUNREACH/
// EHOSTUNREACH -> kUnavailable, ENODEV/ENOSYS/ENXIO -> kFailedPrecondition, EINVAL ->
// kInvalidArgument, anything else -> kInternal.
absl::Status VerbsError(absl::string_view call, int err);

// The Status of a work completion: OK for IBV_WC_SUCCESS. A flushed work request (the QP went
// to the error state) and exhausted retries are kUnavailable: the connection is gone, the
// caller may reconnect. Access and length errors are kInternal: they are bugs, ours or the
// peer's.
absl::Status CompletionError(const ibv_wc& wc);

}  // namespace zrpc::transport

#endif  // ZRPC_TRANSPORT_VERBS_ERROR_H_
