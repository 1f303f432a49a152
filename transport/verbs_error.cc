#include "transport/verbs_error.h"

#include <cerrno>
#include <cstring>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace zrpc::transport {
namespace {

absl::StatusCode CodeForErrno(int err) {
  switch (err) {
    case ENOMEM:
      return absl::StatusCode::kResourceExhausted;
    case EPERM:
    case EACCES:
      return absl::StatusCode::kPermissionDenied;
    case ETIMEDOUT:
      return absl::StatusCode::kDeadlineExceeded;
    case ECONNREFUSED:
    case ECONNRESET:
    case ENETUNREACH:
    case EHOSTUNREACH:
      return absl::StatusCode::kUnavailable;
    case ENODEV:
    case ENOSYS:
    case ENXIO:
      return absl::StatusCode::kFailedPrecondition;
    case EINVAL:
      return absl::StatusCode::kInvalidArgument;
    default:
      return absl::StatusCode::kInternal;
  }
}

absl::string_view HintForErrno(absl::string_view call, int err) {
  // Callers decorate the name ("ibv_reg_mr(slot pool, ...)"): match its start.
  if ((err == ENOMEM || err == EPERM) && absl::StartsWith(call, "ibv_reg_mr")) {
    return " (registration pins memory: check `ulimit -l`, RLIMIT_MEMLOCK)";
  }
  if (err == ENODEV || err == ENOSYS) {
    return " (no RDMA device: run through tools/softroce, or load rdma_rxe)";
  }
  return "";
}

}  // namespace

absl::Status VerbsError(absl::string_view call, int err) {
  return absl::Status(CodeForErrno(err), absl::StrCat(call, ": ", std::strerror(err), " (errno ",
                                                      err, ")", HintForErrno(call, err)));
}

absl::Status CompletionError(const ibv_wc& wc) {
  if (wc.status == IBV_WC_SUCCESS) return absl::OkStatus();
  absl::StatusCode code;
  switch (wc.status) {
    case IBV_WC_WR_FLUSH_ERR:
    case IBV_WC_RETRY_EXC_ERR:
    case IBV_WC_RNR_RETRY_EXC_ERR:
    case IBV_WC_RESP_TIMEOUT_ERR:
    case IBV_WC_REM_ABORT_ERR:
      code = absl::StatusCode::kUnavailable;
      break;
    default:
      code = absl::StatusCode::kInternal;
  }
  // What the two retry failures mean for the user, and the options that set how long they took
  // (options.h, ConnectionOptions; transport/README.md, "Retry timing").
  absl::string_view hint;
  if (wc.status == IBV_WC_RETRY_EXC_ERR) {
    hint =
        ": the peer acknowledged nothing through every retry (its host, NIC or the link between is "
        "gone, or its queue pair closed or failed before its disconnect came; "
        "ConnectionOptions::ack_timeout_exponent and retry_count set how long that takes)";
  } else if (wc.status == IBV_WC_RNR_RETRY_EXC_ERR) {
    hint =
        ": the peer had no receive posted through every receiver-not-ready retry (a peer that "
        "keeps to its credits never meets this: a bug or a lying peer)";
  }
  return absl::Status(code,
                      absl::StrCat("work completion ", wc.wr_id, ": ", ibv_wc_status_str(wc.status),
                                   " (ibv_wc_status ", static_cast<int>(wc.status), ", vendor_err ",
                                   wc.vendor_err, ")", hint));
}

}  // namespace zrpc::transport
