#include "transport/device_config.h"

#include <cstdlib>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace zrpc::transport {
namespace {

absl::Status ParseInt(const char* name, const char* value, int min, int max, int* out) {
  if (value == nullptr || *value == '\0') return absl::OkStatus();  // keep the default
  int parsed = 0;
  if (!absl::SimpleAtoi(value, &parsed) || parsed < min || parsed > max) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, "='", value, "' is not an integer in [", min, ", ", max, "]"));
  }
  *out = parsed;
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<DeviceConfig> ParseDeviceConfig(
    const std::function<const char*(const char*)>& lookup) {
  DeviceConfig config;
  const char* addr = lookup("ZRPC_RDMA_ADDR");
  const char* mode = lookup("ZRPC_SOFTROCE_MODE");
  config.from_harness = mode != nullptr && *mode != '\0';
  if (addr == nullptr || *addr == '\0') {
    return absl::NotFoundError(
        "ZRPC_RDMA_ADDR is not set: run through tools/softroce, or set ZRPC_RDMA_ADDR to an "
        "address on your RDMA device");
  }
  config.addr = addr;
  if (const char* device = lookup("ZRPC_RDMA_DEVICE"); device != nullptr) config.device = device;
  // Port numbers are u8 in verbs; GID tables hold at most a few hundred entries.
  if (auto s = ParseInt("ZRPC_RDMA_PORT", lookup("ZRPC_RDMA_PORT"), 1, 255, &config.port);
      !s.ok()) {
    return s;
  }
  if (auto s = ParseInt("ZRPC_RDMA_GID_INDEX", lookup("ZRPC_RDMA_GID_INDEX"), -1, 65535,
                        &config.gid_index);
      !s.ok()) {
    return s;
  }
  return config;
}

absl::StatusOr<DeviceConfig> DeviceConfigFromEnv() {
  return ParseDeviceConfig([](const char* name) { return std::getenv(name); });
}

}  // namespace zrpc::transport
