// HandlerPool: the threads a server runs handlers on when they must not run on a poller thread.
//
// Why a pool at all. A handler inline on the poller thread is the fastest path (no hand-off, no
// wake-up), but while it runs every other connection on that poller waits, and a handler that
// blocks (a lock, a disk read, a call to another service) stalls them all: brpc's users hit
// exactly this (runtime-anchors.md). So handlers run here by default; a method whose handler is
// short and never blocks can opt into running inline (ServerOptions, per method).
//
// Shape. A fixed number of threads serve one queue per connection (PoolQueue), round robin:
// each turn takes one task from the queue at the head of the ready ring and puts that queue
// back at the tail if it has more. A client that floods the server with calls thus waits for
// its own, and another client's call waits for at most one task of each connection queued
// ahead of it, not for the whole flood (one FIFO for all let one connection's burst delay every
// other client by the burst's length). Within a connection, calls run in the order they
// arrived. Tasks and queues are intrusive (the call object is the task, the connection owns its
// queue), so queueing allocates nothing; one mutex guards the ring. Shutdown runs every queued
// task first (a queued call must still be answered), then joins the threads.
//
// Spin, then park. A worker that finds nothing to do sleeps on the mutex, and the next task then
// costs a wake-up (a futex call by the submitter, a context switch): more than an RDMA round
// trip. So one idle worker at a time (the spinner) polls for the next task before it parks, for
// an adaptive budget (transport/adaptive_spin.h: about twice the gaps between its tasks, at most
// ServerOptions::spin, none while tasks come sparser than that). The sleepers are not woken for
// a task the spinner will take; only one spins, so idle workers never take the pollers' cores.
#ifndef ZRPC_RPC_SERVER_HANDLER_POOL_H_
#define ZRPC_RPC_SERVER_HANDLER_POOL_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

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

// The tasks of one connection. Must outlive its queued tasks (the connection does: its calls
// hold it). Touched only by the pool, under the pool's lock.
class PoolQueue {
 private:
  friend class HandlerPool;
  PoolTask* head_ = nullptr;
  PoolTask* tail_ = nullptr;
  PoolQueue* next_ready_ = nullptr;  // in the pool's ring of queues with tasks
};

class HandlerPool {
 public:
  // Starts `threads` (at least 1) threads. `spin`: the most an idle worker polls before it
  // parks (zero: park at once).
  explicit HandlerPool(int threads, absl::Duration spin = absl::ZeroDuration());
  // Shutdown().
  ~HandlerPool();
  HandlerPool(const HandlerPool&) = delete;
  HandlerPool& operator=(const HandlerPool&) = delete;

  // Queues `task` on `queue` to run on a pool thread. After Shutdown, runs it on the caller's
  // thread.
  void Submit(PoolQueue& queue, PoolTask* task);
  // Runs what is queued, then stops and joins the threads. Idempotent.
  void Shutdown();

  size_t threads() const { return threads_.size(); }

  struct Stats {
    uint64_t tasks = 0;            // taken by a worker
    uint64_t caught_spinning = 0;  // of those, by the spinner while it polled: no wake-up
  };
  Stats stats() const;

 private:
  void Loop();
  // Takes the next task, round robin over the queues; null when none.
  PoolTask* TakeLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Puts `queue` at the back of the ring.
  void PushReadyLocked(PoolQueue* queue) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // The spinner's poll, until `budget_ns` passes or there is work; whether there is.
  bool PollForWork(int64_t budget_ns);

  const int64_t spin_cap_ns_;
  mutable absl::Mutex mu_;
  // Queues with tasks, in turn order.
  PoolQueue* ready_head_ ABSL_GUARDED_BY(mu_) = nullptr;
  PoolQueue* ready_tail_ ABSL_GUARDED_BY(mu_) = nullptr;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  // Written under mu_ (the ring became non-empty or empty, or stopping): what the spinner polls
  // without the lock.
  std::atomic<bool> has_work_{false};
  // Whether a worker spins. Claimed without the lock (exchange), given up under it: parked
  // workers wait for `ready_head_ && !spinner_`, re-checked when the spinner's unlock follows.
  std::atomic<bool> spinner_{false};
  Stats stats_ ABSL_GUARDED_BY(mu_);
  std::vector<std::thread> threads_;
};

}  // namespace zrpc::internal

#endif  // ZRPC_RPC_SERVER_HANDLER_POOL_H_
