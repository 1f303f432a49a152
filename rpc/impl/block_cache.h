// BlockCache: a few heap blocks a thread freed, kept for its next allocation of the same size, so
// that an object made and destroyed once per call on one thread costs no malloc and no free.
//
// What uses it. PendingCall (rpc/pending_call.h): an AsyncService's handler gets its call in a
// std::unique_ptr, made on the poller thread that dispatched the call; a handler that answers in
// place (inline, the default for an AsyncService's unary methods) destroys it on that thread, so
// the block comes back to the cache the next call takes it from. And a client call's SlotTicket
// (rpc/client/channel.cc), made and destroyed on the caller's thread as the call starts.
//
// Bounds. Up to kBlocks blocks per thread, of any sizes (a lookup compares sizes: a server's
// async methods have a handful of PendingCall types). A thread that frees blocks another thread
// made (a handler finishing calls from a thread of its own) fills its cache once and frees the
// rest; the making thread then allocates as it would without a cache. Nothing grows without
// bound, and the cache frees its blocks when its thread exits. Used during thread exit after the
// cache is gone (another thread_local's destructor destroying a PendingCall), blocks come from
// and go to the heap.
//
// Under AddressSanitizer a cached block is poisoned: a use after its object was destroyed is
// reported as it would be after a free.
//
// rpc/impl/ is for generated code and the runtime, not for applications: nothing here is a
// stable API, and any of it may change in any release (rpc/impl/README.md).
#ifndef ZRPC_RPC_IMPL_BLOCK_CACHE_H_
#define ZRPC_RPC_IMPL_BLOCK_CACHE_H_

#include <cstddef>
#include <new>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#define ZRPC_POISON_BLOCK(block, size) ASAN_POISON_MEMORY_REGION(block, size)
#define ZRPC_UNPOISON_BLOCK(block, size) ASAN_UNPOISON_MEMORY_REGION(block, size)
#else
#define ZRPC_POISON_BLOCK(block, size) static_cast<void>(0)
#define ZRPC_UNPOISON_BLOCK(block, size) static_cast<void>(0)
#endif

namespace zrpc {
namespace internal {

class BlockCache {
 public:
  static constexpr int kBlocks = 8;

  BlockCache() = default;
  BlockCache(const BlockCache&) = delete;
  BlockCache& operator=(const BlockCache&) = delete;
  ~BlockCache();

  // A block of `size` bytes: a cached one of that size, else a new one.
  void* Take(::std::size_t size) {
    for (int i = count_ - 1; i >= 0; --i) {
      if (sizes_[i] != size) continue;
      void* block = blocks_[i];
      --count_;
      blocks_[i] = blocks_[count_];
      sizes_[i] = sizes_[count_];
      ZRPC_UNPOISON_BLOCK(block, size);
      return block;
    }
    return ::operator new(size);
  }
  // Keeps `block` (from Take, or from operator new, of `size` bytes) while there is room, else
  // frees it.
  void Give(void* block, ::std::size_t size) noexcept {
    if (count_ == kBlocks) {
      ::operator delete(block);
      return;
    }
    ZRPC_POISON_BLOCK(block, size);
    blocks_[count_] = block;
    sizes_[count_] = size;
    ++count_;
  }

 private:
  void* blocks_[kBlocks];
  ::std::size_t sizes_[kBlocks];
  int count_ = 0;
};

// Set by the thread's cache when it is destroyed; trivially destructible, so it stays readable
// to the thread's end.
inline thread_local bool block_cache_gone = false;
inline thread_local BlockCache block_cache;

inline BlockCache::~BlockCache() {
  for (int i = 0; i < count_; ++i) {
    ZRPC_UNPOISON_BLOCK(blocks_[i], sizes_[i]);
    ::operator delete(blocks_[i]);
  }
  count_ = 0;
  block_cache_gone = true;
}

// The calling thread's cache, or the heap once it is gone.
inline void* TakeBlock(::std::size_t size) {
  return block_cache_gone ? ::operator new(size) : block_cache.Take(size);
}
inline void GiveBlock(void* block, ::std::size_t size) noexcept {
  if (block == nullptr) return;
  if (block_cache_gone) {
    ::operator delete(block);
  } else {
    block_cache.Give(block, size);
  }
}

}  // namespace internal
}  // namespace zrpc

#undef ZRPC_POISON_BLOCK
#undef ZRPC_UNPOISON_BLOCK

#endif  // ZRPC_RPC_IMPL_BLOCK_CACHE_H_
