// Retries of unary calls to idempotent methods (ChannelOptions::retry; rpc/channel.h, "Retries").
//
// A retried call keeps its serialized request (RetriedCall) and is made again, attempt after
// attempt, by the channel's Retrier, never by the stub: a blocking call's channel may be
// destroyed at any moment once the call started, and the channel's core (ChannelImpl, which owns
// the Retrier) is what knows when that happens. The stub's call goes as any other until the
// channel sees it is one to retry: ClientChannel::StartUnaryCall hands it to Retrier::Start, and
// a call that found no connection gets a slot of plain memory from AcquireSendSlot all the same
// (SlotForRetry), so that its request is kept too. Between attempts the call waits in the
// RetryQueue for its backoff to end; the retrier thread, started with the first retry, makes the
// attempts that are due, through a ClientChannel of the core's own (the "front") that starts
// calls as they are: the very code a stub's call runs, with no copy of it for the retries (a copy
// changed what the compiler inlined on every call's path: count_instructions). The channel's
// destruction ends the calls waiting (CANCELLED, as it ends the calls in flight), and a
// Cancellation ends a waiting call at once.
//
// What is retried: UNAVAILABLE alone (no connection could be had, or the connection was lost
// while the call was out: then the call may have run, which is why only idempotent methods come
// here). The whole sequence keeps the call's deadline: a backoff that would end past it ends the
// call with the last attempt's error instead.
#ifndef ZRPC_RPC_CLIENT_RETRY_H_
#define ZRPC_RPC_CLIENT_RETRY_H_

#include <google/protobuf/message_lite.h>

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "rpc/bulk.h"
#include "rpc/call_options.h"
#include "rpc/impl/call_interfaces.h"
#include "rpc/options.h"
#include "rpc/service.h"

namespace zrpc::internal {

// One retried call, between and during its attempts.
struct RetriedCall {
  uint64_t id = 0;  // the queue's name for it (RetryQueue::Add), for its Cancellation's hook
  const MethodInfo* method;
  std::string request;  // serialized
  google::protobuf::MessageLite* response;
  IncomingBulk* response_bulk;
  CallOptions options;  // the caller's
  absl::Time deadline;  // monotonic: the caller's deadline or timeout, whichever ends first
  int attempts = 0;     // made so far
  DoneCallback done;    // the caller's, run once

  // The options of the next attempt at `now` (monotonic): the caller's, with what is left of
  // the deadline as the timeout.
  CallOptions AttemptOptions(absl::Time now) const;
  // Whether an attempt that ended with `status` is made again under `policy`, and when
  // (monotonic; `random` draws the jitter, uniform in [0, 1)). False: `done` gets `status`.
  // A cancel is the caller's to look at first (Retrier::Ended).
  bool RetryAt(const absl::Status& status, const ChannelOptions::Retry& policy, absl::Time now,
               double random, absl::Time* at) const;
};

// The wait before retry `n` (n >= 1): drawn from [d/2, d], d = min(max, initial * 2^(n-1)),
// `random` uniform in [0, 1).
absl::Duration RetryBackoff(const ChannelOptions::Retry& policy, int n, double random);

// Retried calls waiting out their backoff, by when they go again, and the wait of the thread
// that makes their attempts (the channel's retrier: attempts may connect, which no runtime
// thread does). Shared with the Cancellation hooks of the calls in it, weakly: a hook may
// outlive the channel.
class RetryQueue {
 public:
  // Queues `call` to go at `at` (monotonic), and has its Cancellation (if any) end it while it
  // waits. False when the queue is closed (the channel is being destroyed): `call` ended here
  // then (CANCELLED).
  static bool Add(const std::shared_ptr<RetryQueue>& queue, absl::Time at,
                  std::unique_ptr<RetriedCall> call);
  // Waits until calls are due (true, with them in `*due`, in order) or the queue is closed
  // (false).
  bool WaitDue(std::vector<std::unique_ptr<RetriedCall>>* due);
  // Ends the call named `id` (CANCELLED) if it waits here; nothing if it does not (an attempt
  // runs: the Cancellation reaches that instead, or it has ended).
  void Cancel(uint64_t id);
  // No call is queued from now on; those waiting end (CANCELLED), and WaitDue returns false.
  void Close();
  bool closed() const;
  // Ends `call` (CANCELLED) as Close ends those waiting: one taken out to go when the channel
  // began to go.
  static void EndClosed(RetriedCall& call);

 private:
  mutable absl::Mutex mu_;
  absl::CondVar changed_;
  std::multimap<absl::Time, std::unique_ptr<RetriedCall>> waiting_ ABSL_GUARDED_BY(mu_);
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
};

// A channel's retries: its queue, and the retrier thread that makes the later attempts through
// `front`, a ClientChannel on the same core that starts calls as they are (the very calls a stub
// makes, with no retry of their own), so that no copy of the call path is made for the retries.
class Retrier {
 public:
  // `front` outlives every attempt: Stop ends them.
  Retrier(const ChannelOptions::Retry& policy, Channel* front) : policy_(policy), front_(front) {}
  ~Retrier();  // after Stop

  // A retried call's first attempt, made by the caller (ClientChannel::StartRetried): `request`
  // is its serialized request, sent in `slot` through the front; or, with `unsent` not OK, that
  // attempt found no connection and is over. `done` is taken.
  void Start(const MethodInfo& method, std::string request, SendSlot slot, absl::Status unsent,
             google::protobuf::MessageLite* response, IncomingBulk* response_bulk,
             const CallOptions& options, absl::Time deadline, DoneCallback& done);
  // An attempt ended with `status`: the call ends (nothing of this object is touched after its
  // callback), or waits for its next attempt.
  void Ended(std::unique_ptr<RetriedCall> call, absl::Status status);
  // Calls waiting end (CANCELLED), as those that would wait from now on; returns once the
  // retrier thread has stopped (or, called on it, lets it go).
  void Stop();
  uint64_t retries() const { return retried_.load(std::memory_order_relaxed); }

 private:
  void Loop();
  void Attempt(std::unique_ptr<RetriedCall> call);

  const ChannelOptions::Retry policy_;
  Channel* const front_;
  const std::shared_ptr<RetryQueue> queue_ = std::make_shared<RetryQueue>();
  absl::Mutex mu_;
  bool started_ ABSL_GUARDED_BY(mu_) = false;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;  // started under mu_
  std::atomic<uint64_t> retried_{0};
};

}  // namespace zrpc::internal

#endif  // ZRPC_RPC_CLIENT_RETRY_H_
