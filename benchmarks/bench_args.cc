#include "benchmarks/bench_args.h"

#include <algorithm>
#include <cstdio>
#include <optional>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"

namespace zrpc::bench {
namespace {

constexpr uint64_t kMaxSize = uint64_t{1} << 30;

template <typename T>
absl::Status ParseList(const std::string& flag, const std::string& text, T min, T max,
                       std::vector<T>* out) {
  out->clear();
  for (absl::string_view part : absl::StrSplit(text, ',')) {
    T value{};
    if (!absl::SimpleAtoi(part, &value) || value < min || value > max) {
      return absl::InvalidArgumentError(
          absl::StrCat(flag, ": \"", part, "\" is not a number in [", min, ", ", max, "]"));
    }
    out->push_back(value);
  }
  return absl::OkStatus();
}

template <typename T>
absl::Status ParseOne(const std::string& flag, const std::string& text, T min, T max, T* out) {
  std::vector<T> values;
  if (absl::Status s = ParseList(flag, text, min, max, &values); !s.ok()) return s;
  if (values.size() != 1) {
    return absl::InvalidArgumentError(absl::StrCat(flag, " takes one number"));
  }
  *out = values[0];
  return absl::OkStatus();
}

// Byte counts: "4096", or with a binary suffix "64K", "1M", "1G" (examples/cli.h).
absl::Status ParseBytesList(const std::string& flag, const std::string& text, uint64_t min,
                            uint64_t max, std::vector<uint64_t>* out) {
  out->clear();
  for (absl::string_view part : absl::StrSplit(text, ',')) {
    std::optional<uint64_t> value = examples::cli::ParseBytes(part, min, max);
    if (!value.has_value()) {
      return absl::InvalidArgumentError(absl::StrCat(flag, ": \"", part,
                                                     "\" is not a byte count in [", min, ", ", max,
                                                     "] (digits, or with a K, M or G suffix)"));
    }
    out->push_back(*value);
  }
  return absl::OkStatus();
}

absl::Status ParseOneBytes(const std::string& flag, const std::string& text, uint64_t min,
                           uint64_t max, uint64_t* out) {
  std::vector<uint64_t> values;
  if (absl::Status s = ParseBytesList(flag, text, min, max, &values); !s.ok()) return s;
  if (values.size() != 1) return absl::InvalidArgumentError(absl::StrCat(flag, " takes one size"));
  *out = values[0];
  return absl::OkStatus();
}

}  // namespace

std::string RowWorkload(const BenchArgs& args, absl::Duration default_spin) {
  std::string workload =
      absl::StrCat(WorkloadName(args.workload), args.registered ? "_registered" : "",
                   args.blocking ? "_blocking" : "", args.event ? "_event" : "");
  if (args.spin && *args.spin != default_spin) {
    const absl::Duration spin = *args.spin;
    absl::StrAppend(&workload, "_spin",
                    spin % absl::Microseconds(1) == absl::ZeroDuration()
                        ? absl::StrCat(absl::ToInt64Microseconds(spin), "us")
                        : absl::StrCat(absl::ToInt64Nanoseconds(spin), "ns"));
  }
  return workload;
}

const char* WorkloadName(Workload workload) {
  switch (workload) {
    case Workload::kEcho:
      return "echo";
    case Workload::kPut:
      return "put";
    case Workload::kGet:
      return "get";
    case Workload::kStream:
      return "stream";
  }
  return "?";
}

uint64_t MaxEchoPayload(uint64_t slot_size) {
  // Frame header 8 + RPC header 32 + the bytes field's tag and length (at most 1 + 5).
  constexpr uint64_t kOverhead = 8 + 32 + 6;
  return slot_size > kOverhead ? slot_size - kOverhead : 0;
}

absl::StatusOr<BenchArgs> ParseBenchArgs(const std::vector<std::string>& args) {
  BenchArgs parsed;
  const examples::cli::Options options{
      {"listen", "max-bulk", "arena", "pollers", "spin", "connect", "workload", "size", "in-flight",
       "connections", "threads", "calls", "duration", "warmup", "round", "json"},
      {"event", "sweep", "registered", "pool-handlers", "blocking"},
      /*positional=*/true};
  absl::StatusOr<std::vector<examples::cli::Word>> words =
      examples::cli::Tokenize(args, options, &parsed.help);
  if (parsed.help) return parsed;
  if (!words.ok()) return words.status();
  if (words->empty() || !words->front().name.empty() ||
      (words->front().value != "server" && words->front().value != "client")) {
    return absl::InvalidArgumentError("the first argument is the mode: server or client");
  }
  parsed.server = words->front().value == "server";
  bool sweep = false;
  bool calls_set = false;
  std::vector<std::string> seen;
  for (size_t i = 1; i < words->size(); ++i) {
    const examples::cli::Word& word = (*words)[i];
    if (word.name.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("unexpected argument '", word.value, "' (the mode comes first, once)"));
    }
    const std::string flag = "--" + word.name;
    const std::string& value = word.value;
    if (std::find(seen.begin(), seen.end(), flag) != seen.end()) {
      return absl::InvalidArgumentError(absl::StrCat(flag, " given twice"));
    }
    seen.push_back(flag);
    // A client flag given to a server (or the reverse) is a mistake, not a no-op.
    const bool server_only = flag == "--listen" || flag == "--max-bulk" || flag == "--arena" ||
                             flag == "--pool-handlers";
    const bool both = flag == "--pollers" || flag == "--event" || flag == "--spin";
    const bool client_only = !server_only && !both;
    if ((parsed.server && client_only) || (!parsed.server && server_only)) {
      return absl::InvalidArgumentError(
          absl::StrCat(flag, " is a ", server_only ? "server" : "client", " flag, not a ",
                       parsed.server ? "server" : "client", " one"));
    }
    absl::Status s;
    if (flag == "--listen") {
      parsed.listen = value;
    } else if (flag == "--max-bulk") {
      s = ParseOneBytes(flag, value, 1, kMaxSize, &parsed.max_bulk);
    } else if (flag == "--arena") {
      s = ParseOneBytes(flag, value, 64, uint64_t{1} << 30, &parsed.arena);
      if (s.ok() && parsed.arena % 64 != 0) {
        s = absl::InvalidArgumentError(absl::StrCat("--arena ", value, " is not a multiple of 64"));
      }
    } else if (flag == "--pollers") {
      s = ParseOne(flag, value, 1, 64, &parsed.pollers);
    } else if (flag == "--event") {
      parsed.event = true;
    } else if (flag == "--spin") {
      absl::Duration spin;
      if (!absl::ParseDuration(value, &spin) || spin < absl::ZeroDuration() ||
          spin > absl::Seconds(1)) {
        s = absl::InvalidArgumentError(
            absl::StrCat("--spin: \"", value, "\" is not a duration in [0, 1s] (50us, 1ms, 0)"));
      }
      parsed.spin = spin;
    } else if (flag == "--connect") {
      parsed.connect = value;
    } else if (flag == "--workload") {
      if (value == "echo") {
        parsed.workload = Workload::kEcho;
      } else if (value == "put") {
        parsed.workload = Workload::kPut;
      } else if (value == "get") {
        parsed.workload = Workload::kGet;
      } else if (value == "stream") {
        parsed.workload = Workload::kStream;
      } else {
        s = absl::InvalidArgumentError(
            absl::StrCat("--workload: \"", value, "\" is not echo, put, get or stream"));
      }
    } else if (flag == "--size") {
      s = ParseBytesList(flag, value, 0, kMaxSize, &parsed.sizes);
    } else if (flag == "--in-flight") {
      s = ParseList(flag, value, 1, 4096, &parsed.in_flight);
    } else if (flag == "--connections") {
      s = ParseList(flag, value, 1, 1024, &parsed.connections);  // ChannelOptions::connections
    } else if (flag == "--threads") {
      s = ParseOne(flag, value, 1, 256, &parsed.threads);
    } else if (flag == "--calls") {
      s = ParseOne(flag, value, uint64_t{1}, uint64_t{1} << 40, &parsed.calls);
      calls_set = true;
    } else if (flag == "--duration") {
      double seconds = 0;
      if (!absl::SimpleAtod(value, &seconds) || !(seconds > 0) || seconds > 86400) {
        s = absl::InvalidArgumentError(
            absl::StrCat("--duration: \"", value, "\" is not a number of seconds in (0, 86400]"));
      }
      parsed.duration = absl::Seconds(seconds);
    } else if (flag == "--warmup") {
      s = ParseOne(flag, value, uint64_t{0}, uint64_t{1} << 40, &parsed.warmup);
    } else if (flag == "--round") {
      s = ParseOne(flag, value, 0, 1000000, &parsed.round);
    } else if (flag == "--json") {
      parsed.json = value;
    } else if (flag == "--sweep") {
      sweep = true;
    } else if (flag == "--registered") {
      parsed.registered = true;
    } else if (flag == "--pool-handlers") {
      parsed.pool_handlers = true;
    } else if (flag == "--blocking") {
      parsed.blocking = true;
    }
    if (!s.ok()) return s;
  }
  if (parsed.spin && !parsed.event) {
    return absl::InvalidArgumentError("--spin: a busy poller never sleeps; it needs --event");
  }
  if (parsed.server) return parsed;
  if (parsed.connect.empty()) return absl::InvalidArgumentError("client: --connect is required");
  if (calls_set && parsed.duration > absl::ZeroDuration()) {
    return absl::InvalidArgumentError("--calls and --duration exclude each other");
  }
  if (parsed.registered && parsed.workload != Workload::kPut) {
    return absl::InvalidArgumentError(
        "--registered: only put sends a payload from the client's memory");
  }
  if (parsed.blocking && (parsed.workload != Workload::kEcho || sweep ||
                          parsed.in_flight != std::vector<int>{parsed.threads})) {
    return absl::InvalidArgumentError(
        "--blocking: echo only, one call in flight per thread (--in-flight equal to --threads), "
        "no --sweep");
  }
  if (sweep) {
    if (parsed.workload == Workload::kEcho) {
      parsed.sizes = {0, 64, 512, 4096};
    } else {
      parsed.sizes = {4096, 65536, 1 << 20, 16 << 20};
      parsed.max_bytes_in_flight = kSweepBulkBytes;
    }
    parsed.in_flight = {1, 4, 16, 64};
    parsed.connections = {1, 2};
  }
  for (int in_flight : parsed.in_flight) {
    if (in_flight < parsed.threads) {
      return absl::InvalidArgumentError(
          absl::StrCat("--in-flight ", in_flight, " is less than --threads ", parsed.threads,
                       ": every thread keeps at least one call in flight"));
    }
  }
  if (parsed.workload == Workload::kStream) {
    if (sweep || parsed.threads != 1 || parsed.connections != std::vector<int>{1} ||
        parsed.duration > absl::ZeroDuration()) {
      return absl::InvalidArgumentError(
          "--workload stream: one stream on one connection, of --calls messages (no --sweep, "
          "--threads, --connections or --duration)");
    }
    if (parsed.in_flight.size() != 1) {
      return absl::InvalidArgumentError("--workload stream: one --in-flight (the window)");
    }
    for (uint64_t size : parsed.sizes) {
      if (size > (uint64_t{256} << 10)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "--size ", size, ": a stream's messages are at most 256 KiB (the client's arena)"));
      }
    }
  }
  if (parsed.workload == Workload::kEcho) {
    for (uint64_t size : parsed.sizes) {
      if (size > (uint64_t{1} << 20)) {
        return absl::InvalidArgumentError(
            absl::StrCat("--size ", size,
                         ": echo carries its payload in the message; use put or get for "
                         "payloads over 1 MiB"));
      }
    }
  }
  return parsed;
}

absl::StatusOr<examples::cli::HostPort> ParseAddress(const char* flag, const std::string& text,
                                                     bool need_address) {
  std::optional<examples::cli::HostPort> parsed = examples::cli::ParseHostPort(text);
  if (!parsed.has_value() || (need_address && parsed->address.empty())) {
    return absl::InvalidArgumentError(absl::StrCat(flag, " \"", text, "\" is not ADDR:PORT"));
  }
  return *parsed;
}

int BenchMain(const char* program, const char* usage, int argc, char** argv,
              absl::Status (*check)(const BenchArgs&), int (*serve)(const BenchArgs&),
              int (*client)(const BenchArgs&)) {
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  const std::vector<std::string> args(argv + 1, argv + argc);
  absl::StatusOr<BenchArgs> parsed = ParseBenchArgs(args);
  if (parsed.ok() && parsed->help) {
    std::fputs(usage, stdout);
    return 0;
  }
  absl::Status s = parsed.status();
  if (s.ok() && check != nullptr) s = check(*parsed);
  if (!s.ok()) {
    std::fprintf(stderr, "%s: %s\n%s", program, std::string(s.message()).c_str(), usage);
    return 2;
  }
  return parsed->server ? serve(*parsed) : client(*parsed);
}

}  // namespace zrpc::bench
