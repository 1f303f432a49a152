#include "transport/exposures.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace zrpc::transport {

absl::StatusOr<ExposureKeys> Exposures::Reserve(absl::Span<const ExposedRange> ranges,
                                                uint64_t token, size_t limit) {
  if (ranges.empty() || ranges.size() > ExposureKeys::kMaxRanges) {
    return absl::InvalidArgumentError(
        absl::StrCat("an exposure has 1 or 2 ranges, not ", ranges.size()));
  }
  for (const ExposedRange& range : ranges) {
    if (range.size == 0 || range.region == nullptr) {
      return absl::InvalidArgumentError("an exposed range is empty or has no region");
    }
  }
  absl::MutexLock lock(&mu_);
  if (ended_all_) {
    // The connection closed while the caller was on its way here (it looked open): its token
    // would be reported after the handler's OnClosed, which may have freed the handler.
    return absl::UnavailableError("the connection closed: nothing more is exposed on it");
  }
  if (open_.size() >= limit) {
    return absl::ResourceExhaustedError(
        absl::StrCat(open_.size(), " payloads are exposed to the peer already (the most at once)"));
  }
  ExposureKeys keys;
  Exposure exposure;
  exposure.token = token;
  keys.id = next_id_;
  for (const ExposedRange& range : ranges) {
    uint32_t index;
    if (!free_.empty()) {
      index = free_.back();
      free_.pop_back();
    } else {
      index = static_cast<uint32_t>(windows_.size());
      windows_.emplace_back();
    }
    Window& window = windows_[index];
    if (window.mw == nullptr) {
      absl::StatusOr<std::unique_ptr<MemoryWindow>> mw = MemoryWindow::Allocate(pd_);
      if (!mw.ok()) {
        free_.push_back(index);
        for (int i = 0; i < exposure.count; ++i) {
          windows_[exposure.windows[i]].exposure = 0;
          free_.push_back(exposure.windows[i]);
        }
        return mw.status();
      }
      window.mw = *std::move(mw);
      by_index_[window.mw->rkey() >> 8] = index;
    }
    window.exposure = keys.id;
    window.bound = false;
    keys.rkeys[keys.count++] =
        window.mw->PrepareBind(*range.region->mr(), reinterpret_cast<uintptr_t>(range.data),
                               range.size, IBV_ACCESS_REMOTE_READ, 0, &window.bind);
    exposure.windows[exposure.count++] = index;
  }
  ++next_id_;
  open_.emplace(keys.id, exposure);
  return keys;
}

bool Exposures::TakeBind(uint64_t id, int index, ibv_send_wr* wr) {
  absl::MutexLock lock(&mu_);
  auto it = open_.find(id);
  if (it == open_.end() || index >= it->second.count) return false;
  const uint32_t place = it->second.windows[index];
  Window& window = windows_[place];
  *wr = window.bind;
  window.bound = true;
  taken_.push_back(place);
  return true;
}

void Exposures::Posted() {
  absl::MutexLock lock(&mu_);
  for (uint32_t place : taken_) {
    // Still the window whose bind went (a window dropped since has no mw, or a fresh one).
    if (windows_[place].mw != nullptr && windows_[place].bound) windows_[place].mw->BindPosted();
  }
  taken_.clear();
}

absl::StatusOr<uint64_t> Exposures::Invalidated(uint32_t rkey) {
  absl::MutexLock lock(&mu_);
  auto place = by_index_.find(rkey >> 8);
  if (place == by_index_.end()) {
    return absl::FailedPreconditionError(
        absl::StrCat("peer invalidated key ", rkey, ", which names no window this side exposed"));
  }
  const uint32_t index = place->second;
  Window& window = windows_[index];
  if (window.exposure == 0 || !window.bound || window.mw->rkey() != rkey) {
    // Its NIC invalidated it (a window of an exposure that ended, or bound under another key):
    // whatever this side thinks of the window, it is gone now, so it goes.
    if (auto it = open_.find(window.exposure); it != open_.end()) {
      for (int i = 0; i < it->second.count; ++i) {
        if (it->second.windows[i] == index) it->second.windows[i] = UINT32_MAX;
      }
    }
    DropWindowLocked(index);
    return absl::FailedPreconditionError(absl::StrCat(
        "peer invalidated key ", rkey, ", which is not the key of a payload exposed to it now"));
  }
  return EndLocked(window.exposure, index);
}

std::optional<uint64_t> Exposures::End(uint64_t id) {
  absl::MutexLock lock(&mu_);
  if (!open_.contains(id)) return std::nullopt;
  return EndLocked(id, std::nullopt);
}

uint64_t Exposures::EndLocked(uint64_t id, std::optional<uint32_t> keep) {
  auto it = open_.find(id);
  const Exposure exposure = it->second;
  open_.erase(it);
  for (int i = 0; i < exposure.count; ++i) {
    const uint32_t index = exposure.windows[i];
    if (index == UINT32_MAX) continue;  // dropped already (Invalidated)
    Window& window = windows_[index];
    if (window.bound && index != keep) {
      DropWindowLocked(index);  // its key must die now, and only deallocation kills it at once
      continue;
    }
    // Never bound, or invalidated by the peer's NIC: free to bind again under a fresh key.
    window.exposure = 0;
    window.bound = false;
    free_.push_back(index);
  }
  return exposure.token;
}

void Exposures::DropWindowLocked(uint32_t index) {
  Window& window = windows_[index];
  if (window.mw != nullptr) by_index_.erase(window.mw->rkey() >> 8);
  window.mw.reset();  // ibv_dealloc_mw: the key opens nothing from here on
  window.bound = false;
  if (window.exposure == 0) return;  // free already (in free_)
  window.exposure = 0;
  free_.push_back(index);
}

std::vector<uint64_t> Exposures::EndAll() {
  absl::MutexLock lock(&mu_);
  ended_all_ = true;
  std::vector<uint64_t> tokens;
  tokens.reserve(open_.size());
  for (const auto& [id, exposure] : open_) tokens.push_back(exposure.token);
  open_.clear();
  taken_.clear();
  windows_.clear();
  free_.clear();
  by_index_.clear();
  return tokens;
}

size_t Exposures::open() const {
  absl::MutexLock lock(&mu_);
  return open_.size();
}

size_t Exposures::windows() const {
  absl::MutexLock lock(&mu_);
  size_t n = 0;
  for (const Window& window : windows_) n += window.mw != nullptr ? 1 : 0;
  return n;
}

}  // namespace zrpc::transport
