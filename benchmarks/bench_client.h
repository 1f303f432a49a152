// zrpc_bench's client: one closed-loop run of a workload against a Bench server.
//
// Closed loop: `threads` caller threads each keep their share of `in_flight` calls outstanding,
// issuing the next as soon as one completes, until `calls` calls (or `duration`) have been
// measured; `warmup` calls before that are not measured. A call's latency runs from just before
// the stub is called (serialization and send included) to its callback (response parsed), the
// figure a user of the async stub sees. Windows run chained: each callback issues the thread's
// next call itself, on the poller thread, with no hand-off (the run-to-completion style of eRPC
// and perftest); a caller thread issues its window's first calls and sleeps until the last
// answer (a spinning caller would take the core a busy-polling poller needs on a small machine,
// and measure the scheduler).
//
// Blocking (`blocking`, echo only): each thread calls the blocking stub and waits for its answer,
// one call at a time: the default users get, where every answer wakes a sleeping caller.
//
// CPU: the client's own process CPU time over the measured phase, and the server's (read with
// the Cpu rpc before and after), each divided by the calls measured.
#ifndef ZRPC_BENCHMARKS_BENCH_CLIENT_H_
#define ZRPC_BENCHMARKS_BENCH_CLIENT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "benchmarks/bench_args.h"
#include "benchmarks/run_row.h"
#include "rpc/channel.h"

namespace zrpc::bench {

struct RunSpec {
  Workload workload = Workload::kEcho;
  uint64_t size = 64;
  int in_flight = 1;
  int threads = 1;
  uint64_t calls = 10000;
  absl::Duration duration = absl::ZeroDuration();
  uint64_t warmup = 1000;
  bool registered = false;  // put: from memory registered on the channel, with no copy
  bool blocking = false;    // echo: each thread calls the blocking stub, one call at a time
};

// Runs `spec` over `channel`. Any failed call fails the run with its status: a benchmark that
// counted errors as calls would flatter the system. A registered run whose payloads were staged
// after all (the channel's stats say) fails too.
absl::StatusOr<RunMeasurement> RunWorkload(ClientChannel& channel, const RunSpec& spec);

}  // namespace zrpc::bench

#endif  // ZRPC_BENCHMARKS_BENCH_CLIENT_H_
