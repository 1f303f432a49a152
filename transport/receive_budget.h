// ReceiveBudget: the receives of a poller's shared queue, as credits its connections may grant.
//
// Why. With a shared receive queue (shared_receive_queue.h) a connection's receive window is not
// receives of its own but a claim on the queue's. The claims must never sum to more than the
// queue posts, or a peer that keeps to its credits could meet receiver-not-ready. Fixed windows
// made the queue grow with connections × window (32 × 4 KiB per connection by default). Here
// each connection claims a small floor at admission (ConnectionOptions::idle_recv_credits) and
// grows its window from what is free while its peer uses it, up to recv_credits; it shrinks back
// as the peer's traffic eases, or at once when the budget runs low (credits.h says when). An
// idle connection thus claims its floor, a busy one what it needs.
//
// The budget keeps an eighth of the queue out of reach of growth, for the floors of connections
// yet to come: growth alone never refuses an admission. What admission refuses is a floor the
// free receives cannot back.
//
// ReceiveShare: one connection's claim, so that whatever it holds goes back exactly once, even
// when its domain still runs (a task left there) as the poller takes it back at Unregister.
//
// Threads: any. A share's Grow and Give run in its connection's domain (one at a time); Close
// from the poller under its lock.
#ifndef ZRPC_TRANSPORT_RECEIVE_BUDGET_H_
#define ZRPC_TRANSPORT_RECEIVE_BUDGET_H_

#include <algorithm>
#include <atomic>
#include <cstdint>

namespace zrpc::transport {

class ReceiveBudget {
 public:
  explicit ReceiveBudget(uint32_t receives)
      : size_(receives), growth_reserve_(receives / 8), free_(receives) {}
  ReceiveBudget(const ReceiveBudget&) = delete;
  ReceiveBudget& operator=(const ReceiveBudget&) = delete;

  uint32_t size() const { return size_; }
  uint32_t claimed() const { return size_ - static_cast<uint32_t>(free()); }
  int64_t free() const { return free_.load(std::memory_order_relaxed); }
  // Under a quarter free: every window above its floor shrinks at its next release.
  bool low() const { return free() < size_ / 4; }

  // Takes `n` (a connection's floor at admission); false, taking nothing, if fewer are free.
  bool Take(uint32_t n) { return TakeAbove(n, 0) == n; }
  // Takes up to `want` for growth, leaving the reserve kept for floors; returns what it took.
  uint32_t TakeForGrowth(uint32_t want) {
    int64_t free = free_.load(std::memory_order_relaxed);
    for (;;) {
      const int64_t n = std::min<int64_t>(want, free - growth_reserve_);
      if (n <= 0) return 0;
      if (free_.compare_exchange_weak(free, free - n, std::memory_order_relaxed)) {
        return static_cast<uint32_t>(n);
      }
    }
  }
  void Give(uint32_t n) { free_.fetch_add(n, std::memory_order_relaxed); }

 private:
  // All of `n` or nothing, leaving at least `keep` free.
  uint32_t TakeAbove(uint32_t n, int64_t keep) {
    int64_t free = free_.load(std::memory_order_relaxed);
    for (;;) {
      if (free - keep < n) return 0;
      if (free_.compare_exchange_weak(free, free - n, std::memory_order_relaxed)) return n;
    }
  }

  const uint32_t size_;
  const int64_t growth_reserve_;
  std::atomic<int64_t> free_;
};

class ReceiveShare {
 public:
  ReceiveShare() = default;
  ReceiveShare(const ReceiveShare&) = delete;
  ReceiveShare& operator=(const ReceiveShare&) = delete;

  // The floor the poller took at admission becomes this share's.
  void Open(ReceiveBudget* budget, uint32_t floor) {
    budget_ = budget;
    held_.store(floor, std::memory_order_relaxed);
  }
  bool open() const { return budget_ != nullptr && !closed_.load(std::memory_order_acquire); }
  uint32_t held() const { return held_.load(std::memory_order_relaxed); }
  bool low() const { return budget_ != nullptr && budget_->low(); }

  // Up to `want` more receives from the budget (none once closed).
  uint32_t Grow(uint32_t want) {
    if (!open()) return 0;
    const uint32_t taken = budget_->TakeForGrowth(want);
    if (taken == 0) return 0;
    held_.fetch_add(taken, std::memory_order_seq_cst);
    // Close took what was held before this add, or will take it with it; if Close has run, what
    // was just added goes back here (held_'s exchange hands each receive to one of the two).
    if (closed_.load(std::memory_order_seq_cst)) budget_->Give(held_.exchange(0));
    return taken;
  }
  // Gives one receive back; false (nothing given) when none is held, as after Close.
  bool GiveOne() {
    uint32_t held = held_.load(std::memory_order_relaxed);
    do {
      if (held == 0) return false;
    } while (!held_.compare_exchange_weak(held, held - 1, std::memory_order_seq_cst));
    budget_->Give(1);
    return true;
  }
  // Gives everything back; Grow takes nothing afterwards.
  void Close() {
    if (budget_ == nullptr) return;
    closed_.store(true, std::memory_order_seq_cst);
    budget_->Give(held_.exchange(0, std::memory_order_seq_cst));
  }

 private:
  ReceiveBudget* budget_ = nullptr;
  std::atomic<uint32_t> held_{0};
  std::atomic<bool> closed_{false};
};

}  // namespace zrpc::transport

#endif  // ZRPC_TRANSPORT_RECEIVE_BUDGET_H_
