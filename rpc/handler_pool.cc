#include "rpc/handler_pool.h"

#include <algorithm>

namespace zrpc::internal {

HandlerPool::HandlerPool(int threads) {
  const int n = std::max(threads, 1);
  threads_.reserve(n);
  for (int i = 0; i < n; ++i) threads_.emplace_back([this] { Loop(); });
}

HandlerPool::~HandlerPool() { Shutdown(); }

void HandlerPool::Submit(PoolTask* task) {
  {
    absl::MutexLock lock(&mu_);
    if (!stopping_) {
      task->next_ = nullptr;
      if (tail_ != nullptr) {
        tail_->next_ = task;
      } else {
        head_ = task;
      }
      tail_ = task;
      return;
    }
  }
  task->Run();
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
            return pool->head_ != nullptr || pool->stopping_;
          },
          this));
      if (head_ == nullptr) return;  // stopping, and everything queued has run
      task = head_;
      head_ = task->next_;
      if (head_ == nullptr) tail_ = nullptr;
    }
    task->Run();
  }
}

}  // namespace zrpc::internal
