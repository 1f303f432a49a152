// CallCounts: a server's calls started and calls retired, counted per thread.
//
// Why per thread. Every call is counted twice, when its request is dispatched (on the poller, in
// its batch) and when it retires (wherever its handler finished). One shared counter would cost
// an atomic add each time, with a cache line that bounces between the pollers and the handler
// threads. Here each thread adds to a shard of its own with a load and a store: one writer per
// shard, so nothing is lost, and no locked instruction. The shard index is the one the method
// metrics use (rpc/metrics.h, internal::MetricsThreadIndex): threads past MethodMetrics::kMaxShards
// share one more shard, with atomic adds.
//
// Reading. started() and in_flight() sum the shards. in_flight() reads every shard's retired
// count before any shard's started count: a call counted retired was counted started before (on
// whichever thread), so the difference is never below the calls that were really running at
// some instant of the reading, and is zero only if every call started by the time it read the
// started counts had retired by then. That is what Shutdown waits for: a retirement is a call's
// last touch of the server (its release store is what the reader's acquire load sees).
//
// Threads: any.
#ifndef ZRPC_RPC_SERVER_CALL_COUNTS_H_
#define ZRPC_RPC_SERVER_CALL_COUNTS_H_

#include <array>
#include <atomic>
#include <cstdint>

#include "rpc/metrics.h"

namespace zrpc::internal {

class CallCounts {
 public:
  CallCounts() = default;
  CallCounts(const CallCounts&) = delete;
  CallCounts& operator=(const CallCounts&) = delete;
  ~CallCounts() {
    for (auto& shard : shards_) delete shard.load(std::memory_order_relaxed);
  }

  void Started() { Bump(&Shard::started); }
  void Retired() { Bump(&Shard::retired); }

  uint64_t started() const {
    uint64_t sum = 0;
    ForEachShard([&](const Shard& shard) { sum += shard.started.load(std::memory_order_relaxed); });
    return sum;
  }
  // Started and not yet retired (see "Reading").
  uint64_t in_flight() const {
    uint64_t retired = 0, started = 0;
    ForEachShard(
        [&](const Shard& shard) { retired += shard.retired.load(std::memory_order_acquire); });
    ForEachShard(
        [&](const Shard& shard) { started += shard.started.load(std::memory_order_acquire); });
    return started > retired ? started - retired : 0;
  }

 private:
  struct alignas(64) Shard {
    std::atomic<uint64_t> started{0};
    std::atomic<uint64_t> retired{0};
  };

  void Bump(std::atomic<uint64_t> Shard::*counter) {
    const int index = MetricsThreadIndex();
    if (index < 0) {
      (shared_.*counter).fetch_add(1, std::memory_order_acq_rel);
      return;
    }
    Shard* shard = shards_[index].load(std::memory_order_relaxed);
    if (shard == nullptr) {
      // Only the thread holding `index` writes this entry (an earlier holder may have made it).
      shard = new Shard;
      shards_[index].store(shard, std::memory_order_release);
    }
    std::atomic<uint64_t>& count = shard->*counter;
    count.store(count.load(std::memory_order_relaxed) + 1, std::memory_order_release);
  }

  template <typename F>
  void ForEachShard(F f) const {
    f(shared_);
    for (const auto& entry : shards_) {
      if (const Shard* shard = entry.load(std::memory_order_acquire)) f(*shard);
    }
  }

  std::array<std::atomic<Shard*>, MethodMetrics::kMaxShards> shards_{};
  Shard shared_;
};

}  // namespace zrpc::internal

#endif  // ZRPC_RPC_SERVER_CALL_COUNTS_H_
