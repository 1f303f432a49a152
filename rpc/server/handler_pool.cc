// HandlerPool: the threads blocking handlers run on.

#include "rpc/server/handler_pool.h"

#include <algorithm>

namespace zrpc::internal {

HandlerPool::HandlerPool(int threads) {
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
  if (ready_head_ == nullptr) ready_tail_ = nullptr;
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
  }
  ready_tail_ = queue;
}

void HandlerPool::Shutdown() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  for (std::thread& thread : threads_) {
    if (thread.joinable()) thread.join();
  }
}

void HandlerPool::Loop() {
  for (;;) {
    PoolTask* task;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](HandlerPool* pool) ABSL_NO_THREAD_SAFETY_ANALYSIS {
            return pool->ready_head_ != nullptr || pool->stopping_;
          },
          this));
      task = TakeLocked();
      if (task == nullptr) return;  // stopping, and everything queued has run
    }
    task->Run();
  }
}

}  // namespace zrpc::internal
