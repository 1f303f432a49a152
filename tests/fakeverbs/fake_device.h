// The configuration that opens the fake device (fake_verbs.h), for tests and counts that run the
// transport or the whole runtime over it.
#ifndef ZRPC_TESTS_FAKEVERBS_FAKE_DEVICE_H_
#define ZRPC_TESTS_FAKEVERBS_FAKE_DEVICE_H_

#include "tests/fakeverbs/fake_verbs.h"
#include "transport/device_config.h"

namespace zrpc::fakeverbs {

inline transport::DeviceConfig FakeDevice() {
  transport::DeviceConfig config;
  config.addr = kAddress;
  return config;
}

}  // namespace zrpc::fakeverbs

#endif  // ZRPC_TESTS_FAKEVERBS_FAKE_DEVICE_H_
