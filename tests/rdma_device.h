// For tests that need an RDMA device: find it, or skip loudly, or fail.
//
// Inside tools/softroce (ZRPC_SOFTROCE_MODE is set) a device is promised, so anything missing
// is a failure. Outside it, with no ZRPC_RDMA_ADDR, the test is SKIPPED with a message saying
// how to run it; it never passes silently.
#ifndef ZRPC_TESTS_RDMA_DEVICE_H_
#define ZRPC_TESTS_RDMA_DEVICE_H_

#include <catch2/catch.hpp>
#include <cstdlib>
#include <string>

#include "tests/skip.h"
#include "transport/device_config.h"

// Declares `const zrpc::transport::DeviceConfig& var`, or skips / fails the test case.
#define ZRPC_REQUIRE_RDMA_DEVICE(var)                                               \
  auto var##_or = ::zrpc::transport::DeviceConfigFromEnv();                         \
  if (!var##_or.ok()) {                                                             \
    const char* mode = std::getenv("ZRPC_SOFTROCE_MODE");                           \
    if (var##_or.status().code() == absl::StatusCode::kNotFound &&                  \
        (mode == nullptr || *mode == '\0')) {                                       \
      ZRPC_SKIP(                                                                    \
          "needs an RDMA device: run it through tools/softroce (tools/test does), " \
          "or set ZRPC_RDMA_ADDR to an address on your RDMA device");               \
    }                                                                               \
    FAIL(var##_or.status().ToString());                                             \
  }                                                                                 \
  const ::zrpc::transport::DeviceConfig& var = *var##_or

#endif  // ZRPC_TESTS_RDMA_DEVICE_H_
