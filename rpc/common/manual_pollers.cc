#include "rpc/common/manual_pollers.h"

#include <atomic>
#include <vector>

#include "absl/base/const_init.h"
#include "absl/synchronization/mutex.h"

namespace zrpc::internal {
namespace {

std::atomic<bool> manual{false};
absl::Mutex mu(absl::kConstInit);
std::vector<std::weak_ptr<transport::Poller>>* pollers ABSL_GUARDED_BY(mu) = nullptr;

}  // namespace

void SetManualPollers(bool on) { manual.store(on, std::memory_order_relaxed); }
bool ManualPollers() { return manual.load(std::memory_order_relaxed); }

void AddManualPoller(const std::shared_ptr<transport::Poller>& poller) {
  absl::MutexLock lock(&mu);
  if (pollers == nullptr) pollers = new std::vector<std::weak_ptr<transport::Poller>>;
  pollers->push_back(poller);
}

int DriveManualPollersOnce() {
  // Taken out of the lock: a pass may open or close a runtime (a callback can), which adds here.
  // Kept between calls, so that a pass allocates nothing (it is counted with what it drives).
  static thread_local std::vector<std::shared_ptr<transport::Poller>> alive;  // empty here
  {
    absl::MutexLock lock(&mu);
    if (pollers == nullptr) return 0;
    for (auto it = pollers->begin(); it != pollers->end();) {
      if (std::shared_ptr<transport::Poller> poller = it->lock()) {
        alive.push_back(std::move(poller));
        ++it;
      } else {
        it = pollers->erase(it);
      }
    }
  }
  int handled = 0;
  for (const auto& poller : alive) handled += poller->RunOnce(absl::ZeroDuration());
  alive.clear();  // no poller is kept alive by the driver between passes
  return handled;
}

std::vector<std::shared_ptr<transport::Poller>> ManualPollersAlive() {
  std::vector<std::shared_ptr<transport::Poller>> alive;
  absl::MutexLock lock(&mu);
  if (pollers == nullptr) return alive;
  for (const auto& weak : *pollers) {
    if (std::shared_ptr<transport::Poller> poller = weak.lock()) alive.push_back(std::move(poller));
  }
  return alive;
}

void StartManualPollers() {
  std::vector<std::weak_ptr<transport::Poller>> taken;
  {
    absl::MutexLock lock(&mu);
    if (pollers != nullptr) taken.swap(*pollers);
  }
  for (const auto& weak : taken) {
    // A poller that cannot start (it never fails for a never-started one) stays undriven.
    if (std::shared_ptr<transport::Poller> poller = weak.lock()) static_cast<void>(poller->Start());
  }
}

}  // namespace zrpc::internal
