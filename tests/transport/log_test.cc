// The library's log: levels, the application's sink, the default sink's line, ZRPC_LOG_LEVEL.
#include "transport/log.h"

#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "tests/log_capture.h"

namespace {

using zrpc::LogLevel;
using zrpc::testing::LogCapture;

// Everything written to stderr while `fn` runs.
template <typename Fn>
std::string CaptureStderr(Fn fn) {
  std::fflush(stderr);
  int pipe_fds[2];
  REQUIRE(pipe(pipe_fds) == 0);
  int saved = dup(STDERR_FILENO);
  dup2(pipe_fds[1], STDERR_FILENO);
  close(pipe_fds[1]);
  fn();
  std::fflush(stderr);
  dup2(saved, STDERR_FILENO);
  close(saved);
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = read(pipe_fds[0], buf, sizeof buf)) > 0) out.append(buf, static_cast<size_t>(n));
  close(pipe_fds[0]);
  return out;
}

}  // namespace

TEST_CASE("level names parse in any case, and nothing else does") {
  for (LogLevel level :
       {LogLevel::kDebug, LogLevel::kInfo, LogLevel::kWarning, LogLevel::kError, LogLevel::kOff}) {
    std::string name(zrpc::LogLevelName(level));
    CHECK(zrpc::ParseLogLevel(name) == level);
    for (char& c : name) c = static_cast<char>(std::tolower(c));
    CHECK(zrpc::ParseLogLevel(name) == level);
  }
  CHECK(zrpc::ParseLogLevel("Warning") == LogLevel::kWarning);
  CHECK_FALSE(zrpc::ParseLogLevel("").has_value());
  CHECK_FALSE(zrpc::ParseLogLevel("warn").has_value());
  CHECK_FALSE(zrpc::ParseLogLevel("3").has_value());
}

TEST_CASE("quiet by default: only errors, from ZRPC_LOG_LEVEL when set, a bad value named") {
  unsetenv("ZRPC_LOG_LEVEL");
  zrpc::internal::ForgetLogLevel();
  CHECK(zrpc::GetLogLevel() == LogLevel::kError);
  CHECK(zrpc::internal::LogEnabled(LogLevel::kError));
  CHECK_FALSE(zrpc::internal::LogEnabled(LogLevel::kWarning));

  setenv("ZRPC_LOG_LEVEL", "Info", 1);
  zrpc::internal::ForgetLogLevel();
  CHECK(zrpc::GetLogLevel() == LogLevel::kInfo);
  // SetLogLevel overrides the environment.
  zrpc::SetLogLevel(LogLevel::kOff);
  CHECK(zrpc::GetLogLevel() == LogLevel::kOff);
  CHECK_FALSE(zrpc::internal::LogEnabled(LogLevel::kError));

  setenv("ZRPC_LOG_LEVEL", "loud", 1);
  zrpc::internal::ForgetLogLevel();
  std::string err = CaptureStderr([] { CHECK(zrpc::GetLogLevel() == LogLevel::kError); });
  CHECK(err.find("ZRPC_LOG_LEVEL=loud") != std::string::npos);
  unsetenv("ZRPC_LOG_LEVEL");
  zrpc::SetLogLevel(LogLevel::kError);
}

TEST_CASE(
    "the sink gets the records at and above the level, with their component; the text "
    "of the others is never built") {
  LogCapture capture(LogLevel::kWarning);
  int built = 0;
  auto text = [&built](const char* s) {
    ++built;
    return std::string(s);
  };
  ZRPC_LOG(kDebug, "server", text("debug"));
  ZRPC_LOG(kInfo, "server", text("info"));
  ZRPC_LOG(kWarning, "client", text("warning "), 42);
  ZRPC_LOG(kError, "transport", text("error"));
  CHECK(built == 2);
  auto records = capture.records();
  REQUIRE(records.size() == 2);
  CHECK(records[0].level == LogLevel::kWarning);
  CHECK(records[0].component == "client");
  CHECK(records[0].message == "warning 42");
  CHECK(records[1].level == LogLevel::kError);
  CHECK(records[1].component == "transport");

  zrpc::SetLogLevel(LogLevel::kOff);
  ZRPC_LOG(kError, "transport", text("off"));
  CHECK(built == 2);
  CHECK(capture.records().size() == 2);
}

TEST_CASE("the default sink writes one line per record to stderr; an empty sink restores it") {
  zrpc::SetLogLevel(LogLevel::kError);
  {
    LogCapture capture(LogLevel::kError);
    std::string err = CaptureStderr([] { ZRPC_LOG(kError, "server", "to the sink"); });
    CHECK(err.empty());
    CHECK(capture.records().size() == 1);
  }
  std::string err = CaptureStderr([] {
    ZRPC_LOG(kError, "server", "closing the connection to ", "10.0.0.1:7", ": bad frame");
    ZRPC_LOG(kInfo, "device", "not shown");
  });
  CHECK(err == "zrpc ERROR server: closing the connection to 10.0.0.1:7: bad frame\n");
}

TEST_CASE(
    "records from many threads while the sink is replaced: each reaches one sink, none is "
    "lost, and a replaced sink is never called after SetLogSink returns") {
  zrpc::SetLogLevel(LogLevel::kInfo);
  std::atomic<int> delivered{0};
  std::atomic<int> retired{-1};  // every sink of a generation <= this was replaced
  std::atomic<int> late{0};      // calls of a sink after its replacement returned
  auto sink_of = [&](int generation) {
    return [&, generation](const zrpc::LogRecord& r) {
      if (r.message != "tick") return;
      if (generation <= retired.load()) late.fetch_add(1);
      delivered.fetch_add(1);
    };
  };
  zrpc::SetLogSink(sink_of(0));
  constexpr int kThreads = 4, kEach = 5000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([] {
      for (int i = 0; i < kEach; ++i) ZRPC_LOG(kInfo, "transport", "tick");
    });
  }
  for (int generation = 1; generation <= 200; ++generation) {
    zrpc::SetLogSink(sink_of(generation));
    retired.store(generation - 1);
  }
  for (std::thread& t : threads) t.join();
  CHECK(delivered.load() == kThreads * kEach);
  CHECK(late.load() == 0);
  zrpc::SetLogSink(nullptr);
  zrpc::SetLogLevel(LogLevel::kError);
}
