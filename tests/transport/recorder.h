// Test helpers for transport tests on a device: a handler that records what a connection reports,
// and a connected pair of connections over the harness's device.
#ifndef ZRPC_TESTS_TRANSPORT_RECORDER_H_
#define ZRPC_TESTS_TRANSPORT_RECORDER_H_

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "transport/connection.h"
#include "transport/poller.h"

namespace zrpc::testing {

using transport::Connection;

// Records every report; releases what it receives at once unless `hold` is set.
class Recorder : public transport::ConnectionHandler {
 public:
  bool hold = false;        // keep received messages (handles in held) instead of releasing
  bool hold_bulks = false;  // keep received bulk payloads (handles in held_bulks)
  bool keep_bytes = true;   // copy each message's bytes into messages
  // Called for each message, before it is released (for checks without copying).
  std::function<void(const uint8_t*, uint32_t)> on_message;

  void OnMessage(Connection& c, const transport::ReceivedMessage& m) override {
    if (on_message) on_message(m.data, m.size);
    absl::MutexLock lock(&mu);
    ++message_count;
    if (keep_bytes) messages.emplace_back(reinterpret_cast<const char*>(m.data), m.size);
    if (hold) {
      held.push_back(m.handle);
    } else if (!c.Release(m.handle).ok()) {
      ++release_failures;
    }
  }
  void OnBulk(Connection& c, const transport::ReceivedBulk& b) override {
    absl::MutexLock lock(&mu);
    bulks.emplace_back(reinterpret_cast<const char*>(b.data), b.size);
    if (hold_bulks) {
      held_bulks.push_back(b.handle);
    } else if (!c.Release(b.handle).ok()) {
      ++release_failures;
    }
  }
  void OnSendDone(Connection&, uint64_t token, const absl::Status& status) override {
    absl::MutexLock lock(&mu);
    if (!done.emplace(token, status).second) ++duplicate_done;
    if (closed.has_value()) ++done_after_closed;  // the contract: nothing follows OnClosed
  }
  void OnClosed(Connection&, const absl::Status& why) override {
    absl::MutexLock lock(&mu);
    if (closed.has_value()) ++duplicate_closed;
    closed = why;
    closed_at = absl::Now();
  }

  // Waits until `ready` holds (checked under the lock) or `timeout` passes.
  bool WaitFor(const std::function<bool()>& ready, absl::Duration timeout = absl::Seconds(60)) {
    absl::MutexLock lock(&mu);
    auto condition = [&]() ABSL_SHARED_LOCKS_REQUIRED(mu) { return ready(); };
    return mu.AwaitWithTimeout(absl::Condition(&condition), timeout);
  }

  absl::Mutex mu;
  uint64_t message_count ABSL_GUARDED_BY(mu) = 0;
  std::vector<std::string> messages ABSL_GUARDED_BY(mu);
  std::vector<std::string> bulks ABSL_GUARDED_BY(mu);
  std::vector<uint64_t> held ABSL_GUARDED_BY(mu);
  std::vector<uint64_t> held_bulks ABSL_GUARDED_BY(mu);
  std::map<uint64_t, absl::Status> done ABSL_GUARDED_BY(mu);
  std::optional<absl::Status> closed ABSL_GUARDED_BY(mu);
  absl::Time closed_at ABSL_GUARDED_BY(mu);
  int release_failures ABSL_GUARDED_BY(mu) = 0;
  int duplicate_done ABSL_GUARDED_BY(mu) = 0;
  int duplicate_closed ABSL_GUARDED_BY(mu) = 0;
  int done_after_closed ABSL_GUARDED_BY(mu) = 0;
};

}  // namespace zrpc::testing

#endif  // ZRPC_TESTS_TRANSPORT_RECORDER_H_
