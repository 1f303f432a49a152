// A device's own counters, for a test to say what the NIC saw when a transfer misbehaved.
//
// rxe (and mlx5, among others) publish per-port hardware counters in sysfs: retransmissions,
// duplicate requests, sequence errors. A test that finds a transfer slower than it should be,
// or a connection lost, prints what changed across it, so that a failure in CI says whether
// the device retried (a fault below zrpc) or never saw the work (a fault in zrpc).
#ifndef ZRPC_TESTS_DEVICE_COUNTERS_H_
#define ZRPC_TESTS_DEVICE_COUNTERS_H_

#include <dirent.h>

#include <cstdint>
#include <fstream>
#include <map>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "transport/device_config.h"

namespace zrpc::testing {

// Every counter of the configured device's port (of each device, when the configuration names
// none), keyed "device/counter". Empty where sysfs has no counters.
inline std::map<std::string, uint64_t> ReadDeviceCounters(const transport::DeviceConfig& config) {
  std::map<std::string, uint64_t> counters;
  const std::string root = "/sys/class/infiniband";
  auto read_device = [&](const std::string& device) {
    const std::string dir = absl::StrCat(root, "/", device, "/ports/", config.port, "/hw_counters");
    DIR* listing = opendir(dir.c_str());
    if (listing == nullptr) return;
    while (const dirent* entry = readdir(listing)) {
      const std::string name = entry->d_name;
      if (name.empty() || name[0] == '.') continue;
      std::ifstream file(absl::StrCat(dir, "/", name));
      std::string text;
      uint64_t value = 0;
      if (std::getline(file, text) && absl::SimpleAtoi(text, &value)) {
        counters[absl::StrCat(device, "/", name)] = value;
      }
    }
    closedir(listing);
  };
  if (!config.device.empty()) {
    read_device(config.device);
    return counters;
  }
  if (DIR* devices = opendir(root.c_str())) {
    while (const dirent* entry = readdir(devices)) {
      if (entry->d_name[0] != '.') read_device(entry->d_name);
    }
    closedir(devices);
  }
  return counters;
}

// The counters that moved between two readings, "name +delta" each; "none moved" if none did,
// and "no counters readable" when neither reading found any (no sysfs, or a driver without
// hw_counters), which says nothing about what the device did.
inline std::string DeviceCounterChanges(const std::map<std::string, uint64_t>& before,
                                        const std::map<std::string, uint64_t>& after) {
  if (before.empty() && after.empty()) return "no counters readable";
  std::string changes;
  for (const auto& [name, value] : after) {
    auto it = before.find(name);
    const uint64_t was = it == before.end() ? 0 : it->second;
    if (value == was) continue;
    absl::StrAppend(&changes, changes.empty() ? "" : ", ", name, " ", value > was ? "+" : "-",
                    value > was ? value - was : was - value);
  }
  return changes.empty() ? "none moved" : changes;
}

}  // namespace zrpc::testing

#endif  // ZRPC_TESTS_DEVICE_COUNTERS_H_
