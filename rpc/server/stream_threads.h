// StreamThreads: the threads a server runs its streaming handlers on, one per stream, bounded.
//
// Why not the handler pool. A streaming handler lives as long as its stream, and blocks while
// its client is slow to read or to write: on the pool, a few slow streams would take every pool
// thread and the unary calls of every connection would wait behind them. A thread per stream
// costs a thread start (tens of microseconds) per stream, which a stream amortizes, and the
// bounds (per connection: ServerConnection; here: the server's) keep a hostile client from
// making threads without end.
//
// Threads that finished are joined by the next Start, and all by JoinAll (Shutdown, after every
// call finished), so none outlives the server.
#ifndef ZRPC_RPC_SERVER_STREAM_THREADS_H_
#define ZRPC_RPC_SERVER_STREAM_THREADS_H_

#include <cstdint>
#include <functional>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"

namespace zrpc::internal {

class StreamThreads {
 public:
  explicit StreamThreads(int max_threads) : max_(max_threads) {}
  ~StreamThreads() { JoinAll(); }

  // Runs `body` on a new thread. kResourceExhausted when max_threads run already (naming
  // ServerOptions::max_streams) or the system refuses a thread; `body` does not run then.
  absl::Status Start(std::function<void()> body);
  // Waits for every thread started to return.
  void JoinAll();
  uint64_t started() const;
  uint64_t running() const;

 private:
  void Finished(uint64_t id);

  const int max_;
  mutable absl::Mutex mu_;
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  uint64_t started_ ABSL_GUARDED_BY(mu_) = 0;
  absl::flat_hash_map<uint64_t, std::thread> running_ ABSL_GUARDED_BY(mu_);
  std::vector<std::thread> finished_ ABSL_GUARDED_BY(mu_);  // returned, not yet joined
};

}  // namespace zrpc::internal

#endif  // ZRPC_RPC_SERVER_STREAM_THREADS_H_
