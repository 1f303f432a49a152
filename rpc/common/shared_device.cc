// The process's shared RDMA devices, one per device configuration and slot options.

#include "rpc/common/shared_device.h"

#include <map>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"

namespace zrpc::internal {

absl::StatusOr<std::shared_ptr<transport::Device>> SharedDevice(
    const std::optional<transport::DeviceConfig>& config, const transport::SlotPoolOptions& slots) {
  transport::DeviceConfig chosen;
  if (config) {
    chosen = *config;
  } else if (absl::StatusOr<transport::DeviceConfig> env = transport::DeviceConfigFromEnv();
             env.ok()) {
    chosen = *env;
  } else if (env.status().code() != absl::StatusCode::kNotFound) {
    return env.status();  // set, but malformed: say so rather than pick another device
  }
  const std::string key =
      absl::StrCat(chosen.device, "|", chosen.port, "|", chosen.gid_index, "|", chosen.addr, "|",
                   slots.slot_size, "|", slots.slot_count, "|", slots.max_slots);
  static absl::Mutex mu(absl::kConstInit);
  static auto* devices = new std::map<std::string, std::weak_ptr<transport::Device>>();
  absl::MutexLock lock(&mu);
  if (std::shared_ptr<transport::Device> device = (*devices)[key].lock()) return device;
  absl::StatusOr<std::unique_ptr<transport::Device>> opened =
      transport::Device::Open(chosen, slots);
  if (!opened.ok()) return opened.status();
  std::shared_ptr<transport::Device> device = std::move(*opened);
  (*devices)[key] = device;
  return device;
}

}  // namespace zrpc::internal
