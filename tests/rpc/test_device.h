// ZRPC_TEST_DEVICE(var), for tests built twice: fakeverbs' stand-in device when built with
// ZRPC_OVER_FAKEVERBS (on the host; the target then depends on //tests/fakeverbs:fake_device),
// else the harness's device (tag "rdma"), which says SKIPPED, loudly, when there is none.
#ifndef ZRPC_TESTS_RPC_TEST_DEVICE_H_
#define ZRPC_TESTS_RPC_TEST_DEVICE_H_

#ifdef ZRPC_OVER_FAKEVERBS
#include "tests/fakeverbs/fake_device.h"
#define ZRPC_TEST_DEVICE(var) \
  const zrpc::transport::DeviceConfig var = zrpc::fakeverbs::FakeDevice()
#else
#include "tests/rdma_device.h"
#define ZRPC_TEST_DEVICE(var) ZRPC_REQUIRE_RDMA_DEVICE(var)
#endif

#endif  // ZRPC_TESTS_RPC_TEST_DEVICE_H_
