// HandlerPool: the threads blocking handlers run on.

#include "rpc/server/handler_pool.h"

#include <algorithm>

#include "transport/adaptive_spin.h"

namespace zrpc::internal {
HandlerPool::HandlerPool(int threads, absl::Duration spin)
    : spin_cap_ns_(std::clamp<int64_t>(absl::ToInt64Nanoseconds(spin), 0, 1'000'000'000)) {
  const int n = std::max(threads, 1);
  threads_.reserve(n);
  for (int i = 0; i < n; ++i) threads_.emplace_back([this] { Loop(); });
}

HandlerPool::~HandlerPool() { Shutdown(); }

void HandlerPool::Submit(PoolQueue& queue, PoolTask* task) {
  {
    absl::MutexLock lock(&mu_);
    if (!stopping_) {
      task->next_ = nullptr;
      const bool was_empty = queue.head_ == nullptr;
      if (was_empty) {
        queue.head_ = task;
      } else {
        queue.tail_->next_ = task;
      }
      queue.tail_ = task;
      if (was_empty) PushReadyLocked(&queue);  // its turn comes after the queues waiting
      return;
    }
  }
  task->Run();
}

PoolTask* HandlerPool::TakeLocked() {
  PoolQueue* queue = ready_head_;
  if (queue == nullptr) return nullptr;
  ready_head_ = queue->next_ready_;
  if (ready_head_ == nullptr) {
    ready_tail_ = nullptr;
    if (!stopping_) has_work_.store(false, std::memory_order_relaxed);
  }
  PoolTask* task = queue->head_;
  queue->head_ = task->next_;
  if (queue->head_ == nullptr) {
    queue->tail_ = nullptr;  // out of the ring until its next task
  } else {
    PushReadyLocked(queue);  // more to do: back of the ring
  }
  return task;
}

void HandlerPool::PushReadyLocked(PoolQueue* queue) {
  queue->next_ready_ = nullptr;
  if (ready_tail_ != nullptr) {
    ready_tail_->next_ready_ = queue;
  } else {
    ready_head_ = queue;
    has_work_.store(true, std::memory_order_release);
  }
  ready_tail_ = queue;
}

void HandlerPool::Shutdown() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    has_work_.store(true, std::memory_order_release);  // the spinner stops polling
  }
  for (std::thread& thread : threads_) {
    if (thread.joinable()) thread.join();
  }
}

HandlerPool::Stats HandlerPool::stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

bool HandlerPool::PollForWork(int64_t budget_ns) {
  const int64_t until = transport::SpinClockNanos() + budget_ns;
  do {
    for (int i = 0; i < 64; ++i) {
      if (has_work_.load(std::memory_order_acquire)) return true;
      transport::SpinPause();
    }
  } while (transport::SpinClockNanos() < until);
  return has_work_.load(std::memory_order_acquire);
}

void HandlerPool::Loop() {
  // This worker's budget learns from its idle stretches: from the end of one task to the start
  // of the next, parked or not (adaptive_spin.h).
  transport::AdaptiveSpin spin;
  int64_t idle_since = 0;  // 0 before the first task
  for (;;) {
    bool spun = false;
    bool caught = false;
    if (spin_cap_ns_ > 0 && !spinner_.load(std::memory_order_relaxed) &&
        !spinner_.exchange(true, std::memory_order_acquire)) {
      spun = true;
      const int64_t budget = spin.BudgetNanos(spin_cap_ns_);
      caught = budget > 0 && PollForWork(budget);
    }
    PoolTask* task;
    {
      absl::MutexLock lock(&mu_);
      // The spinner gives its role up under the lock, so parked workers' conditions are looked
      // at again when this unlock comes: a task it leaves is never stranded.
      if (spun) spinner_.store(false, std::memory_order_relaxed);
      mu_.Await(absl::Condition(
          +[](HandlerPool* pool) ABSL_NO_THREAD_SAFETY_ANALYSIS {
            return (pool->ready_head_ != nullptr &&
                    !pool->spinner_.load(std::memory_order_relaxed)) ||
                   pool->stopping_;
          },
          this));
      task = TakeLocked();
      if (task == nullptr) return;  // stopping, and everything queued has run
      ++stats_.tasks;
      if (caught) ++stats_.caught_spinning;
    }
    if (spin_cap_ns_ > 0) {
      if (idle_since != 0) spin.Observe(transport::SpinClockNanos() - idle_since, spin_cap_ns_);
    }
    task->Run();
    if (spin_cap_ns_ > 0) idle_since = transport::SpinClockNanos();
  }
}

}  // namespace zrpc::internal
