// The device port's hardware counters (sysfs hw_counters): how a test sees what the NIC did,
// receiver-not-ready NAKs above all.
#ifndef ZRPC_TESTS_TRANSPORT_PORT_COUNTERS_H_
#define ZRPC_TESTS_TRANSPORT_PORT_COUNTERS_H_

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>

#include "absl/strings/str_cat.h"
#include "transport/device.h"

namespace zrpc::testing {

// A counter of the device's port; -1 if the device has none.
inline int64_t PortCounter(const transport::DeviceSelection& sel, const std::string& name) {
  std::ifstream in(absl::StrCat("/sys/class/infiniband/", sel.device, "/ports/", sel.port,
                                "/hw_counters/", name));
  int64_t value = -1;
  if (!(in >> value)) return -1;
  return value;
}

// Every counter of the device's port, by name (empty if the device has none in sysfs).
inline std::map<std::string, int64_t> PortCounters(const transport::DeviceSelection& sel) {
  std::map<std::string, int64_t> counters;
  std::error_code error;
  const std::string dir =
      absl::StrCat("/sys/class/infiniband/", sel.device, "/ports/", sel.port, "/hw_counters");
  for (const auto& entry : std::filesystem::directory_iterator(dir, error)) {
    const std::string name = entry.path().filename();
    if (int64_t value = PortCounter(sel, name); value >= 0) counters[name] = value;
  }
  return counters;
}

// The counters that moved since `before`, for a failure's report: a transfer the device never
// completes shows here whether the NIC retried, saw sequence errors or dropped packets.
inline std::string MovedCounters(const transport::DeviceSelection& sel,
                                 const std::map<std::string, int64_t>& before) {
  std::string moved;
  for (const auto& [name, value] : PortCounters(sel)) {
    auto it = before.find(name);
    const int64_t was = it == before.end() ? 0 : it->second;
    if (value != was) absl::StrAppend(&moved, moved.empty() ? "" : ", ", name, " +", value - was);
  }
  return moved.empty() ? "no port counter moved" : moved;
}

}  // namespace zrpc::testing

#endif  // ZRPC_TESTS_TRANSPORT_PORT_COUNTERS_H_
