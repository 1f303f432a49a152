// The CPU cost of the pieces a small call is made of, outside the NIC: what the runtime does
// per call besides posting and polling work requests. Google Benchmark, on the host (no device):
//
//   bazel run -c opt //benchmarks:call_path_bench
//
// Each benchmark is one piece as the runtime uses it; benchmarks/CALL_PATH.md counts how many
// times a call pays each, and adds them up. Figures are for the machine they run on: compare
// pieces with each other, not with another machine's.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "benchmarks/bench.pb.h"
#include "rpc/client/call_table.h"
#include "rpc/connection/rpc_header.h"
#include "rpc/generated_api.h"
#include "rpc/metrics.h"

namespace {

void BM_RpcHeaderEncodeDecode(benchmark::State& state) {
  uint8_t buffer[64] = {};
  const zrpc::RpcHeader header = zrpc::RpcHeader::Request(0x1234, 1, 77, 1000000);
  for (auto _ : state) {
    zrpc::EncodeRpcHeader(header, buffer);
    benchmark::DoNotOptimize(zrpc::DecodeRpcHeader(absl::MakeConstSpan(buffer, 40)));
  }
}
BENCHMARK(BM_RpcHeaderEncodeDecode);

// A call's entry, as the client keeps it: pointers and a DoneCallback.
struct Entry {
  const void* method;
  void* response;
  void* response_bulk;
  zrpc::DoneCallback done;
};

void BM_CallTableInsertTake(benchmark::State& state) {
  zrpc::CallTable<Entry> table(4096);
  zrpc::CallIds ids;
  const absl::Time deadline = absl::Now() + absl::Hours(1);
  int sink = 0;
  for (auto _ : state) {
    Entry entry{nullptr, nullptr, nullptr, [&sink](absl::Status) { ++sink; }};
    const uint64_t id = ids.NextInDomain();
    absl::Status inserted = table.Insert(id, std::move(entry), deadline);
    benchmark::DoNotOptimize(inserted);
    zrpc::CallTable<Entry>::Taken taken = table.Take(id);
    benchmark::DoNotOptimize(&*taken);
  }
}
BENCHMARK(BM_CallTableInsertTake);

void BM_MetricsPerCall(benchmark::State& state) {
  zrpc::Metrics metrics;
  zrpc::MethodMetrics& method = metrics.ForMethod(zrpc::MetricsSide::kClient, "a.B/C");
  for (auto _ : state) {
    method.OnStart();
    method.AddMessageBytes(64, 0);
    method.AddBulkBytes(0, 0);
    method.AddMessageBytes(0, 64);
    method.OnFinish(absl::StatusCode::kOk, absl::Microseconds(20));
  }
}
BENCHMARK(BM_MetricsPerCall);

void BM_EchoSerializeParse(benchmark::State& state) {
  zrpc::bench::EchoMessage message;
  message.set_payload(std::string(state.range(0), 'x'));
  std::vector<uint8_t> slot(8192);
  zrpc::bench::EchoMessage parsed;
  for (auto _ : state) {
    const size_t size = message.ByteSizeLong();
    message.SerializeWithCachedSizesToArray(slot.data());
    benchmark::DoNotOptimize(parsed.ParseFromArray(slot.data(), static_cast<int>(size)));
  }
}
BENCHMARK(BM_EchoSerializeParse)->Arg(0)->Arg(64)->Arg(4000);

void BM_DoneCallbackLikeUnaryCall(benchmark::State& state) {
  // UnaryCall's lambda captures two references: std::function stores it without allocating.
  absl::Status result;
  absl::Notification* finished = nullptr;
  for (auto _ : state) {
    zrpc::DoneCallback done = [&result, &finished](absl::Status s) {
      result = std::move(s);
      benchmark::DoNotOptimize(finished);
    };
    done(absl::OkStatus());
  }
}
BENCHMARK(BM_DoneCallbackLikeUnaryCall);

void BM_NotificationNotifyWait(benchmark::State& state) {
  // The blocking stub's hand-off, on one thread (no wake-up: the cost of the object alone).
  for (auto _ : state) {
    absl::Notification finished;
    finished.Notify();
    finished.WaitForNotification();
  }
}
BENCHMARK(BM_NotificationNotifyWait);

struct Ticket {
  std::shared_ptr<int> connection;
  uint8_t* data;
  uint32_t capacity;
  uint32_t slot;
};

void BM_HeapTicketWithSharedPtr(benchmark::State& state) {
  // The client's SlotTicket: one allocation and one shared_ptr copy per call.
  auto connection = std::make_shared<int>(1);
  for (auto _ : state) {
    auto* ticket = new Ticket{connection, nullptr, 0, 0};
    benchmark::DoNotOptimize(ticket);
    delete ticket;
  }
}
BENCHMARK(BM_HeapTicketWithSharedPtr);

void BM_AbslNow(benchmark::State& state) {
  for (auto _ : state) benchmark::DoNotOptimize(absl::Now());
}
BENCHMARK(BM_AbslNow);

void BM_MutexLockUnlock(benchmark::State& state) {
  absl::Mutex mu;
  int value = 0;
  for (auto _ : state) {
    absl::MutexLock lock(&mu);
    benchmark::DoNotOptimize(++value);
  }
}
BENCHMARK(BM_MutexLockUnlock);

void BM_ServerCallMapInsertErase(benchmark::State& state) {
  // The server's per-connection map of calls in flight (cancels, Shutdown).
  absl::flat_hash_map<uint64_t, void*> calls;
  uint64_t id = 1;
  for (auto _ : state) {
    calls.emplace(id, nullptr);
    calls.erase(id);
    id += (uint64_t{1} << 24);
  }
}
BENCHMARK(BM_ServerCallMapInsertErase);

// The same lock with Abseil's deadlock detection off. Debian's Abseil is built without NDEBUG, so
// by default every absl::Mutex lock also updates a process-wide lock-order graph; programs that
// want release behaviour turn it off at the start of main, as zrpc_bench does. Registered last:
// it leaves detection off for the rest of the process.
void BM_MutexLockUnlockNoDeadlockDetection(benchmark::State& state) {
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  absl::Mutex mu;
  int value = 0;
  for (auto _ : state) {
    absl::MutexLock lock(&mu);
    benchmark::DoNotOptimize(++value);
  }
}
BENCHMARK(BM_MutexLockUnlockNoDeadlockDetection);

}  // namespace

BENCHMARK_MAIN();
