// SlotPool: pre-registered, fixed-size buffers for small messages, in chunks that grow on demand.
//
// Why slots. Registering memory (ibv_reg_mr) pins pages and costs tens of microseconds to
// milliseconds; doing it per message would dwarf the message. So the pool registers memory in
// big pieces, once each, and cuts them into slots of `slot_size` bytes. Every small message zrpc
// sends is built in a slot (the generated stubs serialize straight into one), and every RECV
// zrpc posts points at a slot, so a received message is read in place.
//
// Why chunks. One pool serves every connection on a device, and each server connection keeps
// recv_credits + 1 slots posted (65 with the default options) whether it is busy or idle. A
// fixed region big enough for a server with hundreds of connections would pin tens of MiB in
// every client that opens one; one sized for a client stops a server after a dozen connections.
// So the pool starts with one chunk of `slot_count` slots (rounded up to a power of two) and,
// when a caller finds no free slot, allocates and registers one more chunk of the same size, up
// to `max_slots`. Each chunk is its own page-aligned allocation and its own MR (LOCAL_WRITE
// only: slots are sources of SENDs and WRITEs and targets of RECVs, never exposed to a peer's
// RDMA WRITE or READ). A chunk is never freed or deregistered before the pool is destroyed: any
// of its slots may be posted to the NIC at any time, and an idle chunk costs only its pages.
//
// Finding a slot's address and key. A slot index splits into a chunk number (its high bits,
// index >> chunk_shift) and a slot within the chunk (its low bits). The chunk table holds one
// {base address, lkey} entry per possible chunk; it is allocated at Create with room for
// max_slots, so it never moves, and data(index) and lkey(index) are a shift, a mask, and a load
// from a table of a few KiB that stays in cache: O(1), no lock, no search (brpc's linear lkey
// lookup over up to 16 regions bit its users; see ../shared/notes/rdma-pitfalls.md). The
// power-of-two chunk size is what makes that a shift instead of a division.
//
// Sizing. Defaults: 4 KiB slots, chunks of 256 slots (1 MiB), at most 131072 slots (512 MiB, 512
// chunks). A client with a few connections pins 1 MiB; a server with connections of their own
// receives (65 slots each with 64 credits) holds 256 idle ones in 65 chunks (65 MiB), and an RPC
// server with its default shared receive queues (4096 slots per poller, 16 pollers at most) takes
// half the cap for them and holds its connections' credit-frame slots and sends in the rest.
// The bookkeeping is sized for max_slots at Create but is 5 bytes a slot of address space that
// is touched only as chunks arrive (640 KiB for the default cap). Registered memory counts
// against RLIMIT_MEMLOCK for non-root processes (often 8 MiB): a server expecting many
// connections needs the limit raised (`ulimit -l`, or LimitMEMLOCK= in a systemd unit), and a
// chunk whose registration fails says so through growth_error(). Note that every connection's
// bulk arena (ConnectionOptions::arena_size) is registered too, and usually dominates.
//
// Allocation. The free slots of all chunks form one stack threaded through an index array (a
// Treiber stack): Allocate and Free are one compare-and-swap each, O(1), and take no lock, so
// any thread may allocate or free without a global mutex on the hot path. The stack head packs
// a 32-bit slot index with a 32-bit generation that every successful pop and push increments,
// so a slot that is popped and pushed back between another thread's read and its CAS (the ABA
// problem) cannot corrupt the stack. Contended use still bounces one cache line between cores;
// per-thread caches in front of the shared stack are the next step if a benchmark shows it.
//
// Growth. Only an Allocate that finds the stack empty leaves the lock-free path: it takes the
// growth mutex, pops again (another thread may have grown the pool or freed a slot while it
// waited), and if the stack is still empty adds a chunk, keeps its first slot, and pushes the rest
// in one CAS. So a thread that finds the pool empty while another grows it waits for that growth
// instead of failing. The mutex is held across the allocation and ibv_reg_mr (up to a millisecond
// or so for 1 MiB), so such a thread -- a poller reposting RECVs, say -- stalls that long; threads
// that find a free slot, and every Free, go on lock-free meanwhile. Allocate returns kNoSlot only
// when the pool is at max_slots with every slot in use, or when growing failed: the thread that
// tried, and every thread that was waiting for that attempt, get kNoSlot (they do not each retry a
// registration that just failed); the next Allocate to find the pool empty tries again, since
// memory may have been freed or the limit raised meanwhile. growth_error() keeps the most recent
// failure.
//
// Why growth is safe next to the lock-free readers. A new chunk's entry in the chunk table, its
// slots' bookkeeping, and slot_count() are all written before its slots are pushed onto the
// stack by a release CAS; every pop is an acquire CAS on the same head, so whoever pops a slot
// of the new chunk sees all of it. Entries are written once and read as atomics, so a reader
// never tears one, and the table never moves. A thread that did not allocate the slot itself
// must learn the index by a path that synchronizes with the allocation (a mutex, an atomic, a
// completion of a work request posted after it): the same rule that already holds for the
// slot's bytes. Free checks the index against slot_count(), which grows only after the chunk's
// bookkeeping is written.
//
// Caches. A thread that takes and gives back slots all the time -- a poller's loop, whose batch
// builds messages and frees the slots of sends that completed -- keeps a few free slots of its own
// in a SlotCache: taking one from it and giving one back are a plain load and store, where the
// shared stack costs a compare-and-swap each way (and Free an exchange more). A cache holds at most
// SlotCache::kCapacity slots; past that a freed slot goes to the stack, and an empty cache takes
// from it. Slots in a cache count as free (available()): they are, only not to other threads.
//
// Ownership. A slot index belongs to exactly one owner between Allocate and Free: the caller
// building a message, then the connection while the SEND is in flight, or the connection while a
// RECV is posted, then the handler reading it. Free checks that the slot was allocated, so a
// double free is reported instead of silently corrupting the stack.
//
// Lifetime. The pool must outlive every connection that posts its slots, and its protection
// domain must outlive the pool (Device owns both, in that order).
#ifndef ZRPC_TRANSPORT_SLOT_POOL_H_
#define ZRPC_TRANSPORT_SLOT_POOL_H_

#include <infiniband/verbs.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "transport/options.h"
#include "transport/verbs_owners.h"

namespace zrpc::transport {

class SlotCache;

class SlotPool {
 public:
  static constexpr uint32_t kNoSlot = UINT32_MAX;

  // Validates `options` (kInvalidArgument naming the option), then allocates the first chunk and
  // registers it with `pd` (its failure is Create's: kResourceExhausted or ibv_reg_mr's status,
  // with the RLIMIT_MEMLOCK hint). With a null `pd` no memory is registered (every lkey is 0):
  // for tests without a device, and for transports without RDMA. `pd` must outlive the pool.
  static absl::StatusOr<std::unique_ptr<SlotPool>> Create(ibv_pd* pd,
                                                          const SlotPoolOptions& options);
  SlotPool(const SlotPool&) = delete;
  SlotPool& operator=(const SlotPool&) = delete;
  ~SlotPool();

  // A free slot's index, or kNoSlot when every slot is in use and the pool cannot grow (it is at
  // max_slots, or adding a chunk failed: see growth_error()). Any thread. Lock-free while a free
  // slot exists; when none does, takes the growth mutex and may allocate and register a chunk
  // (a millisecond or so), or waits for the thread that is doing so.
  uint32_t Allocate();
  // Returns slot `index` to the pool. FailedPrecondition if no such slot exists or it is not
  // allocated (a double free); the pool is left unchanged then. Lock-free; any thread.
  absl::Status Free(uint32_t index);

  // The slot's first byte and the lkey of its chunk's MR (0 without a pd), for an index that
  // Allocate returned. O(1), no lock, any thread (see the header comment for how the index must
  // reach that thread).
  uint8_t* data(uint32_t index) const {
    return chunks_[index >> chunk_shift_].base.load(std::memory_order_relaxed) +
           size_t{index & chunk_mask_} * slot_size_;
  }
  uint32_t lkey(uint32_t index) const {
    return chunks_[index >> chunk_shift_].lkey.load(std::memory_order_relaxed);
  }

  // The slot that contains `p`, or kNoSlot if `p` is in no slot. Searches the chunks one by one
  // (O(chunks)): for diagnostics and checks, not the hot path, which carries indices.
  uint32_t IndexOf(const void* p) const;

  size_t slot_size() const { return slot_size_; }
  // Slots that exist now (in every chunk registered so far); only grows.
  uint32_t slot_count() const { return slot_count_.load(std::memory_order_acquire); }
  // Slots per chunk: SlotPoolOptions::slot_count rounded up to a power of two.
  uint32_t chunk_slots() const { return chunk_mask_ + 1; }
  // The cap, SlotPoolOptions::max_slots.
  uint32_t max_slots() const { return max_slots_; }
  // Bytes of all chunks (whole pages), registered when the pool has a pd: what the pool counts
  // against RLIMIT_MEMLOCK. For diagnostics.
  size_t registered_bytes() const { return registered_bytes_.load(std::memory_order_relaxed); }
  // Slots that exist and are not allocated right now, counted (O(slot_count): for diagnostics and
  // tests, not the hot path; exact when no other thread is allocating or freeing).
  uint32_t available() const;
  // Why the most recent failed attempt to add a chunk failed (allocation, or ibv_reg_mr with its
  // errno and the RLIMIT_MEMLOCK hint); OK if growing never failed. It is kept after later
  // attempts succeed: when Allocate returns kNoSlot, slot_count() < max_slots() tells that
  // growth, not the cap, was the reason. Takes the growth mutex.
  absl::Status growth_error() const;
  // The error for an Allocate that returned kNoSlot, a slot being wanted `for_what`: the cap
  // reached (kResourceExhausted, naming max_slots) or growth failed (its reason).
  absl::Status ExhaustedError(const std::string& for_what) const;

 private:
  SlotPool() = default;

  static constexpr uint32_t kEnd = UINT32_MAX;  // end of the free stack
  static uint64_t Pack(uint32_t index, uint32_t generation) {
    return uint64_t{generation} << 32 | index;
  }

  // A chunk as the hot path sees it. Written once, by the thread that adds the chunk, before any
  // of its slots can be popped; atomics so that readers on other threads never race with that
  // write, relaxed because the pop that hands out a slot already orders them.
  struct ChunkEntry {
    std::atomic<uint8_t*> base{nullptr};
    std::atomic<uint32_t> lkey{0};
  };
  // What a chunk owns. The MR is declared after the memory, so it is deregistered first.
  struct ChunkOwner {
    PageBuffer memory;
    MrOwner mr;
  };

  friend class SlotCache;

  uint32_t Pop();
  void Push(uint32_t top, uint32_t bottom);  // a chain already linked from top to bottom
  // Free's checks and marking, without the push. `shared`: with an exchange, so that of two
  // threads freeing one slot only one succeeds. Without (a cache's): a load and a store, which
  // catch a double free on the cache's thread but not one that races with another thread's.
  absl::Status MarkFree(uint32_t index, bool shared);
  uint32_t AllocateSlow();
  // Adds a chunk and returns its first slot, allocated; its other slots go on the stack.
  absl::StatusOr<uint32_t> GrowLocked();  // with grow_mu_ held

  ibv_pd* pd_ = nullptr;
  size_t slot_size_ = 0;
  uint32_t chunk_shift_ = 0;  // log2 of the slots per chunk
  uint32_t chunk_mask_ = 0;   // slots per chunk - 1
  uint32_t max_slots_ = 0;
  // max_slots / slots per chunk, rounded up, entries; fixed at Create so readers never see it move.
  std::unique_ptr<ChunkEntry[]> chunks_;
  // next_[i]: the slot below i on the free stack. in_use_[i]: 1 between Allocate and Free. Sized
  // for max_slots; entries of a chunk are written before its slots are published.
  std::unique_ptr<std::atomic<uint32_t>[]> next_;
  std::unique_ptr<std::atomic<uint8_t>[]> in_use_;
  std::atomic<uint32_t> slot_count_{0};
  std::atomic<size_t> registered_bytes_{0};
  // Counts finished growth attempts, so a thread that waited for an attempt can tell it happened.
  std::atomic<uint64_t> growth_attempts_{0};

  // Guards growth and the three members after it. A std::mutex, not the absl::Mutex used
  // elsewhere: Debian's prebuilt Abseil is not instrumented for ThreadSanitizer, which then cannot
  // see what an absl::Mutex orders, while it does see pthread mutexes.
  mutable std::mutex grow_mu_;
  std::vector<ChunkOwner> owners_;
  absl::Status growth_error_;
  bool last_growth_failed_ = false;

  alignas(64) std::atomic<uint64_t> head_{Pack(kEnd, 0)};
};

// A few free slots of one pool, for one thread at a time (see "Caches" above): a poller's loop
// keeps one (Poller), used by its thread only. Gives its slots back to the pool when destroyed
// or flushed; the pool must outlive it.
class SlotCache {
 public:
  static constexpr uint32_t kCapacity = 32;

  explicit SlotCache(SlotPool& pool) : pool_(pool) {}
  SlotCache(const SlotCache&) = delete;
  SlotCache& operator=(const SlotCache&) = delete;
  ~SlotCache() { Flush(); }

  SlotPool& pool() const { return pool_; }
  // A slot from the cache, else from the pool (SlotPool::Allocate, kNoSlot included).
  uint32_t Allocate() {
    if (count_ == 0) return pool_.Allocate();
    const uint32_t index = slots_[--count_];
    pool_.in_use_[index].store(1, std::memory_order_relaxed);
    return index;
  }
  // Gives `index` back: to the cache while it has room, else to the pool. Fails as
  // SlotPool::Free does for a slot that does not exist or is not allocated.
  absl::Status Free(uint32_t index) {
    if (count_ == kCapacity) return pool_.Free(index);
    absl::Status marked = pool_.MarkFree(index, /*shared=*/false);
    if (marked.ok()) slots_[count_++] = index;
    return marked;
  }
  // Every cached slot back to the pool's stack.
  void Flush();
  uint32_t cached() const { return count_; }

 private:
  SlotPool& pool_;
  uint32_t count_ = 0;
  uint32_t slots_[kCapacity];
};

}  // namespace zrpc::transport

#endif  // ZRPC_TRANSPORT_SLOT_POOL_H_
