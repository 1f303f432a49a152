// CallTable: a client's calls in flight on one connection, found by the call id their response
// carries, and by their deadlines. CallIds: where those ids come from.
//
// Why ids are never reused. A call can end without its response: its deadline passes, the
// caller cancels it, the connection fails. The server does not know and may still answer, late.
// If an id could name a later call, that late response would complete it with another call's
// bytes: the late-response hazard (/work/shared/notes/runtime-anchors.md; brpc and eRPC both
// number their tries for this reason). So a connection numbers its calls from 64-bit counters
// that never wrap in practice (2^63 calls each: a billion a second for 290 years): a response
// whose id is not in the table is late, duplicated or forged, and Take finds nothing, counts it
// (stale_drops) and returns nothing. 0 is never an id (the wire refuses it).
//
// Who numbers. A call started inside the connection's serialization domain (a done-callback on
// the poller starting the next call: the benchmark's chain) takes the next even id from a plain
// counter only the domain's holder touches; one started on any other thread takes the next odd
// id with an atomic add, before it enters the domain or leaves its start there (it needs the id
// at once: a stream's frames carry it). So the two never collide and the chained path executes
// no atomic instruction for its id.
//
// Why bounded. Each call in flight holds the caller's memory and the runtime's (the response
// target, perhaps a bulk payload), and a server that stops answering would let a busy client
// pile them up without end. Insert beyond `capacity` fails with kResourceExhausted, which the
// runtime returns to the caller: back-pressure, not growth. Memory grows with the most calls
// ever in flight at once, never with the number of calls made.
//
// How deadlines are found. A binary min-heap of (deadline, id), with lazy deletion: Take does
// not touch the heap (it is the poller's hot path, once per response); an entry whose id is no
// longer in the table is skipped when it reaches the top. When dead entries make up more than
// half the heap, Insert rebuilds it from the live calls (amortized O(1) per call), so the heap
// never holds more than about twice the calls in flight. TakeExpired pops in deadline order,
// O(log n) per expired call; NextDeadline is the top. Calls with an infinite deadline never enter
// the heap and cost nothing. A timer wheel would make Insert O(1) too, but needs a tick and a
// range chosen in advance (deadlines here run from microseconds to hours) and rounds deadlines
// to its tick; the heap is exact, and at the capacities a connection has (thousands) its log n
// is a handful of compares.
//
// Where calls live. Each in an entry of its own, in blocks the table never moves or frees before
// it goes (entries are reused through a free list, so steady state allocates nothing); the map
// from id holds a pointer to it. So a response completes its call in place: Take hands out the
// entry itself (a Taken, which gives it back when it goes), not a copy moved out of the map, and
// a done-callback that starts calls meanwhile (and grows the table) cannot move the call it runs
// from. A call is moved once, into its entry.
//
// What the runtime does with what comes out. Take, TakeExpired and TakeAll each remove the call:
// once out, its id is stale, so every call leaves the table exactly once, whichever of response,
// deadline, cancel or failure comes first, and the loser of the race finds nothing.
//   - Take(id) on a response: a hit is the call to complete. A miss (empty) is a late or
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
// (RpcConnection::Withdraw), so the ending never waits on the peer.
//
// Threads. The table is not synchronized: it lives in its connection's serialization domain
// (transport/serial_domain.h), and only the domain's holder touches it (rpc/THREADING.md). Its
// size and next deadline are published for other threads to read (published_size,
// published_next_deadline): single-writer stores, no lock, no read-modify-write.
#ifndef ZRPC_RPC_CLIENT_CALL_TABLE_H_
#define ZRPC_RPC_CLIENT_CALL_TABLE_H_

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <new>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"

namespace zrpc {

// A connection's call ids (see the top of this file).
class CallIds {
 public:
  CallIds() = default;
  CallIds(const CallIds&) = delete;
  CallIds& operator=(const CallIds&) = delete;

  // For the holder of the connection's domain: the next even id, no atomic instruction.
  uint64_t NextInDomain() { return next_in_domain_ += 2; }
  // For any thread: the next odd id.
  uint64_t NextShared() { return next_shared_.fetch_add(2, std::memory_order_relaxed); }

 private:
  uint64_t next_in_domain_ = 0;           // 2, 4, ...
  std::atomic<uint64_t> next_shared_{1};  // 1, 3, ...
};

// A call removed from the table, with the id it had (for a cancel message, or logs).
template <typename T>
struct TakenCall {
  uint64_t id;
  T call;
};

// The client's calls in flight on one connection (see the top of this file). T is the runtime's
// per-call state; it must be movable. Not synchronized: its connection's domain.
template <typename T>
class CallTable {
  struct Entry;

 public:
  // A call taken out of the table (Take): its id is stale from then on, and its entry is the
  // holder's until this goes, which gives it back (in the domain, as every use of the table).
  // Empty when Take found nothing.
  class Taken {
   public:
    Taken() = default;
    Taken(Taken&& other) noexcept
        : table_(other.table_), entry_(std::exchange(other.entry_, nullptr)) {}
    Taken& operator=(Taken&& other) noexcept {
      Reset();
      table_ = other.table_;
      entry_ = std::exchange(other.entry_, nullptr);
      return *this;
    }
    ~Taken() { Reset(); }

    bool has_value() const { return entry_ != nullptr; }
    explicit operator bool() const { return has_value(); }
    T& operator*() const { return entry_->call; }
    T* operator->() const { return &entry_->call; }

   private:
    friend class CallTable;
    Taken(CallTable* table, Entry* entry) : table_(table), entry_(entry) {}
    void Reset() {
      if (entry_ != nullptr) table_->Free(std::exchange(entry_, nullptr));
    }
    CallTable* table_ = nullptr;
    Entry* entry_ = nullptr;
  };

  // At most `capacity` calls in flight (at least 1).
  explicit CallTable(uint32_t capacity) : capacity_(std::max<uint32_t>(capacity, 1)) {}
  CallTable(const CallTable&) = delete;
  CallTable& operator=(const CallTable&) = delete;
  // Every Taken must have gone first.
  ~CallTable() {
    for (auto& [id, entry] : calls_) entry->~Entry();
  }

  // Adds call `id` (never used before on this table, never 0) that ends at `deadline`
  // (InfiniteFuture: only a response, cancel or failure ends it). kResourceExhausted when
  // `capacity` calls are in flight, kAlreadyExists for an id in the table: `call` is then left as
  // it was (not moved from), so the caller can still fail it. A deadline already past is accepted
  // and comes out of the next TakeExpired. If `earliest` is not null, it says whether this call's
  // deadline is now the table's next one: a timer sleeping until NextDeadline() must then be
  // woken.
  absl::Status Insert(uint64_t id, T&& call, absl::Time deadline, bool* earliest = nullptr) {
    if (calls_.size() >= capacity_) {
      return absl::ResourceExhaustedError(
          absl::StrCat(calls_.size(), " calls in flight on the connection, its capacity"));
    }
    const bool finite = deadline != absl::InfiniteFuture();
    auto [it, inserted] = calls_.try_emplace(id, nullptr);
    if (!inserted) return absl::AlreadyExistsError(absl::StrCat("call id ", id, " is in flight"));
    it->second = Allocate(std::move(call), deadline);
    if (finite) {
      MaybeCompact();
      heap_.push_back(HeapEntry{deadline, id});
      std::push_heap(heap_.begin(), heap_.end(), Later());
      ++live_in_heap_;
    }
    const bool first = finite && heap_.front().id == id;
    if (earliest != nullptr) *earliest = first;
    PublishSize();
    if (first) PublishNext();
    return absl::OkStatus();
  }

  // Runs `f(call)` on live call `id`: `f` must not call back into the table. False when `id` is
  // not live.
  template <typename F>
  bool Visit(uint64_t id, F&& f) {
    auto it = calls_.find(id);
    if (it == calls_.end()) return false;
    f(it->second->call);
    return true;
  }

  // Whether call `id` is still in the table.
  bool Live(uint64_t id) const { return calls_.contains(id); }

  // Removes call `id` and hands it out in place, for its response (or a cancel by the caller).
  // Empty when the call already ended or never existed (a late, duplicate or forged id), counted
  // in stale_drops().
  Taken Take(uint64_t id) {
    auto it = calls_.find(id);
    if (it == calls_.end()) {
      stale_drops_.store(stale_drops_.load(std::memory_order_relaxed) + 1,
                         std::memory_order_relaxed);
      return Taken();
    }
    Entry* entry = it->second;
    if (entry->deadline != absl::InfiniteFuture()) --live_in_heap_;
    calls_.erase(it);
    // The next deadline stays as published: at worst an ended call's, which wakes the timer
    // early, once: TakeExpired then publishes a live call's (or none).
    PublishSize();
    return Taken(this, entry);
  }

  // Removes and returns every call whose deadline is at or before `now`, earliest first (ties by
  // id).
  std::vector<TakenCall<T>> TakeExpired(absl::Time now) {
    std::vector<TakenCall<T>> taken;
    while (!heap_.empty() && heap_.front().deadline <= now) {
      const uint64_t id = heap_.front().id;
      PopHeap();
      auto it = calls_.find(id);
      if (it == calls_.end()) continue;  // answered or taken meanwhile: a dead entry
      taken.push_back(TakenCall<T>{id, std::move(it->second->call)});
      Free(it->second);
      --live_in_heap_;
      calls_.erase(it);
    }
    // The deadline published next is a live call's: a dead top (a call answered since) would wake
    // the timer again for nothing, once per answered call.
    DropDeadTop();
    PublishSize();
    PublishNext();
    return taken;
  }

  // Removes and returns every call, for a connection that failed (in no set order).
  std::vector<TakenCall<T>> TakeAll() {
    std::vector<TakenCall<T>> taken;
    taken.reserve(calls_.size());
    for (auto& [id, entry] : calls_) {
      taken.push_back(TakenCall<T>{id, std::move(entry->call)});
      Free(entry);
    }
    calls_.clear();
    heap_.clear();
    live_in_heap_ = 0;
    PublishSize();
    PublishNext();
    return taken;
  }

  // The earliest deadline among calls in flight (InfiniteFuture if none): when TakeExpired should
  // next run. Drops the dead entries it finds at the top of the heap.
  absl::Time NextDeadline() {
    DropDeadTop();
    PublishNext();
    return heap_.empty() ? absl::InfiniteFuture() : heap_.front().deadline;
  }

  size_t size() const { return calls_.size(); }
  uint32_t capacity() const { return capacity_; }
  // Heap entries, dead ones included: at most about 2 * calls in flight (tests check it).
  size_t heap_size() const { return heap_.size(); }

  // For any thread: the size as of the holder's last change, and the next deadline as of the
  // last Insert that made it earlier, TakeExpired, TakeAll or NextDeadline: it may be a call's
  // that has ended since (a timer waking for it is early, never late).
  size_t published_size() const { return published_size_.load(std::memory_order_relaxed); }
  absl::Time published_next_deadline() const {
    const int64_t at = published_next_.load(std::memory_order_relaxed);
    return at == kNever ? absl::InfiniteFuture() : absl::FromUnixNanos(at);
  }
  // Takes that found nothing: late responses, duplicates, forged ids, cancels that lost a race.
  // Any thread.
  uint64_t stale_drops() const { return stale_drops_.load(std::memory_order_relaxed); }

 private:
  static constexpr int64_t kNever = INT64_MAX;
  struct Entry {
    Entry(T&& c, absl::Time d) : call(std::move(c)), deadline(d) {}
    T call;
    absl::Time deadline;
  };
  // Raw memory for one entry (Allocate constructs it, Free destroys it).
  struct alignas(Entry) EntryMemory {
    unsigned char bytes[sizeof(Entry)];
  };
  static constexpr size_t kBlock = 32;  // entries made at once when none is free

  Entry* Allocate(T&& call, absl::Time deadline) {
    if (free_.empty()) {
      auto block = std::make_unique<EntryMemory[]>(kBlock);
      free_.reserve(kBlock * (blocks_.size() + 1));  // room for every entry, at Free too
      for (size_t i = kBlock; i-- > 0;) free_.push_back(reinterpret_cast<Entry*>(&block[i]));
      blocks_.push_back(std::move(block));
    }
    Entry* memory = free_.back();
    free_.pop_back();
    return new (memory) Entry(std::move(call), deadline);
  }
  void Free(Entry* entry) {
    entry->~Entry();
    free_.push_back(entry);  // within the capacity Allocate reserved
  }
  struct HeapEntry {
    absl::Time deadline;
    uint64_t id;
  };
  // std::push_heap and friends build a max-heap: "later" as less makes the earliest the top.
  struct Later {
    bool operator()(const HeapEntry& a, const HeapEntry& b) const {
      return a.deadline != b.deadline ? a.deadline > b.deadline : a.id > b.id;
    }
  };

  void PopHeap() {
    std::pop_heap(heap_.begin(), heap_.end(), Later());
    heap_.pop_back();
  }
  // Pops the entries of ended calls off the top, so that the top is a live call's (or none).
  void DropDeadTop() {
    while (!heap_.empty() && !calls_.contains(heap_.front().id)) PopHeap();
  }

  // Rebuilds the heap from the live calls when dead entries outnumber them.
  void MaybeCompact() {
    if (heap_.size() < 16 || heap_.size() <= 2 * live_in_heap_) return;
    heap_.clear();
    for (const auto& [id, entry] : calls_) {
      if (entry->deadline != absl::InfiniteFuture()) {
        heap_.push_back(HeapEntry{entry->deadline, id});
      }
    }
    std::make_heap(heap_.begin(), heap_.end(), Later());
  }

  void PublishSize() { published_size_.store(calls_.size(), std::memory_order_relaxed); }
  void PublishNext() {
    const int64_t next = heap_.empty() ? kNever : absl::ToUnixNanos(heap_.front().deadline);
    published_next_.store(next, std::memory_order_relaxed);
  }

  const uint32_t capacity_;
  absl::flat_hash_map<uint64_t, Entry*> calls_;
  std::vector<std::unique_ptr<EntryMemory[]>> blocks_;  // every entry's memory
  std::vector<Entry*> free_;                            // entries not in use
  std::vector<HeapEntry> heap_;  // min-heap on (deadline, id), with dead entries
  size_t live_in_heap_ = 0;
  std::atomic<size_t> published_size_{0};
  std::atomic<int64_t> published_next_{kNever};
  std::atomic<uint64_t> stale_drops_{0};
};

}  // namespace zrpc

#endif  // ZRPC_RPC_CLIENT_CALL_TABLE_H_
