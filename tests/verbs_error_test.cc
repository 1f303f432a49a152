#include "transport/verbs_error.h"

#include <catch2/catch.hpp>
#include <cerrno>
#include <string>

using zrpc::transport::CompletionError;
using zrpc::transport::VerbsError;

TEST_CASE("VerbsError names the call and the errno and picks a code", "[transport][errors]") {
  absl::Status s = VerbsError("ibv_post_send", ENOMEM);
  CHECK(s.code() == absl::StatusCode::kResourceExhausted);
  std::string msg(s.message());
  CHECK(msg.find("ibv_post_send") != std::string::npos);
  CHECK(msg.find("errno 12") != std::string::npos);

  CHECK(VerbsError("rdma_connect", ETIMEDOUT).code() == absl::StatusCode::kDeadlineExceeded);
  CHECK(VerbsError("rdma_connect", ECONNREFUSED).code() == absl::StatusCode::kUnavailable);
  CHECK(VerbsError("ibv_create_qp", EINVAL).code() == absl::StatusCode::kInvalidArgument);
  CHECK(VerbsError("ibv_open_device", EIO).code() == absl::StatusCode::kInternal);
}

TEST_CASE("VerbsError hints at the cause outside the program", "[transport][errors]") {
  std::string memlock(VerbsError("ibv_reg_mr", ENOMEM).message());
  CHECK(memlock.find("RLIMIT_MEMLOCK") != std::string::npos);
  absl::Status no_device = VerbsError("rdma_create_event_channel", ENODEV);
  CHECK(no_device.code() == absl::StatusCode::kFailedPrecondition);
  CHECK(std::string(no_device.message()).find("tools/softroce") != std::string::npos);
  // The memlock hint belongs to registration only.
  CHECK(std::string(VerbsError("ibv_create_cq", ENOMEM).message()).find("MEMLOCK") ==
        std::string::npos);
}

TEST_CASE("CompletionError maps work-completion statuses", "[transport][errors]") {
  ibv_wc wc{};
  wc.wr_id = 42;
  wc.status = IBV_WC_SUCCESS;
  CHECK(CompletionError(wc).ok());

  wc.status = IBV_WC_WR_FLUSH_ERR;
  absl::Status flushed = CompletionError(wc);
  CHECK(flushed.code() == absl::StatusCode::kUnavailable);
  CHECK(std::string(flushed.message()).find("42") != std::string::npos);
  CHECK(std::string(flushed.message()).find(ibv_wc_status_str(IBV_WC_WR_FLUSH_ERR)) !=
        std::string::npos);

  wc.status = IBV_WC_RETRY_EXC_ERR;
  absl::Status retries = CompletionError(wc);
  CHECK(retries.code() == absl::StatusCode::kUnavailable);
  CHECK(std::string(retries.message()).find("acknowledged nothing through every retry") !=
        std::string::npos);
  CHECK(std::string(retries.message()).find("ack_timeout_exponent") != std::string::npos);
  wc.status = IBV_WC_RNR_RETRY_EXC_ERR;
  CHECK(std::string(CompletionError(wc).message()).find("no receive posted") != std::string::npos);
  wc.status = IBV_WC_WR_FLUSH_ERR;
  CHECK(std::string(CompletionError(wc).message()).find("retry") == std::string::npos);
  wc.status = IBV_WC_REM_ACCESS_ERR;
  CHECK(CompletionError(wc).code() == absl::StatusCode::kInternal);
  wc.status = IBV_WC_LOC_LEN_ERR;
  CHECK(CompletionError(wc).code() == absl::StatusCode::kInternal);
}
