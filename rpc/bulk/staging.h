// StagingPool: registered buffers that bulk payloads from unregistered memory are copied into
// before the RDMA WRITE that sends them.
//
// Why a copy. An OutgoingBulk (rpc/bulk.h) is any bytes the caller has; the NIC reads only
// registered memory, and registering per call costs far more than copying (a system call, page
// pinning, an MR the NIC caches). So the runtime copies the payload once into a buffer it
// registered earlier, releases the caller's bytes at once (the caller may reuse them as soon as
// the call has started), and WRITEs from the copy. Payloads from memory the caller registered in
// advance (registered_memory.h) skip the copy; the pool counts the bytes of both kinds, so the
// stats show whether an application's fast path really is zero-copy.
//
// Layout. Buffers come in power-of-two size classes from 4 KiB; each is allocated and registered
// on first use and kept in its class's free list afterwards, so a steady workload registers
// nothing. The pool is bounded (max_bytes, counted as registered bytes): when a new buffer would
// pass the bound, free buffers of other classes are deregistered first; when all registered
// memory is in use the payload is refused with kResourceExhausted, which the caller sees as its
// call failing (back-pressure, not growth). A buffer is held from Acquire until the WRITE's
// completion (or its flush, when the connection fails), so the NIC never reads a buffer that has
// been handed to another payload.
//
// Threads: Acquire and Release are thread-safe (one mutex; they run once per bulk payload, next
// to a memcpy of the payload, so the lock is not what costs).
#ifndef ZRPC_RPC_BULK_STAGING_H_
#define ZRPC_RPC_BULK_STAGING_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "transport/device.h"
#include "transport/verbs_owners.h"

namespace zrpc::internal {

class StagingPool {
 public:
  struct Buffer {
    uint8_t* data;
    size_t capacity;
    uint32_t lkey;
    int size_class;
    // Whole pages, page-aligned: registration pins whole pages, so an unaligned 4 KiB buffer
    // pinned two.
    transport::PageBuffer memory;
    std::unique_ptr<transport::MemoryRegion> region;
  };

  static constexpr size_t kMinBuffer = 4096;

  // Registers memory on `device` (which must outlive the pool), at most `max_bytes` at once.
  StagingPool(transport::Device& device, size_t max_bytes);
  // Every buffer must have been released.
  ~StagingPool();
  StagingPool(const StagingPool&) = delete;
  StagingPool& operator=(const StagingPool&) = delete;

  // The capacity of the buffer Acquire(size) hands out: what a payload of `size` bytes holds.
  static size_t CapacityFor(size_t size) { return kMinBuffer << SizeClass(size); }

  // A registered buffer of at least `size` (> 0) bytes, held until Release.
  absl::StatusOr<Buffer*> Acquire(size_t size);
  void Release(Buffer* buffer);

  size_t registered_bytes() const;
  size_t in_use() const;

  // Payload bytes copied into staging, and payload bytes the NIC wrote straight from registered
  // application memory (counted when their WRITE completes), since the pool was made.
  void NoteStaged(size_t bytes) { staged_bytes_.fetch_add(bytes, std::memory_order_relaxed); }
  void NoteZeroCopy(size_t bytes) { zero_copy_bytes_.fetch_add(bytes, std::memory_order_relaxed); }
  uint64_t staged_bytes() const { return staged_bytes_.load(std::memory_order_relaxed); }
  uint64_t zero_copy_bytes() const { return zero_copy_bytes_.load(std::memory_order_relaxed); }

 private:
  static int SizeClass(size_t size);
  // Deregisters free buffers until `needed` more bytes fit under max_bytes_.
  void EvictLocked(size_t needed) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  transport::Device& device_;
  const size_t max_bytes_;
  mutable absl::Mutex mu_;
  std::vector<std::vector<std::unique_ptr<Buffer>>> free_ ABSL_GUARDED_BY(mu_);
  size_t registered_ ABSL_GUARDED_BY(mu_) = 0;
  size_t in_use_ ABSL_GUARDED_BY(mu_) = 0;
  std::atomic<uint64_t> staged_bytes_{0};
  std::atomic<uint64_t> zero_copy_bytes_{0};
};

}  // namespace zrpc::internal

#endif  // ZRPC_RPC_BULK_STAGING_H_
