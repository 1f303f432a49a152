// StreamThreads: one thread per blocking streaming handler, bounded.

#include "rpc/server/stream_threads.h"

#include <system_error>
#include <utility>

#include "absl/strings/str_cat.h"

namespace zrpc::internal {

absl::Status StreamThreads::Start(std::function<void()> body) {
  std::vector<std::thread> joinable;
  absl::Status status;
  {
    absl::MutexLock lock(&mu_);
    joinable.swap(finished_);
    if (running_.size() >= static_cast<size_t>(max_)) {
      status = absl::ResourceExhaustedError(absl::StrCat(
          "the server runs ", running_.size(), " streams already (ServerOptions::max_streams)"));
    } else {
      const uint64_t id = next_id_++;
      try {
        // Finished() waits for this lock, so the thread is in running_ before it leaves it.
        running_.emplace(id, std::thread([this, id, body = std::move(body)] {
                           body();
                           Finished(id);
                         }));
        ++started_;
      } catch (const std::system_error& e) {
        status = absl::ResourceExhaustedError(absl::StrCat("no thread for the stream: ", e.what()));
      }
    }
  }
  for (std::thread& thread : joinable) thread.join();
  return status;
}

void StreamThreads::Finished(uint64_t id) {
  absl::MutexLock lock(&mu_);
  auto it = running_.find(id);
  finished_.push_back(std::move(it->second));
  running_.erase(it);
}

void StreamThreads::JoinAll() {
  for (;;) {
    std::vector<std::thread> joinable;
    {
      absl::MutexLock lock(&mu_);
      if (running_.empty() && finished_.empty()) return;
      if (finished_.empty()) {
        mu_.Await(absl::Condition(
            +[](StreamThreads* self) ABSL_NO_THREAD_SAFETY_ANALYSIS {
              return !self->finished_.empty() || self->running_.empty();
            },
            this));
      }
      joinable.swap(finished_);
    }
    for (std::thread& thread : joinable) thread.join();
  }
}

uint64_t StreamThreads::started() const {
  absl::MutexLock lock(&mu_);
  return started_;
}

uint64_t StreamThreads::running() const {
  absl::MutexLock lock(&mu_);
  return running_.size();
}

}  // namespace zrpc::internal
