// Which RDMA device, port, GID and address to use, as told by the environment.
//
// tools/softroce (and a user on a real fabric) describes the device with ZRPC_RDMA_DEVICE,
// ZRPC_RDMA_PORT, ZRPC_RDMA_GID_INDEX and ZRPC_RDMA_ADDR; see tools/SOFTROCE.md. Parsing is
// separate from the environment so it can be tested with any input.
#ifndef ZRPC_TRANSPORT_DEVICE_CONFIG_H_
#define ZRPC_TRANSPORT_DEVICE_CONFIG_H_

#include <functional>
#include <string>

#include "absl/status/statusor.h"

namespace zrpc::transport {

struct DeviceConfig {
  std::string device;         // verbs device name; empty: whichever device owns `addr`
  int port = 1;               // 1-based port number
  int gid_index = -1;         // -1: let librdmacm resolve the GID from `addr`
  std::string addr;           // IPv4 or IPv6 address on the device, to listen on / connect to
  bool from_harness = false;  // ZRPC_SOFTROCE_MODE is set: a device is promised to exist
};

// Reads the ZRPC_RDMA_* variables through `lookup` (nullptr for unset). NotFound when
// ZRPC_RDMA_ADDR is unset or empty; InvalidArgument naming the variable when a number is
// malformed or out of range.
absl::StatusOr<DeviceConfig> ParseDeviceConfig(
    const std::function<const char*(const char*)>& lookup);

// ParseDeviceConfig over the process environment.
absl::StatusOr<DeviceConfig> DeviceConfigFromEnv();

}  // namespace zrpc::transport

#endif  // ZRPC_TRANSPORT_DEVICE_CONFIG_H_
