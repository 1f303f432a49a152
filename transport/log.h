// What zrpc says about itself, and where it goes: a level and a sink the application sets.
//
// The library writes nothing but these records: a peer that broke the protocol, a connection
// closed for a fault, the device it chose, a runtime bug found at shutdown. Each has a level; by
// default only errors are written, to stderr, one line each:
//
//   zrpc ERROR server: closing the connection to 198.18.0.2:41234: protocol violation: ...
//
// An application that logs elsewhere routes them with SetLogSink; one that wants to see more (or
// nothing) sets SetLogLevel, or the environment does (ZRPC_LOG_LEVEL=debug|info|warning|error|off,
// read once, at the first record; SetLogLevel overrides it). Records below the level cost one
// relaxed atomic load: their text is never formatted.
//
//   zrpc::SetLogLevel(zrpc::LogLevel::kInfo);
//   zrpc::SetLogSink([](const zrpc::LogRecord& r) {
//     my_logger.Log(r.level >= zrpc::LogLevel::kError ? kErr : kInfo, "zrpc ", r.component, ": ",
//                   r.message);
//   });
//
// What each level holds:
//   kError    faults an operator must see: a peer that broke the protocol, a transport fault on
//             a connection (not a peer going away), a failed poll of the NIC, a runtime bug.
//   kWarning  connections this side closed for a reason the calls on it also report (a
//             keepalive without answer), and leftovers at shutdown.
//   kInfo     the device and port chosen, connections closed for idleness.
//   kDebug    nothing yet; room for tracing.
//
// Threads: records come from any runtime thread, concurrently; the sink must be thread-safe and
// should be quick (it runs on a poller or handler thread). It must not call SetLogSink. Setting
// the sink or the level is safe at any time, from any thread: SetLogSink waits for records
// being written to the old sink, so once it returns the old sink is no longer called (and may
// be destroyed, with whatever it captured).
#ifndef ZRPC_TRANSPORT_LOG_H_
#define ZRPC_TRANSPORT_LOG_H_

#include <functional>
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace zrpc {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3, kOff = 4 };

struct LogRecord {
  LogLevel level;
  // Which part of zrpc speaks: "transport", "device", "client", "server" or "runtime".
  absl::string_view component;
  absl::string_view message;  // one line, no trailing newline
  const char* file;           // where in zrpc's source, for bug reports
  int line;
};

using LogSink = std::function<void(const LogRecord&)>;

// Records below `level` are dropped. kOff drops everything.
void SetLogLevel(LogLevel level);
LogLevel GetLogLevel();
// Sends every record at or above the level to `sink`; an empty sink restores the default
// (one line to stderr, as FormatLogRecord writes it).
void SetLogSink(LogSink sink);

// "debug", "info", "warning", "error", "off" (any case); nullopt for anything else.
std::optional<LogLevel> ParseLogLevel(absl::string_view name);
// "DEBUG", "INFO", "WARNING", "ERROR", "OFF".
absl::string_view LogLevelName(LogLevel level);
// The default sink's line, without the newline: "zrpc ERROR server: <message>".
std::string FormatLogRecord(const LogRecord& record);

namespace internal {

// The level in effect (ZRPC_LOG_LEVEL read on first use); relaxed: a racing change of level
// may let one record through either way.
bool LogEnabled(LogLevel level);
void EmitLog(LogLevel level, absl::string_view component, const char* file, int line,
             const std::string& message);
// Forgets the level, so that the next record reads ZRPC_LOG_LEVEL again (for tests).
void ForgetLogLevel();

}  // namespace internal
}  // namespace zrpc

// ZRPC_LOG(kError, "server", "closing the connection to ", peer, ": ", why);
// The message is absl::StrCat of the arguments, built only when the level is enabled.
#define ZRPC_LOG(level, component, ...)                                                 \
  do {                                                                                  \
    if (::zrpc::internal::LogEnabled(::zrpc::LogLevel::level)) {                        \
      ::zrpc::internal::EmitLog(::zrpc::LogLevel::level, component, __FILE__, __LINE__, \
                                ::absl::StrCat(__VA_ARGS__));                           \
    }                                                                                   \
  } while (false)

#endif  // ZRPC_TRANSPORT_LOG_H_
