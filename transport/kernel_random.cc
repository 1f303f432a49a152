#include "transport/kernel_random.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstring>

namespace zrpc::transport {
namespace {

class Block {
 public:
  void Take(uint8_t* out, size_t size) {
    while (size > 0) {
      if (next_ == kSize) Refill();
      const size_t n = std::min(size, kSize - next_);
      std::memcpy(out, block_ + next_, n);
      next_ += n;
      out += n;
      size -= n;
    }
  }

 private:
  static constexpr size_t kSize = 64;
  void Refill() {
    size_t got = 0;
    while (got < kSize) {
      const ssize_t n = getrandom(block_ + got, kSize - got, 0);
      if (n > 0) {
        got += static_cast<size_t>(n);
      } else if (n < 0 && errno == EINTR) {
        continue;
      } else {
        break;  // refused (a sandbox's seccomp profile): the fallbacks below
      }
    }
    if (got < kSize) got += ReadUrandom(block_ + got, kSize - got);
    // Neither source answered: a mix of the clock and a counter, so values still differ from
    // each other (a door's token loops until it is nonzero; a key byte until it differs), though
    // a peer could now guess them. Never the same stale bytes again, never a hang.
    if (got < kSize) MixClock(block_ + got, kSize - got);
    next_ = 0;
  }
  static size_t ReadUrandom(uint8_t* out, size_t size) {
    const int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    size_t got = 0;
    while (got < size) {
      const ssize_t n = read(fd, out + got, size - got);
      if (n > 0) {
        got += static_cast<size_t>(n);
      } else if (!(n < 0 && errno == EINTR)) {
        break;
      }
    }
    close(fd);
    return got;
  }
  static void MixClock(uint8_t* out, size_t size) {
    static std::atomic<uint64_t> counter{0};
    timespec now{};
    clock_gettime(CLOCK_MONOTONIC, &now);
    uint64_t state = (uint64_t(now.tv_sec) * 1'000'000'000 + uint64_t(now.tv_nsec)) ^
                     (counter.fetch_add(1, std::memory_order_relaxed) * 0x9e3779b97f4a7c15ull);
    for (size_t i = 0; i < size; i += 8) {
      uint64_t z = (state += 0x9e3779b97f4a7c15ull);  // splitmix64
      z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
      z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
      z ^= z >> 31;
      std::memcpy(out + i, &z, std::min<size_t>(8, size - i));
    }
  }
  uint8_t block_[kSize] = {};
  size_t next_ = kSize;
};

thread_local Block block;

}  // namespace

void KernelRandomBytes(void* out, size_t size) { block.Take(static_cast<uint8_t*>(out), size); }

uint8_t KernelRandomByte() {
  uint8_t byte;
  KernelRandomBytes(&byte, 1);
  return byte;
}

uint64_t KernelRandom64() {
  uint64_t value;
  KernelRandomBytes(&value, sizeof(value));
  return value;
}

}  // namespace zrpc::transport
