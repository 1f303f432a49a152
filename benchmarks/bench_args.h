// zrpc_bench's command line, parsed and checked apart from main so tests can feed it anything.
//
//   zrpc_bench server [--listen ADDR:PORT] [--pollers N] [--event [--spin DURATION]]
//                     [--max-bulk BYTES] [--arena BYTES] [--pool-handlers]
//   zrpc_bench client --connect ADDR:PORT [--workload echo|put|get|stream] [--size B[,B...]]
//                     [--in-flight N[,N...]] [--connections N[,N...]] [--threads N]
//                     [--calls N | --duration SECONDS] [--warmup N] [--round N]
//                     [--json FILE] [--event [--spin DURATION]] [--sweep] [--registered]
//                     [--blocking]
//
// --spin (event mode, both sides): how long a poller polls after its last completion before it
// sleeps (ChannelOptions::spin, ServerOptions::spin), as "50us", "1ms" or "0"; default theirs
// (50 us). A client row with another spin than the default is named for it: echo_event_spin0us.
// --arena (server): the receive arena each client may write payloads into; larger ones are
// pulled by the server (rpc/WIRE.md). Default: the larger of --max-bulk and 256 KiB, so that
// every payload is written. A small arena measures the pulled path at the same sizes.
// --pool-handlers (server): handlers run on the server's handler pool, the default a server gets
// (ServerOptions::inline_by_default false), not inline on the poller.
// --blocking (client, echo only): each thread calls the blocking stub and waits, one call at a
// time (--in-flight equal to --threads): the default a caller gets. Rows are "echo_blocking".
// With --pool-handlers and --event on both sides it is the default configuration.
// --registered (put only): payloads come from memory the client registered once
// (rpc/registered_memory.h) and are sent with no copy; the row is named put_registered, and the
// run fails if any of its bytes were staged after all.
// --workload stream: one server-streaming call of --calls messages of --size bytes each (after
// a stream of --warmup), read as they come; --in-flight is the stream's window (the messages
// the client holds unread: ChannelOptions::stream_window), a row's "calls" are messages and
// its latency the wait per Read. One thread, one connection; sizes up to 256 KiB.
// Lists (sizes, calls in flight, connections) run every combination, in that nesting order;
// --sweep sets the lists to a standard walk for the workload. Every figure is checked here:
// a benchmark that silently measured something else than asked would be worse than none.
#ifndef ZRPC_BENCHMARKS_BENCH_ARGS_H_
#define ZRPC_BENCHMARKS_BENCH_ARGS_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "examples/cli.h"

namespace zrpc::bench {

enum class Workload { kEcho, kPut, kGet, kStream };
const char* WorkloadName(Workload workload);

struct BenchArgs;
// The workload a client's rows are named for: the workload, then "_registered", "_blocking" and
// "_event" as those flags ask, then "_spin0us" when --spin is not `default_spin` (the runtime's).
std::string RowWorkload(const BenchArgs& args, absl::Duration default_spin);

struct BenchArgs {
  bool help = false;  // --help or -h: print the usage, nothing else
  bool server = false;
  // Server.
  std::string listen;  // empty: the device's address, port 7471
  uint64_t max_bulk = 16u << 20;
  uint64_t arena = 0;          // 0: ArenaFor(max_bulk)
  bool pool_handlers = false;  // handlers on the server's pool (the default users get), not inline
  // Both.
  int pollers = 1;
  bool event = false;                  // event-mode pollers instead of busy polling
  std::optional<absl::Duration> spin;  // --spin: the pollers' spin in event mode
  // Client.
  std::string connect;
  Workload workload = Workload::kEcho;
  std::vector<uint64_t> sizes = {64};
  std::vector<int> in_flight = {1};
  std::vector<int> connections = {1};
  int threads = 1;
  uint64_t calls = 10000;                          // measured calls per combination
  absl::Duration duration = absl::ZeroDuration();  // instead of calls, when set
  uint64_t warmup = 1000;
  int round = 0;
  std::string json;  // append one JSON line per combination
  // Combinations whose payload bytes in flight (size x in_flight) pass this are skipped, with a
  // line saying so; 0 runs everything. --sweep sets it for put and get to kSweepBulkBytes, the
  // staging both sides keep by default (rpc/bulk/staging.h): payloads from unregistered memory are
  // staged, and a call beyond the staging fails with RESOURCE_EXHAUSTED rather than wait.
  uint64_t max_bytes_in_flight = 0;
  bool registered = false;  // put from registered memory (zero-copy)
  bool blocking = false;    // echo through the blocking stub, one call per thread at a time
};

inline constexpr uint64_t kSweepBulkBytes = uint64_t{64} << 20;

inline constexpr char kBenchUsage[] =
    "usage: zrpc_bench server [--listen ADDR:PORT] [--pollers N] [--event [--spin DURATION]]\n"
    "                         [--max-bulk BYTES] [--arena BYTES] [--pool-handlers]\n"
    "       zrpc_bench client --connect ADDR:PORT [--workload echo|put|get|stream]\n"
    "                         [--size B[,B...]]\n"
    "                         [--in-flight N[,N...]] [--connections N[,N...]] [--threads N]\n"
    "                         [--calls N | --duration SECONDS] [--warmup N] [--round N]\n"
    "                         [--json FILE] [--event [--spin DURATION]] [--sweep] [--registered]\n"
    "                         [--blocking]\n"
    "Options take --name VALUE or --name=VALUE; byte counts take a K, M or G suffix (64K).\n";

// kInvalidArgument naming the flag and what is wrong.
absl::StatusOr<BenchArgs> ParseBenchArgs(const std::vector<std::string>& args);

// `text`, the value of `flag` (--listen, --connect), as an address and port: "ADDR:PORT" or
// "[IPV6]:PORT" (examples/cli.h). kInvalidArgument naming the flag otherwise, and when
// `need_address` and the address is empty.
absl::StatusOr<examples::cli::HostPort> ParseAddress(const char* flag, const std::string& text,
                                                     bool need_address);

// Bytes of one echo message's payload that fit a message of `slot_size` bytes.
uint64_t MaxEchoPayload(uint64_t slot_size);

// The benchmark programs' main (zrpc_bench, transport_bench, grpc_bench). Turns off Abseil's
// per-lock deadlock detection first: Debian builds Abseil without NDEBUG, which makes every
// absl::Mutex lock three times dearer (benchmarks/CALL_PATH.md), and a benchmark measures what a
// release deployment runs. Then parses argv, applies `check` (what this program supports; may
// be null), and on a bad command line prints "PROGRAM: why" and `usage` and returns 2;
// otherwise returns what `serve` or `client` returns.
int BenchMain(const char* program, const char* usage, int argc, char** argv,
              absl::Status (*check)(const BenchArgs&), int (*serve)(const BenchArgs&),
              int (*client)(const BenchArgs&));

}  // namespace zrpc::bench

#endif  // ZRPC_BENCHMARKS_BENCH_ARGS_H_
