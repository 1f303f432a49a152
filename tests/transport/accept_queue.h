// An AcceptHandler for tests: places every connection on one poller and handler (changeable
// between connections), and queues what the listener reports -- accepted connections and
// refusals, in order -- for the test to take with Next().
#ifndef ZRPC_TESTS_TRANSPORT_ACCEPT_QUEUE_H_
#define ZRPC_TESTS_TRANSPORT_ACCEPT_QUEUE_H_

#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "transport/listener.h"

namespace zrpc::testing {

class AcceptQueue : public transport::AcceptHandler {
 public:
  AcceptQueue(transport::Poller* poller, transport::ConnectionHandler* handler) {
    Use(poller, handler);
  }

  // Where the next connections go.
  void Use(transport::Poller* poller, transport::ConnectionHandler* handler) {
    absl::MutexLock lock(&mu_);
    placement_ = transport::Placement{poller, handler, nullptr};
  }

  absl::StatusOr<transport::Placement> Place(const std::string& /*peer*/) override {
    absl::MutexLock lock(&mu_);
    return placement_;
  }
  void OnAccepted(std::shared_ptr<transport::Connection> connection) override {
    absl::MutexLock lock(&mu_);
    ++accepted_;
    queue_.push_back(std::move(connection));
  }
  void OnRefused(const std::string& peer, transport::ConnectionHandler*,
                 const absl::Status& why) override {
    absl::MutexLock lock(&mu_);
    refusals_.push_back(peer + ": " + std::string(why.message()));
    queue_.push_back(why);
  }

  // The next accepted connection, or the next refusal's status, waiting up to `timeout`.
  absl::StatusOr<std::shared_ptr<transport::Connection>> Next(absl::Duration timeout) {
    absl::MutexLock lock(&mu_);
    if (!mu_.AwaitWithTimeout(absl::Condition(this, &AcceptQueue::NotEmpty), timeout)) {
      return absl::DeadlineExceededError("the listener reported nothing");
    }
    auto next = std::move(queue_.front());
    queue_.pop_front();
    return next;
  }

  int accepted() const {
    absl::MutexLock lock(&mu_);
    return accepted_;
  }
  std::vector<std::string> refusals() const {
    absl::MutexLock lock(&mu_);
    return refusals_;
  }

 private:
  bool NotEmpty() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !queue_.empty(); }

  mutable absl::Mutex mu_;
  transport::Placement placement_ ABSL_GUARDED_BY(mu_);
  std::deque<absl::StatusOr<std::shared_ptr<transport::Connection>>> queue_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> refusals_ ABSL_GUARDED_BY(mu_);
  int accepted_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace zrpc::testing

#endif  // ZRPC_TESTS_TRANSPORT_ACCEPT_QUEUE_H_
