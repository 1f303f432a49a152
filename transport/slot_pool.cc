#include "transport/slot_pool.h"

#include <algorithm>
#include <cerrno>
#include <new>
#include <utility>

#include "absl/strings/str_cat.h"
#include "transport/verbs_error.h"

namespace zrpc::transport {
namespace {
constexpr size_t kCacheLine = 64;
constexpr size_t kPage = 4096;  // AllocatePages' rounding; the registration covers whole pages
constexpr size_t kMaxSlotSize = size_t{1} << 30;
// Indices are 32-bit and UINT32_MAX means "no slot"; 2^31 keeps every index and chunk boundary
// below it with room to spare.
constexpr uint32_t kMaxSlots = uint32_t{1} << 31;
// One MR per chunk: NICs cache MR descriptors and bound their number, and the chunk table costs
// 16 bytes per entry. A configuration that needs more chunks wants bigger ones.
constexpr uint32_t kMaxChunks = uint32_t{1} << 16;
// A chunk is at most kMaxSlotSize * kMaxSlots = 2^61 bytes, so no size computation overflows.
static_assert(sizeof(size_t) >= 8, "chunk sizes are computed in size_t");

uint32_t Log2Ceil(uint32_t n) {
  uint32_t shift = 0;
  while ((uint64_t{1} << shift) < n) ++shift;
  return shift;
}
}  // namespace

absl::StatusOr<std::unique_ptr<SlotPool>> SlotPool::Create(ibv_pd* pd,
                                                           const SlotPoolOptions& options) {
  if (options.slot_size == 0 || options.slot_size > kMaxSlotSize) {
    return absl::InvalidArgumentError(
        absl::StrCat("SlotPoolOptions::slot_size ", options.slot_size, " is not in [1, 1 GiB]"));
  }
  if (options.max_slots == 0 || options.max_slots > kMaxSlots) {
    return absl::InvalidArgumentError(
        absl::StrCat("SlotPoolOptions::max_slots ", options.max_slots, " is not in [1, 2^31]"));
  }
  if (options.slot_count == 0 || options.slot_count > options.max_slots) {
    return absl::InvalidArgumentError(
        absl::StrCat("SlotPoolOptions::slot_count ", options.slot_count,
                     " is not in [1, max_slots = ", options.max_slots, "]"));
  }
  uint32_t shift = Log2Ceil(options.slot_count);  // slot_count <= 2^31, so shift <= 31
  uint64_t chunks = (uint64_t{options.max_slots} + (uint64_t{1} << shift) - 1) >> shift;
  if (chunks > kMaxChunks) {
    return absl::InvalidArgumentError(absl::StrCat(
        "SlotPoolOptions: max_slots ", options.max_slots, " in chunks of ", uint64_t{1} << shift,
        " slots is ", chunks, " chunks, more than ", kMaxChunks, "; raise slot_count"));
  }

  std::unique_ptr<SlotPool> pool(new SlotPool);
  pool->pd_ = pd;
  pool->slot_size_ = (options.slot_size + kCacheLine - 1) / kCacheLine * kCacheLine;
  pool->chunk_shift_ = shift;
  pool->chunk_mask_ = static_cast<uint32_t>((uint64_t{1} << shift) - 1);
  pool->max_slots_ = options.max_slots;
  // Sized for the cap, but default-initialized (in C++17, left untouched) except for the chunk
  // table: a chunk writes its own slots' entries when it is added, so the pages of entries for
  // chunks that never come are never touched.
  pool->chunks_.reset(new (std::nothrow) ChunkEntry[chunks]);
  pool->next_.reset(new (std::nothrow) std::atomic<uint32_t>[options.max_slots]);
  pool->in_use_.reset(new (std::nothrow) std::atomic<uint8_t>[options.max_slots]);
  if (pool->chunks_ == nullptr || pool->next_ == nullptr || pool->in_use_ == nullptr) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot allocate the bookkeeping of a ", options.max_slots, "-slot pool"));
  }

  std::lock_guard<std::mutex> lock(pool->grow_mu_);
  absl::StatusOr<uint32_t> first = pool->GrowLocked();
  if (!first.ok()) return first.status();
  // GrowLocked kept slot 0 for its caller; pushing it back puts it on top, so a fresh pool hands
  // out slots in address order.
  pool->in_use_[*first].store(0, std::memory_order_relaxed);
  pool->Push(*first, *first);
  return pool;
}

// The members tear down in reverse: owners_ deregisters each chunk's MR, then frees its memory.
SlotPool::~SlotPool() = default;

uint32_t SlotPool::Allocate() {
  uint32_t index = Pop();
  return index != kNoSlot ? index : AllocateSlow();
}

uint32_t SlotPool::Pop() {
  uint64_t head = head_.load(std::memory_order_acquire);
  for (;;) {
    uint32_t index = static_cast<uint32_t>(head);
    if (index == kEnd) return kNoSlot;
    // next_[index] may be stale if another thread pops `index` meanwhile; the generation in the
    // head then differs and the CAS below fails, so a stale value is never installed.
    uint32_t next = next_[index].load(std::memory_order_relaxed);
    uint64_t replacement = Pack(next, static_cast<uint32_t>(head >> 32) + 1);
    // Acquire: the slot's bytes from its last owner, and, for a slot of a chunk added by another
    // thread, that chunk's table entry and bookkeeping, happen-before what the new owner does.
    if (head_.compare_exchange_weak(head, replacement, std::memory_order_acquire,
                                    std::memory_order_acquire)) {
      in_use_[index].store(1, std::memory_order_relaxed);
      return index;
    }
  }
}

void SlotPool::Push(uint32_t top, uint32_t bottom) {
  uint64_t head = head_.load(std::memory_order_relaxed);
  for (;;) {
    next_[bottom].store(static_cast<uint32_t>(head), std::memory_order_relaxed);
    uint64_t replacement = Pack(top, static_cast<uint32_t>(head >> 32) + 1);
    // Release: pairs with Pop's acquire (see there). Later pushes and pops are read-modify-writes
    // of head_, so they continue this release sequence.
    if (head_.compare_exchange_weak(head, replacement, std::memory_order_release,
                                    std::memory_order_relaxed)) {
      return;
    }
  }
}

uint32_t SlotPool::AllocateSlow() {
  // Read before waiting: if the count moves while this thread waits, an attempt finished in the
  // meantime, and if it failed this thread takes that answer instead of repeating it.
  uint64_t attempts = growth_attempts_.load(std::memory_order_relaxed);
  std::lock_guard<std::mutex> lock(grow_mu_);
  // While this thread waited, another may have added a chunk or a slot may have been freed.
  uint32_t index = Pop();
  if (index != kNoSlot) return index;
  if (slot_count_.load(std::memory_order_relaxed) == max_slots_) return kNoSlot;
  if (last_growth_failed_ && growth_attempts_.load(std::memory_order_relaxed) != attempts) {
    return kNoSlot;
  }
  absl::StatusOr<uint32_t> grown = GrowLocked();
  return grown.ok() ? *grown : kNoSlot;
}

absl::StatusOr<uint32_t> SlotPool::GrowLocked() {
  // slot_count_ changes only here, under grow_mu_.
  uint32_t first = slot_count_.load(std::memory_order_relaxed);
  uint32_t chunk = first >> chunk_shift_;
  uint32_t count = std::min(chunk_mask_ + 1, max_slots_ - first);
  size_t bytes = (size_t{count} * slot_size_ + kPage - 1) / kPage * kPage;

  auto fail = [&](absl::Status status) -> absl::StatusOr<uint32_t> {
    growth_error_ = status;
    last_growth_failed_ = true;
    growth_attempts_.fetch_add(1, std::memory_order_relaxed);
    return status;
  };
  ChunkOwner owner;
  owner.memory = AllocatePages(bytes);
  if (owner.memory == nullptr) {
    return fail(absl::ResourceExhaustedError(
        absl::StrCat("cannot allocate slot pool chunk ", chunk, " (", bytes, " bytes)")));
  }
  if (pd_ != nullptr) {
    owner.mr.reset(ibv_reg_mr(pd_, owner.memory.get(), bytes, IBV_ACCESS_LOCAL_WRITE));
    if (owner.mr == nullptr) {
      return fail(VerbsError(
          absl::StrCat("ibv_reg_mr(slot pool chunk ", chunk, ", ", bytes, " bytes)"), errno));
    }
  }

  // Publish in order: bookkeeping and table entry, then slot_count_ (Free's range check), then
  // the slots themselves (Push's release CAS). The first slot goes to the caller directly.
  uint32_t end = first + count;
  for (uint32_t i = first; i < end; ++i) {
    next_[i].store(i + 1 < end ? i + 1 : kEnd, std::memory_order_relaxed);
    in_use_[i].store(0, std::memory_order_relaxed);
  }
  in_use_[first].store(1, std::memory_order_relaxed);
  chunks_[chunk].base.store(owner.memory.get(), std::memory_order_relaxed);
  chunks_[chunk].lkey.store(owner.mr != nullptr ? owner.mr->lkey : 0, std::memory_order_relaxed);
  owners_.push_back(std::move(owner));
  registered_bytes_.fetch_add(bytes, std::memory_order_relaxed);
  slot_count_.store(end, std::memory_order_release);
  if (count > 1) Push(first + 1, end - 1);
  last_growth_failed_ = false;
  growth_attempts_.fetch_add(1, std::memory_order_relaxed);
  return first;
}

absl::Status SlotPool::Free(uint32_t index) {
  absl::Status marked = MarkFree(index, /*shared=*/true);
  if (marked.ok()) Push(index, index);
  return marked;
}

absl::Status SlotPool::MarkFree(uint32_t index, bool shared) {
  uint32_t count = slot_count();
  if (index >= count) {
    return absl::FailedPreconditionError(
        absl::StrCat("freeing slot ", index, " of a pool of ", count, " slots"));
  }
  // Shared: another thread may be freeing the same slot (a double free), and only one exchange
  // sees the 1. For a cache, a load and a store: no atomic instruction on its hot path.
  const bool was_in_use = shared ? in_use_[index].exchange(0, std::memory_order_relaxed) == 1
                                 : in_use_[index].load(std::memory_order_relaxed) == 1;
  if (!was_in_use) {
    return absl::FailedPreconditionError(
        absl::StrCat("freeing slot ", index, ", which is not allocated (freed twice?)"));
  }
  if (!shared) in_use_[index].store(0, std::memory_order_relaxed);
  return absl::OkStatus();
}

void SlotCache::Flush() {
  // Linked into one chain and pushed with one compare-and-swap.
  if (count_ == 0) return;
  for (uint32_t i = 0; i + 1 < count_; ++i) {
    pool_.next_[slots_[i]].store(slots_[i + 1], std::memory_order_relaxed);
  }
  pool_.Push(slots_[0], slots_[count_ - 1]);
  count_ = 0;
}

uint32_t SlotPool::available() const {
  uint32_t count = slot_count();
  uint32_t free = 0;
  for (uint32_t i = 0; i < count; ++i) free += in_use_[i].load(std::memory_order_relaxed) == 0;
  return free;
}

absl::Status SlotPool::growth_error() const {
  std::lock_guard<std::mutex> lock(grow_mu_);
  return growth_error_;
}

absl::Status SlotPool::ExhaustedError(const std::string& for_what) const {
  uint32_t count = slot_count();
  if (count < max_slots_) {
    absl::Status why = growth_error();
    return absl::ResourceExhaustedError(
        absl::StrCat("no free slot ", for_what, ": all ", count,
                     " slots are in use and adding more failed: ", why.message()));
  }
  return absl::ResourceExhaustedError(
      absl::StrCat("no free slot ", for_what, ": all ", count, " slots of ", slot_size_,
                   " bytes are in use (SlotPoolOptions::max_slots)"));
}

uint32_t SlotPool::IndexOf(const void* p) const {
  auto* byte = static_cast<const uint8_t*>(p);
  uint32_t count = slot_count();  // acquire: the entries of chunks below count are written
  uint32_t chunks = static_cast<uint32_t>((uint64_t{count} + chunk_mask_) >> chunk_shift_);
  for (uint32_t chunk = 0; chunk < chunks; ++chunk) {
    const uint8_t* base = chunks_[chunk].base.load(std::memory_order_relaxed);
    uint32_t first = chunk << chunk_shift_;
    uint32_t slots = std::min(chunk_mask_ + 1, count - first);
    if (byte >= base && byte < base + size_t{slots} * slot_size_) {
      return first + static_cast<uint32_t>(static_cast<size_t>(byte - base) / slot_size_);
    }
  }
  return kNoSlot;
}

}  // namespace zrpc::transport
