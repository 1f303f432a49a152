#include "transport/process_limits.h"

#include <sys/resource.h>

#include <cstdint>
#include <fstream>
#include <limits>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace zrpc::transport {
namespace {

constexpr int kCapIpcLock = 14;  // linux/capability.h
constexpr uint64_t kPage = 4096;

uint64_t RoundUp(uint64_t n, uint64_t to) { return (n + to - 1) / to * to; }

std::string Mebibytes(uint64_t bytes) {
  return absl::StrCat((bytes + (1 << 20) - 1) >> 20, " MiB");
}

}  // namespace

// Reads /proc/self/status: whether CAP_IPC_LOCK is effective, and VmPin in bytes (what
// ib_umem_get holds against RLIMIT_MEMLOCK; mlock's VmLck is counted apart).
void ReadStatus(bool* capable, uint64_t* pinned) {
  *capable = false;
  uint64_t kib_total = 0;
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);) {
    absl::string_view rest = line;
    if (absl::ConsumePrefix(&rest, "CapEff:")) {
      uint64_t caps = 0;
      if (absl::SimpleHexAtoi(absl::StripAsciiWhitespace(rest), &caps)) {
        *capable = (caps >> kCapIpcLock) & 1;
      }
    } else if (absl::ConsumePrefix(&rest, "VmPin:")) {
      // "   1234 kB"
      uint64_t kib = 0;
      if (absl::SimpleAtoi(absl::StripSuffix(absl::StripAsciiWhitespace(rest), " kB"), &kib)) {
        kib_total += kib;
      }
    }
  }
  *pinned = kib_total * 1024;
}

LockedMemory ReadLockedMemory() {
  LockedMemory memory;
  rlimit limit{};
  if (getrlimit(RLIMIT_MEMLOCK, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY) return memory;
  bool capable = false;
  uint64_t pinned = 0;
  ReadStatus(&capable, &pinned);
  if (capable) return memory;
  memory.unlimited = false;
  memory.limit = limit.rlim_cur;
  memory.locked = pinned;
  return memory;
}

uint64_t PinnedBytes() {
  bool capable = false;
  uint64_t pinned = 0;
  ReadStatus(&capable, &pinned);
  return pinned;
}

uint64_t RegisteredPerIdleConnection(const ConnectionOptions& options, bool shared_receives,
                                     uint64_t slot_size) {
  const uint64_t slots = 1 + (shared_receives ? 0 : options.recv_credits);
  // An arena lent on demand is a piece of the poller's pool, counted with the pool.
  const uint64_t arena = options.arena_on_demand ? 0 : RoundUp(options.arena_size, kPage);
  return arena + slots * slot_size;
}

uint64_t ConnectionsWithin(const LockedMemory& memory, uint64_t per_connection) {
  if (memory.unlimited || per_connection == 0) return std::numeric_limits<uint64_t>::max();
  if (memory.limit <= memory.locked) return 0;
  return (memory.limit - memory.locked) / per_connection;
}

std::string RaiseLockedMemoryAdvice(const LockedMemory& memory, uint64_t per_connection,
                                    uint64_t wanted) {
  const uint64_t needed = memory.locked + per_connection * wanted;
  return absl::StrCat("RLIMIT_MEMLOCK is ", Mebibytes(memory.limit), " with ",
                      Mebibytes(memory.locked),
                      " locked already, and an idle connection registers ", per_connection >> 10,
                      " KiB: it holds ", ConnectionsWithin(memory, per_connection),
                      " connections. For ", wanted, " set it to at least ", Mebibytes(needed),
                      " (ulimit -l; LimitMEMLOCK= in a systemd unit; memlock in "
                      "/etc/security/limits.conf), or unlimited, or grant CAP_IPC_LOCK");
}

}  // namespace zrpc::transport
