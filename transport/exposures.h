// Exposures: a connection's payloads opened to its peer for one transfer each, through type-2
// memory windows bound to the connection's queue pair, and closed by the peer's own message.
//
// Why. A payload the peer pulls by RDMA READ must be opened to it under a remote key. A memory
// region's key works from every queue pair of the protection domain, for as long as the region
// is registered: another connection that guessed it could read the payload, and the region costs
// a registration (a system call, the pages pinned again) per payload. A window bound to this
// connection's queue pair (memory_window.h) opens its range to this queue pair alone, costs a
// work request instead of a registration when the memory is registered already, and dies on this
// side's NIC when the peer's answer names its key (a SEND_WITH_INV: NVMe-oF's pattern), with no
// work request of this side's. So the key is dead by the time this side learns the transfer is
// over, and the memory can go at once.
//
// The life of an exposure (Connection::Expose, SendExposing, EndExposure):
//   - Reserve, on any thread: a window per range, taken from the connection's free ones or
//     allocated, and a fresh key for each (random low byte: memory_window.h, "Keys"), known
//     before the message that names them is written.
//   - Bind, in the connection's domain when the message's turn comes: a BIND_MW work request per
//     window, posted on the queue pair before the SEND that carries the keys (one queue: in order).
//   - End, exactly one of:
//       * the peer's SEND_WITH_INV names one of its keys: that window was invalidated by the NIC
//         and is free for another exposure; the exposure's other window (a message's large body
//         beside its payload) is deallocated, which kills its key;
//       * EndExposure (the caller gave up: the call ended, the peer answered without the
//         invalidating word): windows bound are deallocated, unbound ones go back free;
//       * the connection closed: every window is deallocated.
//     Each exposure is reported once, by OnSendDone(token): OK when the peer invalidated it, else
//     why not. Until that report the memory under the windows, and its region, must stay.
//
// Deallocation rather than a local invalidate on the way out: ibv_dealloc_mw kills the key before
// it returns, whatever the queue pair's state, where a LOCAL_INV is a work request that a queue
// pair in error flushes without running and that a caller would have to wait for.
//
// Thread-safety: Reserve may run on any thread; everything else runs in the connection's domain.
// A mutex guards the table between them (the domain alone cannot: Reserve must answer at once).
#ifndef ZRPC_TRANSPORT_EXPOSURES_H_
#define ZRPC_TRANSPORT_EXPOSURES_H_

#include <infiniband/verbs.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "transport/device.h"
#include "transport/memory_window.h"

namespace zrpc::transport {

// A range of memory to open to the peer for RDMA READ: [data, data + size), inside `region`,
// which was registered for binding windows (Device::RegisterForWindows, or memory registered with
// windows in mind: Device::RegisterMemory on a device that has them). On rxe a window opens the
// whole region beneath it, not only its own range (memory_window.h, "Ranges"): the caller gives a
// region that covers exactly the range wherever that matters (Device::windows_bound_range).
struct ExposedRange {
  const void* data = nullptr;
  uint32_t size = 0;
  const MemoryRegion* region = nullptr;
};

// What Expose answers: the exposure's id (for SendExposing and EndExposure) and a key per range,
// in order, to give the peer.
struct ExposureKeys {
  static constexpr int kMaxRanges = 2;
  uint64_t id = 0;
  uint32_t rkeys[kMaxRanges] = {0, 0};
  int count = 0;
};

class Exposures {
 public:
  explicit Exposures(ibv_pd* pd) : pd_(pd) {}
  Exposures(const Exposures&) = delete;
  Exposures& operator=(const Exposures&) = delete;
  ~Exposures() = default;  // EndAll first: a bound window holds its queue pair

  // Reserves a window per range (1 or 2), with fresh keys, for an exposure reported with `token`.
  // kInvalidArgument for no range, too many or an empty one; kUnimplemented when the device has
  // no type-2 windows; kResourceExhausted when `limit` exposures are open already; else the verbs
  // error of allocating a window.
  absl::StatusOr<ExposureKeys> Reserve(absl::Span<const ExposedRange> ranges, uint64_t token,
                                       size_t limit);

  // In the domain, when the exposure's bind comes to be posted: fills `wr` to bind window `index`
  // (0 or 1) of exposure `id` for remote READ and marks it bound (the caller posts it before the
  // SEND that carries its key). False when there is nothing to bind: the exposure ended meanwhile.
  bool TakeBind(uint64_t id, int index, ibv_send_wr* wr);
  // In the domain, once the work requests TakeBind filled in are posted: their windows' keys are
  // the new ones from here on (a bind names its window by the key it has when posted, so the
  // update must not come sooner: memory_window.h).
  void Posted();

  // In the domain: the peer's SEND_WITH_INV invalidated `rkey`. The token to report as done (OK),
  // or kFailedPrecondition when `rkey` is no key of an open exposure's bound window: the peer
  // invalidated a key this side never gave it, or not yet, or twice (a violation; its NIC has
  // invalidated it already, so the window is deallocated here).
  absl::StatusOr<uint64_t> Invalidated(uint32_t rkey);

  // In the domain: ends exposure `id` now. Its token, to report, unless it had ended already.
  std::optional<uint64_t> End(uint64_t id);
  // In the domain, once the queue pair takes no more work: ends every exposure (their tokens, to
  // report) and deallocates every window, free ones too. Reserve refuses from then on
  // (kUnavailable), so that no exposure begins after the connection's last report.
  std::vector<uint64_t> EndAll();

  // Exposures open (reserved, not ended), and windows allocated (open or free).
  size_t open() const;
  size_t windows() const;

 private:
  struct Window {
    std::unique_ptr<MemoryWindow> mw;
    uint64_t exposure = 0;  // 0: free
    bool bound = false;
    ibv_send_wr bind{};  // prepared at Reserve, posted at TakeBind
  };
  struct Exposure {
    uint64_t token = 0;
    uint32_t windows[ExposureKeys::kMaxRanges] = {0, 0};
    int count = 0;
  };

  // Deallocates window `index` (its key dies now); its slot is free for a fresh window.
  void DropWindowLocked(uint32_t index) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Ends exposure `it`: windows bound are dropped except `keep`, unbound ones go back free.
  uint64_t EndLocked(uint64_t id, std::optional<uint32_t> keep) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  ibv_pd* const pd_;
  mutable absl::Mutex mu_;
  std::vector<Window> windows_ ABSL_GUARDED_BY(mu_);
  std::vector<uint32_t> free_ ABSL_GUARDED_BY(mu_);  // windows_ not in use (mw may be null)
  // The device's index of a window (its key's upper 24 bits) -> its place in windows_.
  absl::flat_hash_map<uint32_t, uint32_t> by_index_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, Exposure> open_ ABSL_GUARDED_BY(mu_);
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  bool ended_all_ ABSL_GUARDED_BY(mu_) = false;  // EndAll ran: nothing more is reserved
  // Windows whose binds TakeBind gave out and that are not posted yet (Posted).
  std::vector<uint32_t> taken_ ABSL_GUARDED_BY(mu_);
};

}  // namespace zrpc::transport

#endif  // ZRPC_TRANSPORT_EXPOSURES_H_
