// CallTable: a client connection's calls in flight, by id (with generations) and by deadline.

#include "rpc/client/call_table.h"

#include <algorithm>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace zrpc::internal {
namespace {

// Below this many entries the heap is never rebuilt: rebuilding a small heap saves nothing.
constexpr size_t kMinCompactSize = 64;

// std::*_heap build a max-heap; ordering by "later first" puts the earliest deadline on top.
struct Later {
  template <typename Entry>
  bool operator()(const Entry& a, const Entry& b) const {
    return a.deadline != b.deadline ? a.deadline > b.deadline : a.id > b.id;
  }
};

}  // namespace

CallIndex::CallIndex(uint32_t capacity, uint64_t first_generation)
    : capacity_(std::clamp<uint32_t>(capacity, 1, kMaxCapacity)),
      first_generation_(std::clamp<uint64_t>(first_generation, 1, kMaxGeneration)) {}

bool CallIndex::Live(uint64_t id) const {
  const uint32_t index = IndexOf(id);
  return index < slots_.size() && slots_[index].live && IdOf(index) == id;
}

absl::StatusOr<uint64_t> CallIndex::Acquire(absl::Time deadline) {
  if (live_ >= capacity_) {
    return absl::ResourceExhaustedError(
        absl::StrCat(live_, " calls in flight, the most this channel allows"));
  }
  uint32_t index;
  if (!free_.empty()) {
    index = free_.back();
    free_.pop_back();
  } else {
    // live_ < capacity_ and no free slot: fewer than capacity_ slots exist.
    index = static_cast<uint32_t>(slots_.size());
    slots_.push_back(Slot{first_generation_, false, false});
  }
  Slot& slot = slots_[index];
  slot.live = true;
  slot.in_heap = deadline != absl::InfiniteFuture();
  ++live_;
  const uint64_t id = IdOf(index);
  if (slot.in_heap) {
    ++live_in_heap_;
    MaybeCompact();
    heap_.push_back(HeapEntry{deadline, id});
    std::push_heap(heap_.begin(), heap_.end(), Later());
  }
  return id;
}

std::optional<uint32_t> CallIndex::Release(uint64_t id) {
  if (!Live(id)) return std::nullopt;
  const uint32_t index = IndexOf(id);
  Free(index);  // its heap entry, if any, is now dead: skipped or compacted away later
  return index;
}

void CallIndex::Free(uint32_t index) {
  Slot& slot = slots_[index];
  slot.live = false;
  if (slot.in_heap) --live_in_heap_;
  slot.in_heap = false;
  // The old id is stale from here on. Skipping 0 on wrap keeps 0 from ever being an id.
  slot.generation = slot.generation == kMaxGeneration ? 1 : slot.generation + 1;
  free_.push_back(index);
  --live_;
}

void CallIndex::PopHeap() {
  std::pop_heap(heap_.begin(), heap_.end(), Later());
  heap_.pop_back();
}

void CallIndex::ReleaseExpired(absl::Time now, std::vector<uint64_t>& ids) {
  while (!heap_.empty() && heap_.front().deadline <= now) {
    const uint64_t id = heap_.front().id;
    PopHeap();
    if (!Live(id)) continue;  // ended before its deadline: a dead entry
    Free(IndexOf(id));
    ids.push_back(id);
  }
}

void CallIndex::ReleaseAll(std::vector<uint64_t>& ids) {
  for (uint32_t index = 0; index < slots_.size(); ++index) {
    if (!slots_[index].live) continue;
    ids.push_back(IdOf(index));
    Free(index);
  }
  heap_.clear();
}

absl::Time CallIndex::NextDeadline() {
  while (!heap_.empty() && !Live(heap_.front().id)) PopHeap();
  return heap_.empty() ? absl::InfiniteFuture() : heap_.front().deadline;
}

void CallIndex::MaybeCompact() {
  // Dead entries are at most half the heap afterwards, so the heap stays under about twice the
  // calls in flight, and each rebuild (O(n)) follows at least n/2 releases: amortized O(1).
  if (heap_.size() < kMinCompactSize || heap_.size() < 2 * live_in_heap_) return;
  heap_.erase(std::remove_if(heap_.begin(), heap_.end(),
                             [this](const HeapEntry& e) { return !Live(e.id); }),
              heap_.end());
  std::make_heap(heap_.begin(), heap_.end(), Later());
}

}  // namespace zrpc::internal
