// ReceiveBudget: the receives of a poller's shared queue, as credits its connections may grant.
//
// Why. With a shared receive queue (shared_receive_queue.h) a connection's receive window is not
// receives of its own but a claim on the queue's. The claims must never sum to more than the
// queue posts, or a peer that keeps to its credits could meet receiver-not-ready. Fixed windows
// made the queue grow with connections × window (32 × 4 KiB per connection by default). Here
// each connection claims a small floor at admission (ConnectionOptions::idle_recv_credits) and
// grows its window while its peer uses it, up to recv_credits; it shrinks back as the peer's
// traffic eases, or at once when growth runs low (credits.h says when). An idle connection that
// was never busy thus claims its floor, a busy one what it needs.
//
// Two pools. Three quarters of the queue back floors, a quarter growth, and neither lends to the
// other. A window shrinks only as its peer's messages come and go, so a peer that grew its window
// and went silent keeps its claim until it is busy again or closes: were growth to take from
// what backs floors, such claims could refuse admissions the poller had said it could take, for
// as long as their peers stay silent. Admission is thus bounded by the floors' pool alone
// (Poller::Capacity), and growth by its own.
//
// Parked windows (credits.h). A poller that parks takes a connection's floor back while its peer
// is idle and someone else waits for one, and lends it again when the peer knocks: admission is
// then bounded by the completion queue, not by floors, and a connection beyond the floors' pool
// starts parked, with none.
//
// ReceiveShare: one connection's claim, so that whatever it holds goes back exactly once, even
// when its domain still runs (a task left there) as the poller takes it back at Unregister.
//
// Threads: any. A share's Grow, GiveOne, GiveBack and TakeFloor run in its connection's domain
// (one at a time); Close from the poller under its lock.
#ifndef ZRPC_TRANSPORT_RECEIVE_BUDGET_H_
#define ZRPC_TRANSPORT_RECEIVE_BUDGET_H_

#include <algorithm>
#include <atomic>
#include <cstdint>

namespace zrpc::transport {

class ReceiveBudget {
 public:
  explicit ReceiveBudget(uint32_t receives)
      : growth_size_(receives / 4),
        floor_size_(receives - growth_size_),
        floor_free_(floor_size_),
        growth_free_(growth_size_) {}
  ReceiveBudget(const ReceiveBudget&) = delete;
  ReceiveBudget& operator=(const ReceiveBudget&) = delete;

  uint32_t size() const { return floor_size_ + growth_size_; }
  // The receives that back floors: Poller::Capacity divides it by a connection's floor.
  uint32_t floor_size() const { return floor_size_; }
  uint32_t growth_size() const { return growth_size_; }
  // Receives claimed now, floors and growth together: never above size().
  uint32_t claimed() const {
    return size() - static_cast<uint32_t>(Load(floor_free_) + Load(growth_free_));
  }
  int64_t floor_free() const { return Load(floor_free_); }
  int64_t growth_free() const { return Load(growth_free_); }
  // Growth under a quarter free, or the device said the queue ran below its low-water mark (see
  // SetDeviceLow): every window above its floor shrinks at its next release.
  bool low() const {
    return device_low_.load(std::memory_order_relaxed) || 4 * Load(growth_free_) < growth_size_;
  }
  // The device reported the queue below its low-water mark: its poller fell behind the arrivals,
  // or the slot pool ran dry. Until the queue is posted full again (SharedReceiveQueue::Rearm),
  // windows grow no more (TakeGrowth gives nothing) and shrink to their floors.
  void SetDeviceLow(bool low) { device_low_.store(low, std::memory_order_relaxed); }
  bool device_low() const { return device_low_.load(std::memory_order_relaxed); }

  // A connection's floor at admission: all of `n` or, when fewer are free, nothing (false).
  bool TakeFloor(uint32_t n) {
    int64_t free = Load(floor_free_);
    do {
      if (free < n) return false;
    } while (!floor_free_.compare_exchange_weak(free, free - n, std::memory_order_relaxed));
    return true;
  }
  void GiveFloor(uint32_t n) { floor_free_.fetch_add(n, std::memory_order_relaxed); }
  // Up to `want` for growth; returns what it took.
  uint32_t TakeGrowth(uint32_t want) {
    if (device_low()) return 0;
    int64_t free = Load(growth_free_);
    int64_t n;
    do {
      n = std::min<int64_t>(want, free);
      if (n <= 0) return 0;
    } while (!growth_free_.compare_exchange_weak(free, free - n, std::memory_order_relaxed));
    return static_cast<uint32_t>(n);
  }
  void GiveGrowth(uint32_t n) { growth_free_.fetch_add(n, std::memory_order_relaxed); }

 private:
  static int64_t Load(const std::atomic<int64_t>& a) { return a.load(std::memory_order_relaxed); }

  const uint32_t growth_size_;
  const uint32_t floor_size_;
  std::atomic<int64_t> floor_free_;
  std::atomic<int64_t> growth_free_;
  std::atomic<bool> device_low_{false};
};

// One connection's claim: its floor (taken at Open, given back and taken again when its window is
// parked and opened), and what its window grew by.
class ReceiveShare {
 public:
  ReceiveShare() = default;
  ReceiveShare(const ReceiveShare&) = delete;
  ReceiveShare& operator=(const ReceiveShare&) = delete;

  // The floor the poller took at admission (TakeFloor) becomes this share's (0: parked).
  void Open(ReceiveBudget* budget, uint32_t floor) {
    budget_ = budget;
    floor_.store(floor, std::memory_order_relaxed);
  }
  bool open() const { return budget_ != nullptr && !closed_.load(std::memory_order_acquire); }
  // The receives claimed: the floor and the growth (0 once closed).
  uint32_t held() const {
    return open() ? floor_.load(std::memory_order_relaxed) + grown_.load(std::memory_order_relaxed)
                  : 0;
  }
  bool low() const { return budget_ != nullptr && budget_->low(); }

  // Up to `want` more receives from the budget's growth (none once closed).
  uint32_t Grow(uint32_t want) {
    if (!open()) return 0;
    const uint32_t taken = budget_->TakeGrowth(want);
    if (taken == 0) return 0;
    grown_.fetch_add(taken, std::memory_order_seq_cst);
    // Close took what had grown before this add, or will take it with it; if Close has run,
    // what was just added goes back here (grown_'s exchange hands each receive to one of the
    // two).
    if (closed_.load(std::memory_order_seq_cst)) budget_->GiveGrowth(grown_.exchange(0));
    return taken;
  }
  // Gives one receive of the growth back; false (nothing given) when none has grown, as after
  // Close.
  bool GiveOne() {
    uint32_t grown = grown_.load(std::memory_order_relaxed);
    do {
      if (grown == 0) return false;
    } while (!grown_.compare_exchange_weak(grown, grown - 1, std::memory_order_seq_cst));
    budget_->GiveGrowth(1);
    return true;
  }
  // A parked window opened again: `n` more of the budget's floors, all or nothing (false: none
  // free, or closed).
  bool TakeFloor(uint32_t n) {
    if (!open() || !budget_->TakeFloor(n)) return false;
    floor_.fetch_add(n, std::memory_order_seq_cst);
    // As in Grow: after Close, what was just added goes back here.
    if (closed_.load(std::memory_order_seq_cst)) budget_->GiveFloor(floor_.exchange(0));
    return true;
  }
  // A window being parked: up to `n` receives back, growth first, then the floor; returns how
  // many went.
  uint32_t GiveBack(uint32_t n) {
    uint32_t given = 0;
    while (given < n && GiveOne()) ++given;
    uint32_t floor = floor_.load(std::memory_order_relaxed);
    uint32_t take;
    do {
      take = std::min(floor, n - given);
      if (take == 0) return given;
    } while (!floor_.compare_exchange_weak(floor, floor - take, std::memory_order_seq_cst));
    budget_->GiveFloor(take);
    return given + take;
  }
  // Gives everything back; Grow and TakeFloor take nothing afterwards.
  void Close() {
    if (budget_ == nullptr || closed_.exchange(true, std::memory_order_seq_cst)) return;
    budget_->GiveFloor(floor_.exchange(0, std::memory_order_seq_cst));
    budget_->GiveGrowth(grown_.exchange(0, std::memory_order_seq_cst));
  }

 private:
  ReceiveBudget* budget_ = nullptr;
  std::atomic<uint32_t> floor_{0};
  std::atomic<uint32_t> grown_{0};
  std::atomic<bool> closed_{false};
};

}  // namespace zrpc::transport

#endif  // ZRPC_TRANSPORT_RECEIVE_BUDGET_H_
