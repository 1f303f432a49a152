// ObjectPool: up to kCapacity objects of one type, made on first use and reused, handed out and
// given back by any thread without a lock.
//
// Why not the per-thread block cache (rpc/impl/block_cache.h). A client's start left in a
// connection's domain is made on the caller's thread and freed on whichever thread held the
// domain (the poller): a per-thread cache would fill on the poller and run dry on the caller, one
// malloc per left start. A pool per connection gives the object back where the next caller finds
// it.
//
// How. The free objects form a stack threaded through their slots' `next` indices (a Treiber
// stack); the head packs a 32-bit slot index + 1 (0: empty) with a 32-bit generation that every
// pop bumps, so a slot popped and pushed back between another thread's read and its
// compare-and-swap cannot corrupt the stack (ABA). One compare-and-swap to take, one to give. The
// slots are allocated at the first Take, so an idle connection pays nothing. When every object is
// out, Take returns null and the caller makes one of its own (Owns tells them apart at Give).
#ifndef ZRPC_RPC_COMMON_OBJECT_POOL_H_
#define ZRPC_RPC_COMMON_OBJECT_POOL_H_

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace zrpc::internal {

template <typename T, uint32_t kCapacity>
class ObjectPool {
  static_assert(kCapacity > 0 && kCapacity < UINT32_MAX);

 public:
  ObjectPool() = default;
  ObjectPool(const ObjectPool&) = delete;
  ObjectPool& operator=(const ObjectPool&) = delete;
  // Every object must have been given back.
  ~ObjectPool() { delete[] slots_.load(std::memory_order_acquire); }

  // A free object, as the last Give left it (default-constructed the first time), or null when
  // all kCapacity are out. Any thread.
  T* Take() {
    Slot* slots = Slots();
    uint64_t head = head_.load(std::memory_order_acquire);
    while ((head & kIndexMask) != 0) {
      Slot& top = slots[(head & kIndexMask) - 1];
      const uint64_t next = ((head >> 32) + 1) << 32 | top.next.load(std::memory_order_relaxed);
      if (head_.compare_exchange_weak(head, next, std::memory_order_acquire,
                                      std::memory_order_acquire)) {
        return &top.object;
      }
    }
    return nullptr;
  }

  // Whether `object` is one of the pool's (else the caller made it: Take returned null).
  bool Owns(const T* object) const {
    const Slot* slots = slots_.load(std::memory_order_acquire);
    if (slots == nullptr) return false;
    const auto* p = reinterpret_cast<const char*>(object);
    const auto* begin = reinterpret_cast<const char*>(slots);
    return p >= begin && p < begin + sizeof(Slot) * kCapacity;
  }

  // Gives back an object Take returned (Owns). Any thread.
  void Give(T* object) {
    Slot* slots = slots_.load(std::memory_order_acquire);
    const auto index = static_cast<uint32_t>(
        (reinterpret_cast<char*>(object) - reinterpret_cast<char*>(slots)) / sizeof(Slot));
    Slot& slot = slots[index];
    uint64_t head = head_.load(std::memory_order_relaxed);
    for (;;) {
      slot.next.store(static_cast<uint32_t>(head & kIndexMask), std::memory_order_relaxed);
      const uint64_t mine = (head & ~kIndexMask) | (index + 1);
      if (head_.compare_exchange_weak(head, mine, std::memory_order_release,
                                      std::memory_order_relaxed)) {
        return;
      }
    }
  }

 private:
  static constexpr uint64_t kIndexMask = 0xffffffff;
  struct Slot {
    T object;  // first: an object's address is its slot's
    std::atomic<uint32_t> next{0};
  };

  // The slots, made and linked as the free stack at the first call.
  Slot* Slots() {
    Slot* slots = slots_.load(std::memory_order_acquire);
    if (slots != nullptr) return slots;
    auto* fresh = new Slot[kCapacity];
    for (uint32_t i = 0; i < kCapacity; ++i) {
      fresh[i].next.store(i + 1 < kCapacity ? i + 2 : 0, std::memory_order_relaxed);
    }
    if (slots_.compare_exchange_strong(slots, fresh, std::memory_order_acq_rel)) return fresh;
    delete[] fresh;  // another thread made them first (`slots` is theirs)
    return slots;
  }

  std::atomic<Slot*> slots_{nullptr};
  // Slot 0 on top from the start: a thread that sees the slots sees a full stack, never an empty
  // one before they are linked (their links are published with slots_).
  std::atomic<uint64_t> head_{1};
};

}  // namespace zrpc::internal

#endif  // ZRPC_RPC_COMMON_OBJECT_POOL_H_
