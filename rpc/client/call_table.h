// CallTable: a client's calls in flight on one connection, found by the call id their response
// carries, and by their deadlines.
//
// Why ids carry a generation. A call can end without its response: its deadline passes, the
// caller cancels it, the connection fails. The server does not know and may still answer, late.
// If ids were plain slot numbers, that late response would complete whichever later call reused
// the slot, with another call's bytes: the late-response hazard (/work/shared/notes/
// runtime-anchors.md; brpc and eRPC both number their tries for this reason). So an id is
//
//     id = generation << 24 | slot index          (kIndexBits = 24, generation 40 bits)
//
// and a slot's generation moves on every time a call leaves it. A response whose id names a
// free slot, or a slot now holding a later generation, is stale: Take finds that with one array
// lookup and one compare, counts it (stale_drops) and returns nothing. Generations start at 1,
// so 0 is never an id (the wire refuses it). 24 index bits allow 16 M calls in flight per table,
// far beyond any sane capacity; 40 generation bits mean a slot reused ten million times a
// second wraps after 30 hours, so a response would have to arrive that late, on a connection
// that stayed up, to be mistaken (the transport gives up on an unacknowledged packet within
// seconds). Free slots are reused last-in first-out, for cache locality; generations make that
// safe.
//
// Why bounded. Each call in flight holds the caller's memory and the runtime's (the response
// target, perhaps a bulk payload), and a server that stops answering would let a busy client
// pile them up without end. Insert beyond `capacity` fails with kResourceExhausted, which the
// runtime returns to the caller: back-pressure, not growth. Memory grows with the most calls
// ever in flight at once, never with the number of calls made.
//
// How deadlines are found. A binary min-heap of (deadline, id), with lazy deletion: Take does
// not touch the heap (it is the poller's hot path, once per response, and stays O(1)); an entry
// whose id is no longer live is skipped when it reaches the top. Insert pushes in O(log n) on
// the caller's thread and, when dead entries make up more than half the heap, rebuilds it from
// the live calls (amortized O(1) per call, paid by client threads rather than the poller), so
// the heap never holds more than about twice the calls in flight. TakeExpired pops in deadline
// order, O(log n) per expired call; NextDeadline is the top, for the poller's timed wait. Calls
// with an infinite deadline never enter the heap and cost nothing. A timer wheel would make
// Insert O(1) too, but needs a tick and a range chosen in advance (deadlines here run from
// microseconds to hours) and rounds deadlines to its tick; the heap is exact, and at the
// capacities a connection has (thousands) its log n is a handful of compares.
//
// What the runtime does with what comes out. Take, TakeExpired and TakeAll each remove the call:
// once out, its id is stale, so every call leaves the table exactly once, whichever of response,
// deadline, cancel or failure comes first, and the loser of the race finds nothing.
//   - Take(id) on a response: a hit is the call to complete. A miss (nullopt) is a late or
//     unknown response: the runtime still owns what arrived with it and must give it back at
//     once (Release the receive slot, and the paired bulk payload if the header says there is
//     one), or the peer's later messages and payloads stall behind them.
//   - TakeExpired(now): fail each call with kDeadlineExceeded, and send the server a cancel
//     carrying the id (so it can stop work and, later, release what it holds).
//   - TakeAll() after the connection fails: fail each with the connection's status.
// "Ended" is not "reportable": a call whose request payload the runtime still reads (its WRITE
// posted, or waiting for credits or arena space) must not run its DoneCallback (the caller would
// reuse bytes the NIC may still read). That state lives outside the table, in the call's
// BulkGate (rpc/connection/rpc_connection.h): the payload's release opens it, and a call taken from
// the table before that parks its ending there; a payload that has not left yet is taken back first
// (RpcConnection::Withdraw), so the ending never waits on the peer. The table's job ends when the
// call leaves it; keeping taken calls in it would only delay freeing their slots, which nothing
// needs: the stale id already protects the slot's next user.
//
// Threads. The table is internally synchronized (one absl::Mutex): client threads Insert (and
// Take, to cancel) while the connection's poller thread Takes responses and TakeExpired, and
// every operation is a few array and heap steps, so one uncontended lock is cheaper and harder
// to misuse than asking the runtime to wrap every call in its own. T's move constructor and
// destructor run under that lock: keep T cheap to move (a pointer, a unique_ptr, a small struct)
// and free of calls back into the table. The table never runs callbacks; whatever the runtime
// does with a taken call, it does after the lock is dropped.
#ifndef ZRPC_RPC_CLIENT_CALL_TABLE_H_
#define ZRPC_RPC_CLIENT_CALL_TABLE_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace zrpc {
namespace internal {

// The untyped core of CallTable: slots, generations, the deadline heap. Not synchronized: the
// CallTable's mutex guards it. Exposed for CallTable and its tests.
class CallIndex {
 public:
  static constexpr int kIndexBits = 24;
  static constexpr uint32_t kMaxCapacity = 1u << kIndexBits;
  static constexpr uint64_t kMaxGeneration = (uint64_t{1} << (64 - kIndexBits)) - 1;

  // `capacity` is clamped to [1, kMaxCapacity]. Slots start at `first_generation` (in
  // [1, kMaxGeneration]); only tests pass one, to see generations wrap.
  explicit CallIndex(uint32_t capacity, uint64_t first_generation = 1);

  static uint32_t IndexOf(uint64_t id) { return static_cast<uint32_t>(id & (kMaxCapacity - 1)); }
  // Whether `id` is a live call.
  bool Live(uint64_t id) const;

  // Takes a free slot for a call ending at `deadline` (InfiniteFuture: never) and returns its
  // id; kResourceExhausted when `capacity` calls are live.
  absl::StatusOr<uint64_t> Acquire(absl::Time deadline);
  // Frees the slot of live call `id` and returns its index; nullopt when `id` is not live.
  std::optional<uint32_t> Release(uint64_t id);
  // Frees every live call with a deadline at or before `now` and appends its id to `ids`,
  // earliest deadline first (ties by id).
  void ReleaseExpired(absl::Time now, std::vector<uint64_t>& ids);
  // Frees every live call and appends its id to `ids`, by slot index.
  void ReleaseAll(std::vector<uint64_t>& ids);
  // The earliest deadline of a live call, InfiniteFuture when none has a finite one. Drops the
  // dead entries it finds at the top of the heap (hence not const).
  absl::Time NextDeadline();
  // Whether live call `id` is at the top of the deadline heap. False can also mean a dead entry
  // with an earlier deadline is still on top: a poller that wakes for it is early, never late.
  bool AtTop(uint64_t id) const { return !heap_.empty() && heap_.front().id == id; }

  size_t size() const { return live_; }
  uint32_t capacity() const { return capacity_; }
  // Slots ever used: what the table's memory grows with.
  size_t slots() const { return slots_.size(); }
  // Heap entries, dead ones included: at most about 2 * calls in flight (tests check it).
  size_t heap_size() const { return heap_.size(); }

 private:
  struct Slot {
    uint64_t generation;
    bool live = false;
    bool in_heap = false;  // has a finite deadline (so a heap entry, maybe among dead ones)
  };
  struct HeapEntry {
    absl::Time deadline;
    uint64_t id;
  };

  uint64_t IdOf(uint32_t index) const { return slots_[index].generation << kIndexBits | index; }
  void Free(uint32_t index);
  void PopHeap();
  // Rebuilds the heap from live calls when dead entries outnumber them.
  void MaybeCompact();

  uint32_t capacity_;
  uint64_t first_generation_;
  std::vector<Slot> slots_;
  std::vector<uint32_t> free_;   // LIFO
  std::vector<HeapEntry> heap_;  // min-heap on (deadline, id)
  size_t live_ = 0;
  size_t live_in_heap_ = 0;
};

}  // namespace internal

// A call removed from the table, with the id it had (for a cancel message, or logs).
template <typename T>
struct TakenCall {
  uint64_t id;
  T call;
};

// The client's calls in flight on one connection (see the top of this file). T is the runtime's
// per-call state; it must be movable. Thread-safe.
template <typename T>
class CallTable {
 public:
  // At most `capacity` calls in flight (clamped to [1, 2^24]).
  explicit CallTable(uint32_t capacity) : index_(capacity) {}
  CallTable(const CallTable&) = delete;
  CallTable& operator=(const CallTable&) = delete;

  // Adds a call that ends at `deadline` (InfiniteFuture: only a response, cancel or failure
  // ends it) and returns its id, never 0. kResourceExhausted when `capacity` calls are in
  // flight; `call` is then left as it was (not moved from), so the caller can still fail it. A
  // deadline already past is accepted and comes out of the next TakeExpired; the runtime normally
  // fails such a call before inserting it. If `earliest` is not null, it says whether this call's
  // deadline is now the table's next one: a poller sleeping until NextDeadline() must then be
  // woken. Decided under the table's lock, so no Insert racing another or the poller goes
  // unnoticed.
  absl::StatusOr<uint64_t> Insert(T&& call, absl::Time deadline, bool* earliest = nullptr) {
    absl::MutexLock lock(&mu_);
    absl::StatusOr<uint64_t> id = index_.Acquire(deadline);
    if (!id.ok()) return id.status();
    const uint32_t index = internal::CallIndex::IndexOf(*id);
    if (index >= calls_.size()) calls_.resize(index + 1);
    calls_[index].emplace(std::move(call));
    if (earliest != nullptr) *earliest = index_.AtTop(*id);
    return id;
  }

  // Runs `f(call)` on live call `id`, under the table's lock: `f` must be brief and must not call
  // back into the table. False when `id` is not live.
  template <typename F>
  bool Visit(uint64_t id, F&& f) {
    absl::MutexLock lock(&mu_);
    if (!index_.Live(id)) return false;
    f(*calls_[internal::CallIndex::IndexOf(id)]);
    return true;
  }

  // Whether call `id` is still in the table.
  bool Live(uint64_t id) {
    absl::MutexLock lock(&mu_);
    return index_.Live(id);
  }

  // Removes and returns call `id`, for its response (or a cancel by the caller). nullopt when
  // the call already ended or never existed (a late, duplicate or forged id), counted in
  // stale_drops().
  std::optional<T> Take(uint64_t id) {
    absl::MutexLock lock(&mu_);
    std::optional<uint32_t> index = index_.Release(id);
    if (!index) {
      ++stale_drops_;
      return std::nullopt;
    }
    return MoveOut(*index);
  }

  // Removes and returns every call whose deadline is at or before `now`, earliest first.
  std::vector<TakenCall<T>> TakeExpired(absl::Time now) {
    absl::MutexLock lock(&mu_);
    ids_.clear();
    index_.ReleaseExpired(now, ids_);
    return MoveOutIds();
  }

  // Removes and returns every call, for a connection that failed.
  std::vector<TakenCall<T>> TakeAll() {
    absl::MutexLock lock(&mu_);
    ids_.clear();
    index_.ReleaseAll(ids_);
    return MoveOutIds();
  }

  // The earliest deadline among calls in flight (InfiniteFuture if none): when the poller
  // should next call TakeExpired. Insert may make it earlier: see its `earliest`.
  absl::Time NextDeadline() {
    absl::MutexLock lock(&mu_);
    return index_.NextDeadline();
  }

  size_t size() const {
    absl::MutexLock lock(&mu_);
    return index_.size();
  }
  uint32_t capacity() const {
    absl::MutexLock lock(&mu_);
    return index_.capacity();
  }
  // Takes that found nothing: late responses, duplicates, forged ids, cancels that lost a race.
  uint64_t stale_drops() const {
    absl::MutexLock lock(&mu_);
    return stale_drops_;
  }

 private:
  T MoveOut(uint32_t index) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    T call = std::move(*calls_[index]);
    calls_[index].reset();
    return call;
  }
  std::vector<TakenCall<T>> MoveOutIds() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    std::vector<TakenCall<T>> taken;
    taken.reserve(ids_.size());
    for (uint64_t id : ids_) {
      taken.push_back(TakenCall<T>{id, MoveOut(internal::CallIndex::IndexOf(id))});
    }
    return taken;
  }

  mutable absl::Mutex mu_;
  internal::CallIndex index_ ABSL_GUARDED_BY(mu_);
  std::vector<std::optional<T>> calls_ ABSL_GUARDED_BY(mu_);  // by slot index
  std::vector<uint64_t> ids_ ABSL_GUARDED_BY(mu_);            // scratch for TakeExpired/All
  uint64_t stale_drops_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace zrpc

#endif  // ZRPC_RPC_CLIENT_CALL_TABLE_H_
