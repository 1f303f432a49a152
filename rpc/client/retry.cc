// Retries of unary calls to idempotent methods: the policy's arithmetic, the waiting queue and the
// retrier.

#include "rpc/client/retry.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <random>
#include <system_error>
#include <utility>

#include "absl/strings/str_cat.h"
#include "rpc/common/monotonic.h"

namespace zrpc::internal {
CallOptions RetriedCall::AttemptOptions(absl::Time now) const {
  CallOptions attempt = options;
  // The backoff stands for wait_for_ready's wait from here on: an attempt on the retrier never
  // waits for a connection past connect_timeout, so that the channel's destruction, which waits
  // for the retrier, waits no longer.
  attempt.wait_for_ready = false;
  // The wall-clock deadline holds as it is; the timeout counts from the first attempt.
  if (deadline != absl::InfiniteFuture()) {
    attempt.timeout = std::max(deadline - now, absl::ZeroDuration());
  }
  return attempt;
}

absl::Duration RetryBackoff(const ChannelOptions::Retry& policy, int n, double random) {
  const absl::Duration d =
      std::min(policy.max_backoff,
               policy.initial_backoff * static_cast<double>(uint64_t{1} << std::min(n - 1, 30)));
  return d / 2 + (d / 2) * random;
}

bool RetriedCall::RetryAt(const absl::Status& status, const ChannelOptions::Retry& policy,
                          absl::Time now, double random, absl::Time* at) const {
  if (status.code() != absl::StatusCode::kUnavailable || attempts >= policy.max_attempts) {
    return false;
  }
  *at = now + RetryBackoff(policy, attempts, random);
  return *at < deadline;  // else the last attempt's error says more than a deadline would
}

bool RetryQueue::Add(const std::shared_ptr<RetryQueue>& queue, absl::Time at,
                     std::unique_ptr<RetriedCall> call) {
  const std::shared_ptr<Cancellation> cancellation = call->options.cancellation;
  {
    absl::MutexLock lock(&queue->mu_);
    call->id = queue->next_id_++;
  }
  const uint64_t id = call->id;
  // The hook before the call is queued: once queued, the retrier may take it and start its next
  // attempt, whose own hook this one must not replace. It stays with the Cancellation after the
  // call moves on (nothing takes a hook back): by id, it then finds nothing, and a later call at
  // the same address cannot be mistaken for this one.
  if (cancellation != nullptr &&
      !cancellation->SetHook([weak = std::weak_ptr<RetryQueue>(queue), id] {
        if (std::shared_ptr<RetryQueue> live = weak.lock()) live->Cancel(id);
      })) {
    // Cancelled already (the hook ran, finding nothing).
    call->done(absl::CancelledError(
        absl::StrCat(call->method->full_name, ": cancelled while it waited to retry")));
    return true;
  }
  {
    absl::MutexLock lock(&queue->mu_);
    if (!queue->closed_) {
      queue->waiting_.emplace(at, std::move(call));
      queue->changed_.Signal();
    }
  }
  if (call != nullptr) {
    EndClosed(*call);
    return false;
  }
  // A Cancel between the hook and the queue found nothing: look again.
  if (cancellation != nullptr && cancellation->cancelled()) queue->Cancel(id);
  return true;
}

bool RetryQueue::WaitDue(std::vector<std::unique_ptr<RetriedCall>>* due) {
  due->clear();
  absl::MutexLock lock(&mu_);
  while (true) {
    if (closed_) return false;
    const absl::Time now = MonotonicNow();
    auto it = waiting_.begin();
    while (it != waiting_.end() && it->first <= now) {
      due->push_back(std::move(it->second));
      it = waiting_.erase(it);
    }
    if (!due->empty()) return true;
    // The monotonic clock is absl::Time from a fixed origin: wait for the gap, not the instant.
    const absl::Duration gap =
        waiting_.empty() ? absl::InfiniteDuration() : waiting_.begin()->first - now;
    changed_.WaitWithTimeout(&mu_, gap);
  }
}

void RetryQueue::Cancel(uint64_t id) {
  std::unique_ptr<RetriedCall> cancelled;
  {
    absl::MutexLock lock(&mu_);
    for (auto it = waiting_.begin(); it != waiting_.end(); ++it) {
      if (it->second->id == id) {
        cancelled = std::move(it->second);
        waiting_.erase(it);
        break;
      }
    }
  }
  // Outside the lock: the callback may start calls.
  if (cancelled != nullptr) {
    cancelled->done(absl::CancelledError(
        absl::StrCat(cancelled->method->full_name, ": cancelled while it waited to retry")));
  }
}

void RetryQueue::Close() {
  std::multimap<absl::Time, std::unique_ptr<RetriedCall>> left;
  {
    absl::MutexLock lock(&mu_);
    closed_ = true;
    left.swap(waiting_);
    changed_.SignalAll();
  }
  for (auto& [at, call] : left) EndClosed(*call);
}

void RetryQueue::EndClosed(RetriedCall& call) {
  call.done(absl::CancelledError(absl::StrCat(
      call.method->full_name, ": the channel was destroyed while the call waited to retry")));
}

bool RetryQueue::closed() const {
  absl::MutexLock lock(&mu_);
  return closed_;
}

namespace {
// The jitter of retries' backoffs: a generator per thread (attempts end on any thread).
double RetryJitter() {
  thread_local std::minstd_rand random{std::random_device{}()};
  return std::uniform_real_distribution<double>(0.0, 1.0)(random);
}
}  // namespace

Retrier::~Retrier() {
  absl::MutexLock lock(&mu_);
  // Stop let it go only when it ran on the thread itself, which then touches nothing of this.
  if (thread_.joinable()) thread_.detach();
}

void Retrier::Start(const MethodInfo& method, std::string request, SendSlot slot,
                    absl::Status unsent, google::protobuf::MessageLite* response,
                    IncomingBulk* response_bulk, const CallOptions& options, absl::Time deadline,
                    DoneCallback& done) {
  auto call = std::make_unique<RetriedCall>();
  call->method = &method;
  call->request = std::move(request);
  call->response = response;
  call->response_bulk = response_bulk;
  call->options = options;
  call->deadline = deadline;
  call->done = std::move(done);
  call->attempts = 1;  // this one
  if (!unsent.ok()) return Ended(std::move(call), std::move(unsent));
  // The caller's options: the call may end (and `call` go) before this returns.
  ChannelAccess::StartUnaryCall(front_, method, slot, OutgoingBulk(), response, response_bulk,
                                options,
                                [this, call = std::move(call)](absl::Status status) mutable {
                                  Ended(std::move(call), std::move(status));
                                });
}

void Retrier::Ended(std::unique_ptr<RetriedCall> call, absl::Status status) {
  // A cancelled call is not made again, and a cancel that came while an attempt failed
  // otherwise is what the caller hears.
  const bool cancelled =
      call->options.cancellation != nullptr && call->options.cancellation->cancelled();
  if (cancelled && status.code() != absl::StatusCode::kCancelled) {
    status = absl::CancelledError(absl::StrCat(call->method->full_name, ": cancelled"));
  }
  absl::Time at;
  if (cancelled || !call->RetryAt(status, policy_, MonotonicNow(), RetryJitter(), &at)) {
    return call->done(std::move(status));  // nothing of this object is touched after: Loop
  }
  {
    absl::ReleasableMutexLock lock(&mu_);
    if (!started_ && !stopped_) {
      try {
        thread_ = std::thread([this] { Loop(); });
        started_ = true;
      } catch (const std::system_error& e) {
        // No thread to be had (a process limit): the call ends as its attempt did, and the next
        // retry tries again.
        lock.Release();
        call->done(absl::Status(status.code(), absl::StrCat(status.message(),
                                                            " (not retried: no thread for the "
                                                            "retries: ",
                                                            e.what(), ")")));
        return;
      }
    }
  }
  retried_.fetch_add(1, std::memory_order_relaxed);
  RetryQueue::Add(queue_, at, std::move(call));
}

void Retrier::Stop() {
  queue_->Close();
  std::thread thread;
  {
    absl::MutexLock lock(&mu_);
    stopped_ = true;
    if (thread_.joinable() && thread_.get_id() != std::this_thread::get_id()) {
      thread = std::move(thread_);
    }
  }
  // A call's callback on the retrier may be what destroys the channel: that thread is then left
  // to the destructor, which lets it go, and touches nothing of this object again (Loop).
  if (thread.joinable()) thread.join();
}

void Retrier::Loop() {
  // Its own reference: a call's callback run by an attempt here may destroy the channel (and
  // this), after which only the queue may be touched.
  const std::shared_ptr<RetryQueue> queue = queue_;
  std::vector<std::unique_ptr<RetriedCall>> due;
  while (queue->WaitDue(&due)) {
    for (std::unique_ptr<RetriedCall>& call : due) {
      if (queue->closed()) {
        RetryQueue::EndClosed(*call);  // the channel is going (or gone)
        continue;
      }
      Attempt(std::move(call));
    }
  }
}

void Retrier::Attempt(std::unique_ptr<RetriedCall> call) {
  ++call->attempts;
  RetriedCall& retried = *call;
  const CallOptions options = retried.AttemptOptions(MonotonicNow());
  absl::StatusOr<SendSlot> slot =
      ChannelAccess::AcquireSendSlot(front_, *retried.method, retried.request.size(), options);
  if (!slot.ok()) return Ended(std::move(call), slot.status());
  if (!retried.request.empty()) {
    std::memcpy(slot->data, retried.request.data(), retried.request.size());
  }
  // Its end comes before the channel's core goes (its destruction ends the calls in flight).
  ChannelAccess::StartUnaryCall(front_, *retried.method, *slot, OutgoingBulk(), retried.response,
                                retried.response_bulk, options,
                                [this, call = std::move(call)](absl::Status status) mutable {
                                  Ended(std::move(call), std::move(status));
                                });
}

}  // namespace zrpc::internal
