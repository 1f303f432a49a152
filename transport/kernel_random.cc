#include "transport/kernel_random.h"

#include <errno.h>
#include <sys/random.h>

#include <algorithm>
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
      } else if (n < 0 && errno != EINTR) {
        break;  // no kernel source (never on Linux >= 3.17): what the block held stays
      }
    }
    next_ = 0;
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
