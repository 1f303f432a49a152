// ArenaPool: the pieces of registered memory a poller lends its connections as receive arenas, on
// demand (arena.h, "Loans").
//
// Why. An arena per connection registered for its lifetime (256 KiB by default) was most of what
// an idle server connection cost. A poller's connections seldom all write bulk payloads at once,
// so the poller keeps a pool of `pieces` arenas of `piece_size` bytes and lends one to a
// connection while its peer writes, through a type-2 memory window bound to that connection's QP
// (memory_window.h): the key works from that QP alone, within that piece alone.
//
// Pieces are made when first taken (memory allocated, zeroed and registered: LOCAL_WRITE and
// MW_BIND, no remote access of its own) and kept for the next loan, so a poller whose peers never
// write bulk registers none, and one whose peers do registers at most pieces * piece_size. Each
// piece is its own registration: a window's accesses are checked against its region's range on
// rxe, not the window's (memory_window.h, "Ranges").
//
// Thread-safe: connections take and give pieces inside their own domains, on any thread.
#ifndef ZRPC_TRANSPORT_ARENA_POOL_H_
#define ZRPC_TRANSPORT_ARENA_POOL_H_

#include <infiniband/verbs.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "transport/verbs_owners.h"

namespace zrpc::transport {

class ArenaPool {
 public:
  // A pool of up to `pieces` arenas of `piece_size` bytes (a multiple of 64) on `pd`. Nothing
  // is registered yet.
  ArenaPool(ibv_pd* pd, uint32_t piece_size, uint32_t pieces);
  ArenaPool(const ArenaPool&) = delete;
  ArenaPool& operator=(const ArenaPool&) = delete;

  // A free piece's index, made now if none was free and fewer than `pieces` exist; nullopt when
  // all are lent. A piece that cannot be made (registration refused: RLIMIT_MEMLOCK, say) makes
  // the pool stop at the pieces it has, and last_error() says why.
  std::optional<uint32_t> Take();
  // Gives back a piece Take returned, once nothing can reach it through a window any more.
  void Give(uint32_t index);

  uint8_t* data(uint32_t index) const { return pieces_[index].memory.get(); }
  const ibv_mr& mr(uint32_t index) const { return *pieces_[index].mr; }
  uint32_t piece_size() const { return piece_size_; }
  uint32_t capacity() const { return capacity_; }
  // Pieces lent now, and made (registered) so far.
  uint32_t lent() const;
  uint32_t made() const;
  absl::Status last_error() const;

 private:
  struct Piece {
    PageBuffer memory;
    MrOwner mr;
  };
  ibv_pd* const pd_;
  const uint32_t piece_size_;
  uint32_t capacity_ ABSL_GUARDED_BY(mu_);  // lowered when a piece cannot be made
  mutable absl::Mutex mu_;
  // Made pieces; pieces_ never moves once reserved (data() reads it without the lock).
  std::vector<Piece> pieces_;
  std::vector<uint32_t> free_ ABSL_GUARDED_BY(mu_);
  uint32_t made_ ABSL_GUARDED_BY(mu_) = 0;
  uint32_t lent_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status last_error_ ABSL_GUARDED_BY(mu_);
};

}  // namespace zrpc::transport

#endif  // ZRPC_TRANSPORT_ARENA_POOL_H_
