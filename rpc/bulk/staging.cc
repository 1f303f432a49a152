// StagingPool: the registered buffers unregistered bulk payloads are copied into before they are
// sent.

#include "rpc/bulk/staging.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "transport/log.h"

namespace zrpc::internal {

StagingPool::StagingPool(transport::Device& device, size_t max_bytes)
    : device_(device), max_bytes_(max_bytes) {}

StagingPool::~StagingPool() {
  absl::MutexLock lock(&mu_);
  if (in_use_ != 0) {
    // Their WRITEs can no longer complete (the connections are gone before the pool), so this is
    // a runtime bug; the memory is leaked rather than freed under a NIC that might read it.
    ZRPC_LOG(kError, "runtime", in_use_, " staging buffers still held at shutdown; leaking them");
  }
}

int StagingPool::SizeClass(size_t size) {
  int size_class = 0;
  for (size_t capacity = kMinBuffer; capacity < size; capacity <<= 1) ++size_class;
  return size_class;
}

absl::StatusOr<StagingPool::Buffer*> StagingPool::Acquire(size_t size) {
  const int size_class = SizeClass(size);
  const size_t capacity = kMinBuffer << size_class;
  {
    absl::MutexLock lock(&mu_);
    if (static_cast<size_t>(size_class) < free_.size() && !free_[size_class].empty()) {
      Buffer* buffer = free_[size_class].back().release();
      free_[size_class].pop_back();
      ++in_use_;
      return buffer;
    }
    EvictLocked(capacity);
    if (registered_ + capacity > max_bytes_) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "no registered memory to stage a ", size, "-byte bulk payload: ", registered_, " of ",
          max_bytes_, " staging bytes are in use by payloads in flight"));
    }
    registered_ += capacity;  // reserved now, registered below without the lock
    ++in_use_;
  }
  auto buffer = std::make_unique<Buffer>();
  buffer->memory = transport::AllocatePages(capacity);
  absl::StatusOr<std::unique_ptr<transport::MemoryRegion>> region =
      buffer->memory ? device_.RegisterMemory(buffer->memory.get(), capacity)
                     : absl::ResourceExhaustedError("out of memory");
  if (!region.ok()) {
    absl::MutexLock lock(&mu_);
    registered_ -= capacity;
    --in_use_;
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot stage a ", size, "-byte bulk payload: ", region.status().message()));
  }
  buffer->region = std::move(*region);
  buffer->data = buffer->memory.get();
  buffer->capacity = capacity;
  buffer->lkey = buffer->region->lkey();
  buffer->size_class = size_class;
  return buffer.release();
}

void StagingPool::Release(Buffer* buffer) {
  absl::MutexLock lock(&mu_);
  --in_use_;
  if (free_.size() <= static_cast<size_t>(buffer->size_class)) free_.resize(buffer->size_class + 1);
  free_[buffer->size_class].emplace_back(buffer);
}

void StagingPool::EvictLocked(size_t needed) {
  for (auto it = free_.rbegin(); it != free_.rend() && registered_ + needed > max_bytes_; ++it) {
    while (!it->empty() && registered_ + needed > max_bytes_) {
      registered_ -= it->back()->capacity;
      it->pop_back();
    }
  }
}

size_t StagingPool::registered_bytes() const {
  absl::MutexLock lock(&mu_);
  return registered_;
}

size_t StagingPool::in_use() const {
  absl::MutexLock lock(&mu_);
  return in_use_;
}

}  // namespace zrpc::internal
