#include "benchmarks/bench_client.h"

#include <algorithm>
#include <atomic>
#include <memory>
#include <optional>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "benchmarks/bench.zrpc.h"
#include "benchmarks/bench_service.h"
#include "rpc/registered_memory.h"
#include "rpc/streaming.h"

namespace zrpc::bench {
namespace {

// In duration mode each thread can record at most this many calls (32 MiB of samples).
constexpr uint64_t kMaxSamplesPerThread = uint64_t{1} << 22;

// One caller thread's calls: its window of call slots, its samples, and what the callbacks (on
// poller threads) report back. The thread issues its window's first calls and then sleeps until
// the last answer: each callback issues the next call itself (Chained).
struct Caller {
  struct Slot {
    EchoMessage echo_request;
    EchoMessage echo_reply;
    BulkRequest bulk_request;
    BulkReply bulk_reply;
    IncomingBulk incoming;
  };
  std::vector<Slot> slots;
  std::vector<int64_t> samples;
  absl::Mutex mu;
  uint64_t completed ABSL_GUARDED_BY(mu) = 0;
  absl::Status error ABSL_GUARDED_BY(mu);
  // The sequence number of the next call, and where the run stops.
  std::atomic<uint64_t> next{0};
  std::atomic<bool> stop{false};
  uint64_t limit = 0;
  absl::Time until = absl::InfiniteFuture();
  bool record = false;
};

// Every window runs chained: each callback issues the next call itself, on the poller thread, as
// a run-to-completion client would (eRPC's, perftest's), with no thread hand-off per call. Any
// window is safe so: a call started on a runtime thread that finds no send slot free waits in
// its connection's queue instead of blocking the thread (rpc/THREADING.md). Before, windows past
// 64 calls per thread were issued by the caller thread, which woke for every free slot: a walk's
// 1,000 x 1 row kept about 300 calls in flight of the 1,000 asked for (benchmarks/README,
// "Active connections").
class Runner {
 public:
  Runner(ClientChannel& channel, const RunSpec& spec, const std::string& payload,
         const RegisteredMemory* memory)
      : stub_(&channel), spec_(spec), payload_(payload), memory_(memory) {}

  // Runs `calls` calls per thread (or until `until`), recording when `record`.
  absl::Status Run(uint64_t calls_per_thread, absl::Time until, bool record,
                   std::vector<std::unique_ptr<Caller>>& callers) {
    std::vector<std::thread> threads;
    for (auto& caller : callers) {
      threads.emplace_back([&, c = caller.get()] { Loop(*c, calls_per_thread, until, record); });
    }
    for (std::thread& thread : threads) thread.join();
    for (auto& caller : callers) {
      absl::MutexLock lock(&caller->mu);
      if (!caller->error.ok()) return caller->error;
    }
    return absl::OkStatus();
  }

 private:
  void Loop(Caller& caller, uint64_t calls, absl::Time until, bool record) {
    if (spec_.blocking) return Blocking(caller, calls, until, record);
    Chained(caller, calls, until, record);
  }

  // Blocking mode: the blocking stub, one call at a time from this thread (its window is 1).
  void Blocking(Caller& caller, uint64_t calls, absl::Time until, bool record) {
    Caller::Slot& slot = caller.slots.front();
    const bool timed = until != absl::InfiniteFuture();
    const CallOptions options = CallOptions::Timeout(absl::Seconds(60));
    uint64_t done = 0;
    for (; done < calls; ++done) {
      if (timed && (done & 63) == 0 && absl::Now() >= until) break;
      const int64_t start = absl::GetCurrentTimeNanos();
      const absl::Status status = stub_.Echo(slot.echo_request, &slot.echo_reply, options);
      if (record) caller.samples[done] = absl::GetCurrentTimeNanos() - start;
      if (!status.ok()) {
        absl::MutexLock lock(&caller.mu);
        if (caller.error.ok()) caller.error = status;
        break;
      }
    }
    if (record) caller.samples.resize(done);
  }

  void Chained(Caller& caller, uint64_t calls, absl::Time until, bool record) {
    {
      absl::MutexLock lock(&caller.mu);
      caller.completed = 0;
    }
    caller.next.store(0);
    caller.stop.store(false);
    caller.limit = calls;
    caller.until = until;
    caller.record = record;
    for (size_t j = 0; j < caller.slots.size(); ++j) IssueNext(caller, j);
    struct Done {
      Caller* caller;
      bool operator()() const ABSL_NO_THREAD_SAFETY_ANALYSIS {
        return caller->completed == std::min(caller->next.load(), caller->limit);
      }
    } done{&caller};
    absl::MutexLock lock(&caller.mu);
    caller.mu.Await(absl::Condition(&done));
    if (record) caller.samples.resize(std::min(caller.next.load(), calls));
  }

  // Issues the next call from `slot_index` unless the run is over. A call that is
  // not issued takes no sequence number, so "completed == issued" is exact at the end.
  void IssueNext(Caller& caller, size_t slot_index) {
    if (caller.stop.load(std::memory_order_relaxed)) return;
    if (caller.until != absl::InfiniteFuture() && absl::Now() >= caller.until) {
      caller.stop.store(true, std::memory_order_relaxed);
      return;
    }
    const uint64_t seq = caller.next.fetch_add(1, std::memory_order_relaxed);
    if (seq >= caller.limit) return;
    Issue(caller, slot_index, caller.record ? static_cast<int64_t>(seq) : -1);
  }

  void Issue(Caller& caller, uint64_t slot_index, int64_t sample) {
    Caller::Slot& slot = caller.slots[slot_index];
    // The captures fit DoneCallback's 48 bytes (checked below): no allocation per call.
    const int64_t start = absl::GetCurrentTimeNanos();
    const auto slot_index32 = static_cast<uint32_t>(slot_index);
    auto done = [this, &caller, slot_index32, start, sample](absl::Status status) {
      const size_t slot_index = slot_index32;
      const int64_t ns = absl::GetCurrentTimeNanos() - start;
      if (sample >= 0) caller.samples[sample] = ns;
      if (spec_.workload == Workload::kGet) {
        // Read in place (its size is what the benchmark checks) and released at once, as a
        // well-behaved application does: a payload held blocks every answer the server sends
        // after it once the arena is full (a slot that issues no further call would hold its
        // last one to the end of the run, and the calls behind it would never finish).
        zrpc::IncomingBulk& payload = caller.slots[slot_index].incoming;
        if (status.ok() && payload.size() != spec_.size) {
          status = absl::DataLossError(
              absl::StrCat("Get returned ", payload.size(), " bytes for ", spec_.size));
        }
        payload.Reset();
      }
      if (!status.ok()) caller.stop.store(true, std::memory_order_relaxed);
      if (status.ok()) IssueNext(caller, slot_index);
      absl::MutexLock lock(&caller.mu);
      if (!status.ok() && caller.error.ok()) caller.error = status;
      ++caller.completed;
    };
    static_assert(DoneCallback::StoresInline<decltype(done)>());
    const CallOptions options = CallOptions::Timeout(absl::Seconds(60));
    switch (spec_.workload) {
      case Workload::kEcho:
        stub_.AsyncEcho(slot.echo_request, &slot.echo_reply, options, std::move(done));
        return;
      case Workload::kPut:
        stub_.AsyncPut(slot.bulk_request,
                       memory_ != nullptr ? *memory_->Bulk(0, payload_.size())
                                          : OutgoingBulk(payload_.data(), payload_.size()),
                       &slot.bulk_reply, options, std::move(done));
        return;
      case Workload::kGet:
        stub_.AsyncGet(slot.bulk_request, &slot.bulk_reply, &slot.incoming, options,
                       std::move(done));
        return;
      case Workload::kStream:  // RunStream's, never issued here
        return;
    }
  }

  Bench::Stub stub_;
  const RunSpec& spec_;
  const std::string& payload_;
  const RegisteredMemory* memory_;  // null: payloads from ordinary memory (staged)
};

// One stream of `count` messages; each Read's wait into `samples` (when given).
absl::Status ReadStream(Bench::Stub& stub, uint64_t count, uint64_t size,
                        std::vector<int64_t>* samples) {
  StreamRequest request;
  request.set_count(count);
  request.set_size(size);
  ClientReader<EchoMessage> reader = stub.Stream(request, CallOptions::Timeout(absl::Hours(1)));
  EchoMessage message;
  uint64_t read = 0;
  for (;;) {
    const absl::Time before = absl::Now();
    if (!reader.Read(&message)) break;
    if (samples != nullptr) samples->push_back(absl::ToInt64Nanoseconds(absl::Now() - before));
    if (message.payload().size() != size) {
      reader.Cancel();
      static_cast<void>(reader.Finish());
      return absl::DataLossError(absl::StrCat("stream message ", read, " has ",
                                              message.payload().size(), " bytes, not ", size));
    }
    ++read;
  }
  absl::Status status = reader.Finish();
  if (status.ok() && read != count) {
    status = absl::DataLossError(
        absl::StrCat("the stream ended after ", read, " of ", count, " messages"));
  }
  return status;
}

// The stream workload: see bench_args.h.
absl::StatusOr<RunMeasurement> RunStream(ClientChannel& channel, const RunSpec& spec) {
  Bench::Stub stub(&channel);
  if (spec.warmup > 0) {
    if (absl::Status s = ReadStream(stub, spec.warmup, spec.size, nullptr); !s.ok()) return s;
  }
  CpuRequest cpu_request;
  CpuReply before, after;
  const bool server_cpu =
      stub.Cpu(cpu_request, &before, CallOptions::Timeout(absl::Seconds(30))).ok();
  RunMeasurement result;
  result.latencies_ns.reserve(spec.calls);
  const uint64_t client_before = ProcessCpuNanos();
  const absl::Time start = absl::Now();
  absl::Status s = ReadStream(stub, spec.calls, spec.size, &result.latencies_ns);
  result.elapsed = absl::Now() - start;
  const uint64_t client_after = ProcessCpuNanos();
  if (!s.ok()) return s;
  result.payload_bytes = spec.calls * spec.size;
  result.client_cpu_ns = static_cast<double>(client_after - client_before);
  result.note = "stream: calls are messages, latency the wait per Read";
  result.keeps_window = false;  // --in-flight is the stream's window, read one message at a time
  if (server_cpu && stub.Cpu(cpu_request, &after, CallOptions::Timeout(absl::Seconds(30))).ok()) {
    result.server_cpu_ns = static_cast<double>(after.cpu_ns() - before.cpu_ns());
  } else {
    result.note += "; server CPU not measured";
  }
  return result;
}

}  // namespace

absl::StatusOr<RunMeasurement> RunWorkload(ClientChannel& channel, const RunSpec& spec) {
  if (spec.workload == Workload::kStream) return RunStream(channel, spec);
  std::string payload(spec.workload == Workload::kGet ? 0 : spec.size, '\x42');
  std::optional<RegisteredMemory> memory;
  if (spec.registered && !payload.empty()) {
    absl::StatusOr<RegisteredMemory> registered =
        channel.RegisterMemory(payload.data(), payload.size());
    if (!registered.ok()) return registered.status();
    memory = *std::move(registered);
  }
  const uint64_t staged_before = channel.stats().bulk_bytes_staged;
  std::vector<std::unique_ptr<Caller>> callers;
  const uint64_t per_thread =
      spec.duration > absl::ZeroDuration()
          ? kMaxSamplesPerThread
          : (spec.calls + spec.threads - 1) / static_cast<uint64_t>(spec.threads);
  for (int t = 0; t < spec.threads; ++t) {
    auto caller = std::make_unique<Caller>();
    const int window = spec.in_flight / spec.threads + (t < spec.in_flight % spec.threads);
    caller->slots = std::vector<Caller::Slot>(window);
    for (Caller::Slot& slot : caller->slots) {
      if (spec.workload == Workload::kEcho) slot.echo_request.set_payload(payload);
      slot.bulk_request.set_size(spec.size);
    }
    caller->samples.assign(per_thread, 0);
    callers.push_back(std::move(caller));
  }
  Runner runner(channel, spec, payload, memory ? &*memory : nullptr);
  if (spec.warmup > 0) {
    absl::Status s = runner.Run((spec.warmup + spec.threads - 1) / spec.threads,
                                absl::InfiniteFuture(), false, callers);
    if (!s.ok()) return s;
  }

  Bench::Stub stub(&channel);
  CpuRequest cpu_request;
  CpuReply before, after;
  const bool server_cpu =
      stub.Cpu(cpu_request, &before, CallOptions::Timeout(absl::Seconds(30))).ok();
  const uint64_t client_before = ProcessCpuNanos();
  const absl::Time start = absl::Now();
  absl::Status s = runner.Run(
      per_thread,
      spec.duration > absl::ZeroDuration() ? start + spec.duration : absl::InfiniteFuture(), true,
      callers);
  const absl::Time end = absl::Now();
  const uint64_t client_after = ProcessCpuNanos();
  if (!s.ok()) return s;
  const bool server_cpu_after =
      server_cpu && stub.Cpu(cpu_request, &after, CallOptions::Timeout(absl::Seconds(30))).ok();

  RunMeasurement result;
  for (auto& caller : callers) {
    result.latencies_ns.insert(result.latencies_ns.end(), caller->samples.begin(),
                               caller->samples.end());
  }
  const uint64_t calls = result.latencies_ns.size();
  if (calls == 0) return absl::InternalError("no call was measured");
  if (memory && channel.stats().bulk_bytes_staged != staged_before) {
    return absl::InternalError(absl::StrCat("a registered run staged ",
                                            channel.stats().bulk_bytes_staged - staged_before,
                                            " payload bytes: it did not measure zero-copy sends"));
  }
  result.elapsed = end - start;
  result.keeps_window = !spec.blocking;  // a blocking caller has one call, and its own gaps
  result.payload_bytes = calls * spec.size * (spec.workload == Workload::kEcho ? 2 : 1);
  result.client_cpu_ns = static_cast<double>(client_after - client_before);
  if (server_cpu_after) {
    result.server_cpu_ns = static_cast<double>(after.cpu_ns() - before.cpu_ns());
  } else {
    result.note = "server CPU not measured";
  }
  return result;
}

}  // namespace zrpc::bench
