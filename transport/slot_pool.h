// SlotPool: pre-registered, fixed-size buffers for small messages.
//
// Why slots. Registering memory (ibv_reg_mr) pins pages and costs tens of microseconds to
// milliseconds; doing it per message would dwarf the message. So a pool registers one region
// once, as one memory region (one MR, one lkey), and cuts it into `slot_count` slots of
// `slot_size` bytes. Every small message zrpc sends is built in a slot (the generated stubs
// serialize straight into one), and every RECV zrpc posts points at a slot, so a received
// message is read in place. Because all slots share one lkey, finding the key of a buffer is a
// field read, not a search over regions (brpc's linear lkey lookup over up to 16 regions bit its
// users; see ../shared/notes/rdma-pitfalls.md).
//
// Sizing. The region is slot_count * slot_size bytes, rounded up to whole pages, allocated and
// registered at Create; it never grows, so a pool that runs dry reports it (Allocate returns
// kNoSlot) instead of registering more behind the caller's back. Non-root processes are limited
// by RLIMIT_MEMLOCK (often 8 MiB): the default pool (4 MiB) fits; a bigger one may need the limit
// raised, and Create says so when registration fails.
//
// Allocation. The free slots form a stack threaded through an index array (a Treiber stack):
// Allocate and Free are one compare-and-swap each, O(1), and take no lock, so any thread may
// allocate or free without a global mutex on the hot path. The stack head packs a 32-bit slot
// index with a 32-bit generation that every successful pop and push increments, so a slot that
// is popped and pushed back between another thread's read and its CAS (the ABA problem) cannot
// corrupt the stack. Contended use still bounces one cache line between cores; per-thread caches
// in front of the shared stack are the next step if a benchmark shows it.
//
// Ownership. A slot index belongs to exactly one owner between Allocate and Free: the caller
// building a message, then the connection while the SEND is in flight, or the connection while a
// RECV is posted, then the handler reading it. Free checks that the slot was allocated, so a
// double free is reported instead of silently corrupting the stack.
//
// Lifetime. The pool must outlive every connection that posts its slots (Device owns it).
// Memory is registered LOCAL_WRITE only: slots are sources of SENDs and WRITEs and targets of
// RECVs, never exposed to a peer's RDMA WRITE or READ.
#ifndef ZRPC_TRANSPORT_SLOT_POOL_H_
#define ZRPC_TRANSPORT_SLOT_POOL_H_

#include <infiniband/verbs.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "transport/verbs_owners.h"

namespace zrpc::transport {

struct SlotPoolOptions {
  // Bytes per slot, rounded up to a multiple of 64 (a cache line). It bounds the largest SEND
  // (frame header included) the transport accepts and is what each posted RECV holds.
  size_t slot_size = 4096;
  // Slots in the pool: RECVs posted by every connection plus messages being built or in flight.
  uint32_t slot_count = 1024;
};

class SlotPool {
 public:
  static constexpr uint32_t kNoSlot = UINT32_MAX;

  // Allocates the slots and registers them with `pd`. With a null `pd` the memory is not
  // registered (lkey() is 0): for tests without a device, and for transports without RDMA.
  static absl::StatusOr<std::unique_ptr<SlotPool>> Create(ibv_pd* pd,
                                                          const SlotPoolOptions& options);
  SlotPool(const SlotPool&) = delete;
  SlotPool& operator=(const SlotPool&) = delete;
  ~SlotPool();

  // A free slot's index, or kNoSlot when all are in use. Lock-free; any thread.
  uint32_t Allocate();
  // Returns slot `index` to the pool. FailedPrecondition if it is out of range or not allocated
  // (a double free); the pool is left unchanged then. Lock-free; any thread.
  absl::Status Free(uint32_t index);

  uint8_t* data(uint32_t index) const { return base_ + size_t{index} * slot_size_; }
  // The slot that contains `p`, or kNoSlot if `p` is outside the pool.
  uint32_t IndexOf(const void* p) const;
  size_t slot_size() const { return slot_size_; }
  uint32_t slot_count() const { return slot_count_; }
  uint32_t lkey() const { return mr_ != nullptr ? mr_->lkey : 0; }
  // Slots not allocated right now, counted (O(slot_count): for diagnostics and tests, not the hot
  // path; exact when no other thread is allocating or freeing).
  uint32_t available() const;

 private:
  SlotPool() = default;

  static constexpr uint32_t kEnd = UINT32_MAX;  // end of the free stack
  static uint64_t Pack(uint32_t index, uint32_t generation) {
    return uint64_t{generation} << 32 | index;
  }

  PageBuffer memory_;
  uint8_t* base_ = nullptr;
  size_t slot_size_ = 0;
  uint32_t slot_count_ = 0;
  MrOwner mr_;
  // next_[i]: the slot below i on the free stack. in_use_[i]: 1 between Allocate and Free.
  std::unique_ptr<std::atomic<uint32_t>[]> next_;
  std::unique_ptr<std::atomic<uint8_t>[]> in_use_;
  alignas(64) std::atomic<uint64_t> head_{0};
};

}  // namespace zrpc::transport

#endif  // ZRPC_TRANSPORT_SLOT_POOL_H_
