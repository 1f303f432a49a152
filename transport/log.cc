#include "transport/log.h"

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <utility>

#include "absl/base/const_init.h"
#include "absl/strings/ascii.h"
#include "absl/synchronization/mutex.h"

namespace zrpc {
namespace {

constexpr int kUnset = -1;
constexpr LogLevel kDefaultLevel = LogLevel::kError;

std::atomic<int> level_{kUnset};

absl::Mutex sink_mu(absl::kConstInit);
// Null: the default sink. Owned; replaced and deleted by SetLogSink.
const LogSink* sink ABSL_GUARDED_BY(sink_mu) = nullptr;

int LevelFromEnvironment() {
  const char* env = std::getenv("ZRPC_LOG_LEVEL");
  if (env == nullptr || *env == '\0') return static_cast<int>(kDefaultLevel);
  if (std::optional<LogLevel> parsed = ParseLogLevel(env)) return static_cast<int>(*parsed);
  std::fprintf(stderr,
               "zrpc ERROR log: ZRPC_LOG_LEVEL=%s is none of debug, info, warning, error, off; "
               "using error\n",
               env);
  return static_cast<int>(kDefaultLevel);
}

int CurrentLevel() {
  int level = level_.load(std::memory_order_relaxed);
  if (level != kUnset) return level;
  int from_env = LevelFromEnvironment();
  // Only the first reader sets it; a SetLogLevel that came first wins.
  if (level_.compare_exchange_strong(level, from_env, std::memory_order_relaxed)) return from_env;
  return level;
}

}  // namespace

void SetLogLevel(LogLevel level) {
  level_.store(static_cast<int>(level), std::memory_order_relaxed);
}

LogLevel GetLogLevel() { return static_cast<LogLevel>(CurrentLevel()); }

void SetLogSink(LogSink new_sink) {
  const LogSink* replacement = new_sink ? new LogSink(std::move(new_sink)) : nullptr;
  const LogSink* old;
  {
    absl::MutexLock lock(&sink_mu);
    old = std::exchange(sink, replacement);
  }
  delete old;  // outside the lock: no record is being written to it any more
}

std::optional<LogLevel> ParseLogLevel(absl::string_view name) {
  const std::string lower = absl::AsciiStrToLower(name);
  if (lower == "debug") return LogLevel::kDebug;
  if (lower == "info") return LogLevel::kInfo;
  if (lower == "warning") return LogLevel::kWarning;
  if (lower == "error") return LogLevel::kError;
  if (lower == "off") return LogLevel::kOff;
  return std::nullopt;
}

absl::string_view LogLevelName(LogLevel level) {
  switch (level) {
    case LogLevel::kDebug:
      return "DEBUG";
    case LogLevel::kInfo:
      return "INFO";
    case LogLevel::kWarning:
      return "WARNING";
    case LogLevel::kError:
      return "ERROR";
    case LogLevel::kOff:
      return "OFF";
  }
  return "?";
}

std::string FormatLogRecord(const LogRecord& record) {
  return absl::StrCat("zrpc ", LogLevelName(record.level), " ", record.component, ": ",
                      record.message);
}

namespace internal {

bool LogEnabled(LogLevel level) {
  return level != LogLevel::kOff && static_cast<int>(level) >= CurrentLevel();
}

void EmitLog(LogLevel level, absl::string_view component, const char* file, int line,
             const std::string& message) {
  const LogRecord record{level, component, message, file, line};
  {
    // The sink runs under the reader lock, so that SetLogSink waits for records being written:
    // once it returns, the old sink (and what it captured) is called no more.
    absl::ReaderMutexLock lock(&sink_mu);
    if (sink != nullptr) {
      (*sink)(record);
      return;
    }
  }
  // One write per line, so that lines from several threads do not interleave.
  const std::string text = FormatLogRecord(record) + "\n";
  std::fwrite(text.data(), 1, text.size(), stderr);
}

void ForgetLogLevel() { level_.store(kUnset, std::memory_order_relaxed); }

}  // namespace internal
}  // namespace zrpc
