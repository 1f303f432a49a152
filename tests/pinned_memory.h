// What the kernel pinned for this process's memory registrations (VmPin), for tests that hold
// registered memory to what it was before a load: a leak of regions or arenas shows here. And the
// file descriptors it holds, for tests of what thousands of connections cost.
#ifndef ZRPC_TESTS_PINNED_MEMORY_H_
#define ZRPC_TESTS_PINNED_MEMORY_H_

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <system_error>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"

namespace zrpc::testing {

// Kilobytes pinned now, or -1 when /proc/self/status has no VmPin line.
inline int64_t PinnedKb() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmPin:", 0) == 0) {
      int64_t kb = -1;
      // "VmPin:      1234 kB"
      if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(line.substr(6, line.size() - 6 - 3)), &kb)) {
        return -1;
      }
      return kb;
    }
  }
  return -1;
}

// File descriptors this process has open now.
inline int OpenFileDescriptors() {
  std::error_code error;
  int count = 0;
  for (auto it = std::filesystem::directory_iterator("/proc/self/fd", error);
       !error && it != std::filesystem::directory_iterator(); it.increment(error)) {
    ++count;
  }
  return count;
}

}  // namespace zrpc::testing

#endif  // ZRPC_TESTS_PINNED_MEMORY_H_
