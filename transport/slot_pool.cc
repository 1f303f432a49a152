#include "transport/slot_pool.h"

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "transport/verbs_error.h"

namespace zrpc::transport {
namespace {
constexpr size_t kCacheLine = 64;
}  // namespace

absl::StatusOr<std::unique_ptr<SlotPool>> SlotPool::Create(ibv_pd* pd,
                                                           const SlotPoolOptions& options) {
  if (options.slot_size == 0 || options.slot_size > (size_t{1} << 30)) {
    return absl::InvalidArgumentError(
        absl::StrCat("slot_size ", options.slot_size, " is not in [1, 1 GiB]"));
  }
  if (options.slot_count == 0 || options.slot_count == kEnd) {
    return absl::InvalidArgumentError(absl::StrCat("slot_count ", options.slot_count, " is invalid"));
  }
  std::unique_ptr<SlotPool> pool(new SlotPool);
  pool->slot_size_ = (options.slot_size + kCacheLine - 1) / kCacheLine * kCacheLine;
  pool->slot_count_ = options.slot_count;
  size_t bytes = pool->slot_size_ * options.slot_count;
  pool->memory_ = AllocatePages(bytes);
  if (pool->memory_ == nullptr) {
    return absl::ResourceExhaustedError(absl::StrCat("cannot allocate a ", bytes, "-byte slot pool"));
  }
  pool->base_ = pool->memory_.get();
  if (pd != nullptr) {
    pool->mr_.reset(ibv_reg_mr(pd, pool->base_, bytes, IBV_ACCESS_LOCAL_WRITE));
    if (pool->mr_ == nullptr) {
      return VerbsError(absl::StrCat("ibv_reg_mr(slot pool, ", bytes, " bytes)"), errno);
    }
  }
  pool->next_.reset(new std::atomic<uint32_t>[options.slot_count]);
  pool->in_use_.reset(new std::atomic<uint8_t>[options.slot_count]);
  // Slot 0 on top, so a fresh pool hands out slots in address order.
  for (uint32_t i = 0; i < options.slot_count; ++i) {
    pool->next_[i].store(i + 1 < options.slot_count ? i + 1 : kEnd, std::memory_order_relaxed);
    pool->in_use_[i].store(0, std::memory_order_relaxed);
  }
  pool->head_.store(Pack(0, 0), std::memory_order_release);
  return pool;
}

SlotPool::~SlotPool() = default;  // mr_ is declared after memory_: deregistered first

uint32_t SlotPool::Allocate() {
  uint64_t head = head_.load(std::memory_order_acquire);
  for (;;) {
    uint32_t index = static_cast<uint32_t>(head);
    if (index == kEnd) return kNoSlot;
    // next_[index] may be stale if another thread pops `index` meanwhile; the generation in the
    // head then differs and the CAS below fails, so a stale value is never installed.
    uint32_t next = next_[index].load(std::memory_order_relaxed);
    uint64_t replacement = Pack(next, static_cast<uint32_t>(head >> 32) + 1);
    if (head_.compare_exchange_weak(head, replacement, std::memory_order_acquire,
                                    std::memory_order_acquire)) {
      in_use_[index].store(1, std::memory_order_relaxed);
      return index;
    }
  }
}

absl::Status SlotPool::Free(uint32_t index) {
  if (index >= slot_count_) {
    return absl::FailedPreconditionError(
        absl::StrCat("freeing slot ", index, " of a ", slot_count_, "-slot pool"));
  }
  if (in_use_[index].exchange(0, std::memory_order_relaxed) != 1) {
    return absl::FailedPreconditionError(absl::StrCat("slot ", index, " freed twice"));
  }
  uint64_t head = head_.load(std::memory_order_relaxed);
  for (;;) {
    next_[index].store(static_cast<uint32_t>(head), std::memory_order_relaxed);
    uint64_t replacement = Pack(index, static_cast<uint32_t>(head >> 32) + 1);
    // Release: whatever the freeing thread wrote into the slot happens-before its next owner.
    if (head_.compare_exchange_weak(head, replacement, std::memory_order_release,
                                    std::memory_order_relaxed)) {
      return absl::OkStatus();
    }
  }
}

uint32_t SlotPool::available() const {
  uint32_t free = 0;
  for (uint32_t i = 0; i < slot_count_; ++i) free += in_use_[i].load(std::memory_order_relaxed) == 0;
  return free;
}

uint32_t SlotPool::IndexOf(const void* p) const {
  auto* byte = static_cast<const uint8_t*>(p);
  if (byte < base_ || byte >= base_ + slot_size_ * slot_count_) return kNoSlot;
  return static_cast<uint32_t>(static_cast<size_t>(byte - base_) / slot_size_);
}

}  // namespace zrpc::transport
