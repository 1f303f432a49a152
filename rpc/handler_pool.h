// HandlerPool: the threads a server runs handlers on when they must not run on a poller thread.
//
// Why a pool at all. A handler inline on the poller thread is the fastest path (no hand-off, no
// wake-up), but while it runs every other connection on that poller waits, and a handler that
// blocks (a lock, a disk read, a call to another service) stalls them all: brpc's users hit
// exactly this (runtime-anchors.md). So handlers run here by default; a method whose handler is
// short and never blocks can opt into running inline (ServerOptions, per method).
//
// Shape. A fixed number of threads take tasks from one FIFO (a mutex and a condition variable).
// Tasks are intrusive (the server's call object is the task), so queueing allocates nothing.
// One queue for all threads keeps the order calls arrived in and balances load without work
// stealing; with a few threads and tasks that each take microseconds or more, the lock is not
// the bottleneck. Shutdown runs every queued task first (a queued call must still be answered),
// then joins the threads.
#ifndef ZRPC_RPC_HANDLER_POOL_H_
#define ZRPC_RPC_HANDLER_POOL_H_

#include <cstddef>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace zrpc::internal {

class PoolTask {
 public:
  virtual void Run() = 0;

 protected:
  ~PoolTask() = default;

 private:
  friend class HandlerPool;
  PoolTask* next_ = nullptr;
};

class HandlerPool {
 public:
  // Starts `threads` (at least 1) threads.
  explicit HandlerPool(int threads);
  // Shutdown().
  ~HandlerPool();
  HandlerPool(const HandlerPool&) = delete;
  HandlerPool& operator=(const HandlerPool&) = delete;

  // Queues `task` to run on a pool thread. After Shutdown, runs it on the caller's thread.
  void Submit(PoolTask* task);
  // Runs what is queued, then stops and joins the threads. Idempotent.
  void Shutdown();

  size_t threads() const { return threads_.size(); }

 private:
  void Loop();

  absl::Mutex mu_;
  PoolTask* head_ ABSL_GUARDED_BY(mu_) = nullptr;
  PoolTask* tail_ ABSL_GUARDED_BY(mu_) = nullptr;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

}  // namespace zrpc::internal

#endif  // ZRPC_RPC_HANDLER_POOL_H_
