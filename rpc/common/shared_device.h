// The RDMA device a process's servers and channels share.
//
// A Device holds a protection domain and a registered slot pool: one per process and device is
// enough, and every server or channel opening its own would multiply registered memory. So the
// runtime opens each device once, on first use, and closes it when the last server or channel
// using it is gone.
#ifndef ZRPC_RPC_COMMON_SHARED_DEVICE_H_
#define ZRPC_RPC_COMMON_SHARED_DEVICE_H_

#include <memory>
#include <optional>

#include "absl/status/statusor.h"
#include "transport/device.h"
#include "transport/device_config.h"

namespace zrpc::internal {

// The device `config` selects, or with none, the one the environment names (ZRPC_RDMA_*), or
// the first active one, with a slot pool of `slots`. Users asking for the same device with other
// slot options get a Device of their own (its own protection domain and pool). Thread-safe.
absl::StatusOr<std::shared_ptr<transport::Device>> SharedDevice(
    const std::optional<transport::DeviceConfig>& config, const transport::SlotPoolOptions& slots);

}  // namespace zrpc::internal

#endif  // ZRPC_RPC_COMMON_SHARED_DEVICE_H_
