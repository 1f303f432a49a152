// grpc_bench: the gRPC C++ baseline of the benchmark, server and client in one binary, with
// zrpc_bench's command line (bench_args.h) restricted to what gRPC runs here:
//
//   grpc_bench server --listen ADDR:PORT
//   grpc_bench client --connect ADDR:PORT [--size B[,B...]] [--in-flight N[,N...]]
//                     [--calls N | --duration SECONDS] [--warmup N] [--round N] [--json FILE]
//
// The Echo method of the Bench service (bench.proto) over TCP with insecure credentials: a
// synchronous gRPC server, and a closed-loop client on the async API (one CompletionQueue, one
// thread, `in_flight` calls outstanding, a new call issued as each completes). Latency is per
// call, from issue to completion. The client prints a row per run like zrpc_bench and appends it
// to --json as JSON Lines (report.h) with system "grpc", workload "echo". CPU per call: the
// client's from CLOCK_PROCESS_CPUTIME_ID, the server's through the Cpu method, as zrpc_bench.
#include <time.h>

#include <csignal>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "benchmarks/bench.grpc.pb.h"
#include "benchmarks/bench_args.h"
#include "benchmarks/report.h"
#include "benchmarks/run_row.h"
#include "grpcpp/grpcpp.h"

namespace zrpc::bench {
namespace {

constexpr char kUsage[] =
    "usage: grpc_bench server --listen ADDR:PORT\n"
    "       grpc_bench client --connect ADDR:PORT [--size B[,B...]] [--in-flight N[,N...]]\n"
    "                         [--calls N | --duration SECONDS] [--warmup N] [--round N]\n"
    "                         [--json FILE]\n"
    "(zrpc_bench's flags; gRPC runs only the echo workload, one connection, one thread)\n"
    "Options take --name VALUE or --name=VALUE; byte counts take a K, M or G suffix (64K).\n";

// What zrpc_bench accepts but this baseline does not measure: an error naming the flag.
absl::Status CheckSupported(const BenchArgs& args) {
  const BenchArgs defaults;
  if (args.pollers != defaults.pollers) {
    return absl::InvalidArgumentError("--pollers is a zrpc flag; gRPC has no pollers to set");
  }
  if (args.event) return absl::InvalidArgumentError("--event is a zrpc flag");
  if (args.server) {
    if (args.max_bulk != defaults.max_bulk) {
      return absl::InvalidArgumentError("--max-bulk: gRPC runs only the echo workload");
    }
    if (args.listen.empty()) return absl::InvalidArgumentError("server: --listen is required");
    return ParseAddress("--listen", args.listen, true).status();
  }
  if (args.workload != Workload::kEcho) {
    return absl::InvalidArgumentError(absl::StrCat("--workload ", WorkloadName(args.workload),
                                                   ": gRPC runs only the echo workload"));
  }
  if (args.connections != defaults.connections) {
    return absl::InvalidArgumentError("--connections/--sweep: gRPC runs one connection only");
  }
  if (args.threads != defaults.threads) {
    return absl::InvalidArgumentError("--threads: the gRPC client runs one thread only");
  }
  return absl::OkStatus();
}

class EchoService final : public Bench::Service {
 public:
  grpc::Status Echo(grpc::ServerContext*, const EchoMessage* request, EchoMessage* reply) override {
    reply->set_payload(request->payload());
    return grpc::Status::OK;
  }
  grpc::Status Cpu(grpc::ServerContext*, const CpuRequest*, CpuReply* reply) override {
    reply->set_cpu_ns(ProcessCpuNanos());
    return grpc::Status::OK;
  }
  // Put and Get stay unimplemented: zrpc's bulk methods have no gRPC counterpart here.
};

// Set by SIGINT/SIGTERM; the main thread polls it (nothing else is async-signal-safe).
volatile std::sig_atomic_t signalled = 0;
extern "C" void SetSignalled(int) { signalled = 1; }

int Serve(const BenchArgs& args) {
  const std::string host = args.listen.substr(0, args.listen.rfind(':'));
  EchoService service;
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(args.listen, grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0) {
    std::fprintf(stderr, "grpc_bench server: cannot listen on %s\n", args.listen.c_str());
    return 1;
  }
  std::signal(SIGINT, SetSignalled);
  std::signal(SIGTERM, SetSignalled);
  std::printf("listening %s:%d\n", host.c_str(), port);
  std::fflush(stdout);
  while (!signalled) absl::SleepFor(absl::Milliseconds(50));
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  server->Wait();
  return 0;
}

absl::StatusOr<uint64_t> ServerCpu(Bench::Stub& stub) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  CpuReply reply;
  grpc::Status s = stub.Cpu(&context, CpuRequest(), &reply);
  if (!s.ok()) return absl::UnavailableError(absl::StrCat("Cpu: ", s.error_message()));
  return reply.cpu_ns();
}

// One call in flight on the completion queue.
struct Call {
  std::unique_ptr<grpc::ClientContext> context;
  std::unique_ptr<grpc::ClientAsyncResponseReader<EchoMessage>> reader;
  EchoMessage reply;
  grpc::Status status;
  absl::Time issued;
};

// Closed loop: `in_flight` calls outstanding until `calls` have been issued (or, with a
// duration, until it has passed), every completion recorded when `latencies` is set.
absl::Status EchoLoop(Bench::Stub& stub, grpc::CompletionQueue& cq, const EchoMessage& request,
                      int in_flight, uint64_t calls, absl::Time end,
                      std::vector<int64_t>* latencies) {
  std::vector<Call> slots(in_flight);
  uint64_t issued = 0;
  int outstanding = 0;
  auto issue = [&](Call& call) {
    call.context = std::make_unique<grpc::ClientContext>();
    call.reply.Clear();
    call.issued = absl::Now();
    call.reader = stub.AsyncEcho(call.context.get(), request, &cq);
    call.reader->Finish(&call.reply, &call.status, &call);
    ++issued;
    ++outstanding;
  };
  auto more = [&] { return end == absl::InfiniteFuture() ? issued < calls : absl::Now() < end; };
  for (Call& call : slots) {
    if (!more()) break;
    issue(call);
  }
  absl::Status error;
  while (outstanding > 0) {
    void* tag = nullptr;
    bool ok = false;
    if (!cq.Next(&tag, &ok)) return absl::InternalError("completion queue shut down");
    const absl::Time done = absl::Now();
    --outstanding;
    Call& call = *static_cast<Call*>(tag);
    if (!ok || !call.status.ok()) {
      if (error.ok()) {
        error = absl::UnavailableError(absl::StrCat("Echo: ", call.status.error_message()));
      }
    } else if (call.reply.payload().size() != request.payload().size()) {
      if (error.ok()) error = absl::DataLossError("Echo: the reply's payload has another size");
    } else if (latencies != nullptr) {
      latencies->push_back(absl::ToInt64Nanoseconds(done - call.issued));
    }
    if (error.ok() && more()) issue(call);
  }
  return error;
}

absl::StatusOr<RunMeasurement> RunEcho(Bench::Stub& stub, const BenchArgs& args, uint64_t size,
                                       int in_flight) {
  EchoMessage request;
  request.set_payload(std::string(size, '\x5a'));
  grpc::CompletionQueue cq;
  RunMeasurement run;
  absl::Status s =
      EchoLoop(stub, cq, request, in_flight, args.warmup, absl::InfiniteFuture(), nullptr);
  const bool timed = args.duration > absl::ZeroDuration();
  run.latencies_ns.reserve(timed ? size_t{1} << 20 : args.calls);
  absl::StatusOr<uint64_t> server_before = ServerCpu(stub);
  const uint64_t cpu_before = ProcessCpuNanos();
  const absl::Time start = absl::Now();
  if (s.ok()) {
    s = EchoLoop(stub, cq, request, in_flight, args.calls,
                 timed ? start + args.duration : absl::InfiniteFuture(), &run.latencies_ns);
  }
  run.elapsed = absl::Now() - start;
  run.client_cpu_ns = static_cast<double>(ProcessCpuNanos() - cpu_before);
  absl::StatusOr<uint64_t> server_after = ServerCpu(stub);
  cq.Shutdown();
  void* tag;
  bool ok;
  while (cq.Next(&tag, &ok)) {
  }
  if (!s.ok()) return s;
  if (server_before.ok() && server_after.ok()) {
    run.server_cpu_ns = static_cast<double>(*server_after - *server_before);
  }
  return run;
}

int Client(const BenchArgs& args) {
  absl::StatusOr<RowWriter> rows = RowWriter::Open(args.json);
  if (!rows.ok()) {
    std::fprintf(stderr, "grpc_bench: %s\n", std::string(rows.status().message()).c_str());
    return 1;
  }
  grpc::ChannelArguments channel_args;
  // Any payload zrpc_bench's echo takes (up to 1 MiB, bench_args.cc) plus its framing.
  channel_args.SetMaxReceiveMessageSize(4 << 20);
  channel_args.SetMaxSendMessageSize(4 << 20);
  std::shared_ptr<grpc::Channel> channel =
      grpc::CreateCustomChannel(args.connect, grpc::InsecureChannelCredentials(), channel_args);
  if (!channel->WaitForConnected(std::chrono::system_clock::now() + std::chrono::seconds(30))) {
    std::fprintf(stderr, "grpc_bench client: cannot connect to %s\n", args.connect.c_str());
    return 1;
  }
  std::unique_ptr<Bench::Stub> stub = Bench::NewStub(channel);
  for (uint64_t size : args.sizes) {
    for (int in_flight : args.in_flight) {
      absl::StatusOr<RunMeasurement> run = RunEcho(*stub, args, size, in_flight);
      if (run.ok() && run->latencies_ns.empty()) {
        run = absl::DeadlineExceededError("no call completed in the run");
      }
      if (!run.ok()) {
        std::fprintf(stderr, "grpc_bench client: echo %llu B x%d: %s\n",
                     static_cast<unsigned long long>(size), in_flight,
                     run.status().ToString().c_str());
        return 1;
      }
      // Both ways, as zrpc_bench counts an echo's payload bytes.
      run->payload_bytes = 2 * size * run->latencies_ns.size();
      run->note = "gRPC " + grpc::Version() + ", TCP, insecure, async client, sync server";
      rows->Write(MakeRow({"grpc", "echo", size, in_flight, 1, 1, args.round}, *std::move(run)));
    }
  }
  return 0;
}

}  // namespace
}  // namespace zrpc::bench

int main(int argc, char** argv) {
  return zrpc::bench::BenchMain("grpc_bench", zrpc::bench::kUsage, argc, argv,
                                zrpc::bench::CheckSupported, zrpc::bench::Serve,
                                zrpc::bench::Client);
}
