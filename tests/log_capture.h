// Captures zrpc's log records (transport/log.h) for the life of the object, at a given level;
// restores the default sink and `restore_level` after. One at a time per process.
#ifndef ZRPC_TESTS_LOG_CAPTURE_H_
#define ZRPC_TESTS_LOG_CAPTURE_H_

#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/synchronization/mutex.h"
#include "transport/log.h"

namespace zrpc::testing {

class LogCapture {
 public:
  struct Record {
    LogLevel level;
    std::string component;
    std::string message;
  };

  explicit LogCapture(LogLevel level, LogLevel restore_level = LogLevel::kError)
      : restore_level_(restore_level) {
    SetLogLevel(level);
    SetLogSink([this](const LogRecord& r) {
      absl::MutexLock lock(&mu_);
      records_.push_back({r.level, std::string(r.component), std::string(r.message)});
    });
  }
  ~LogCapture() {
    SetLogSink(nullptr);
    SetLogLevel(restore_level_);
  }
  LogCapture(const LogCapture&) = delete;
  LogCapture& operator=(const LogCapture&) = delete;

  std::vector<Record> records() const {
    absl::MutexLock lock(&mu_);
    return records_;
  }
  // How many records at `level` from `component` contain `text`.
  int Count(LogLevel level, const std::string& component, const std::string& text) const {
    absl::MutexLock lock(&mu_);
    int n = 0;
    for (const Record& r : records_) {
      n += r.level == level && r.component == component && absl::StrContains(r.message, text);
    }
    return n;
  }

 private:
  const LogLevel restore_level_;
  mutable absl::Mutex mu_;
  std::vector<Record> records_ ABSL_GUARDED_BY(mu_);
};

}  // namespace zrpc::testing

#endif  // ZRPC_TESTS_LOG_CAPTURE_H_
