// CompletionBudget: a poller's completion-queue entries, reserved per connection only for what
// an idle connection may complete, and granted for work requests in flight.
//
// A CQ that overflows breaks every queue pair on it, so every completion that may be outstanding
// must have an entry. Reserving a connection's worst case (its whole send queue) when it
// registers, as zrpc did, makes an idle connection cost 66 entries and caps a poller at a few
// hundred connections. Instead:
//  - a connection reserves, for as long as it is registered, only what it may complete while
//    idle: its drain marker, and its own receives when it has no shared receive queue
//    (Reserve/Unreserve, under the poller's lock, which also decides admission);
//  - its sends take entries as grants (Take, in chunks of kCqGrantChunk), one entry for each
//    work request in flight at most, and keep them while they are used; a connection gives its
//    grant back when it is unregistered, and when it is idle while another waits for entries
//    (the poller asks the holders then: poller.h, "Capacity");
//  - reservations leave `grant_floor` entries to grants, so some connection can always send.
// So Σ reservations + Σ grants ≤ entries at every moment: every completion has an entry.
//
// Thread-safety: Reserve/Unreserve under the caller's lock (the poller's mutex); Take and Give
// from any thread (one atomic instruction each, when a connection's grant grows or shrinks: not
// per work request).
#ifndef ZRPC_TRANSPORT_COMPLETION_BUDGET_H_
#define ZRPC_TRANSPORT_COMPLETION_BUDGET_H_

#include <atomic>
#include <cstdint>

namespace zrpc::transport {

// Entries a connection's grant grows or is asked back by. The send queue requests a completion
// at least every kSignalInterval (16) work requests, so a connection whose grant is full always
// has a signalled one in flight, whose completion makes room: a grant never stalls its holder.
inline constexpr uint32_t kCqGrantChunk = 16;

class CompletionBudget {
 public:
  // `entries`: the queue's, less what is set aside for good (a shared receive queue's receives).
  // `grant_floor`: entries reservations leave for grants.
  void Init(int64_t entries, int64_t grant_floor) {
    entries_ = entries;
    grant_floor_ = grant_floor;
    free_.store(entries, std::memory_order_relaxed);
  }

  // Whether a reservation of `n` fits beside the others (and the grant floor): admission.
  bool Fits(uint32_t n) const { return reserved_ + n <= entries_ - grant_floor_; }
  // Counts a reservation Fits accepted. Its entries still have to be taken (Take): grants may
  // hold them for a moment.
  void Reserve(uint32_t n) { reserved_ += n; }
  void Unreserve(uint32_t n) { reserved_ -= n; }

  // Takes `n` free entries, or none (false) when fewer are free.
  bool Take(uint32_t n) {
    int64_t free = free_.load(std::memory_order_relaxed);
    while (free >= n) {
      if (free_.compare_exchange_weak(free, free - n, std::memory_order_acq_rel)) return true;
    }
    return false;
  }
  void Give(uint32_t n) { free_.fetch_add(n, std::memory_order_acq_rel); }

  int64_t entries() const { return entries_; }
  int64_t reserved() const { return reserved_; }
  int64_t grant_floor() const { return grant_floor_; }
  // Entries neither reserved nor granted now (any thread; a moment's figure).
  int64_t free() const { return free_.load(std::memory_order_relaxed); }

 private:
  int64_t entries_ = 0;
  int64_t grant_floor_ = 0;
  int64_t reserved_ = 0;  // the caller's lock
  std::atomic<int64_t> free_{0};
};

}  // namespace zrpc::transport

#endif  // ZRPC_TRANSPORT_COMPLETION_BUDGET_H_
