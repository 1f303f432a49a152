#include "transport/arena_pool.h"

#include <cerrno>

#include "absl/strings/str_cat.h"
#include "transport/verbs_error.h"

namespace zrpc::transport {

ArenaPool::ArenaPool(ibv_pd* pd, uint32_t piece_size, uint32_t pieces)
    : pd_(pd), piece_size_(piece_size), capacity_(pieces) {
  // Reserved once: data() and mr() read a piece without the lock while another is made.
  pieces_.resize(pieces);
}

std::optional<uint32_t> ArenaPool::Take() {
  absl::MutexLock lock(&mu_);
  if (!free_.empty()) {
    const uint32_t index = free_.back();  // the most recently given: warm in caches
    free_.pop_back();
    ++lent_;
    return index;
  }
  if (made_ >= capacity_) return std::nullopt;
  Piece& piece = pieces_[made_];
  piece.memory = AllocatePages(piece_size_);
  if (piece.memory == nullptr) {
    last_error_ = absl::ResourceExhaustedError(absl::StrCat(
        "arena pool: cannot allocate piece ", made_ + 1, " of ", piece_size_, " bytes"));
    capacity_ = made_;
    return std::nullopt;
  }
  piece.mr.reset(ibv_reg_mr(pd_, piece.memory.get(), piece_size_,
                            IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND));
  if (piece.mr == nullptr) {
    last_error_ = VerbsError(
        absl::StrCat("ibv_reg_mr(arena pool piece ", made_ + 1, ", ", piece_size_, " bytes)"),
        errno);
    piece.memory.reset();
    capacity_ = made_;
    return std::nullopt;
  }
  ++lent_;
  return made_++;
}

void ArenaPool::Give(uint32_t index) {
  absl::MutexLock lock(&mu_);
  free_.push_back(index);
  --lent_;
}

uint32_t ArenaPool::lent() const {
  absl::MutexLock lock(&mu_);
  return lent_;
}

uint32_t ArenaPool::made() const {
  absl::MutexLock lock(&mu_);
  return made_;
}

absl::Status ArenaPool::last_error() const {
  absl::MutexLock lock(&mu_);
  return last_error_;
}

}  // namespace zrpc::transport
