// count_instructions: one process, no device, no poller threads: a 64 B echo over fakeverbs
// (tests/fakeverbs), driven by this thread alternating passes of both sides' pollers, so that
// every round trip does the same work and its cost can be counted exactly under
// `valgrind --tool=callgrind` (benchmarks/count_instructions.sh reads the counts).
//
//   count_instructions transport|rpc [--calls N] [--warmup N] [--size B] [--depth D]
//                                    [--shared-receive-queue R] [--idle N] [--background-locks N]
//
// transport: zrpc's transport alone (transport::Connection, the echo transport_bench measures).
// rpc: the generated Bench service's Echo, inline handler, async calls chained from their
// callbacks (zrpc_bench's configuration), through Server and ClientChannel.
// --shared-receive-queue R: both sides' pollers share a receive queue of R receives among their
// connections (PollerOptions::shared_receive_queue) instead of a queue per connection.
// --idle N (rpc): N idle connections to the server beside the counted one (a second channel's,
// no calls, no keepalives, on the counted channel's pollers: a poller group), so that what idle
// connections add to a call's work is counted; compare with --idle 1.
// --background-locks N: a thread of this program's own takes a mutex N times every millisecond
// from before the warm-up to the end, standing in for the runtime's threads that run by the
// clock (count_instructions.sh counts the driving thread alone: count_instructions_test checks
// that this moves neither phase).
//
// Each step it finishes goes to stderr as "count_instructions: step NAME after S s" (seconds
// since start), so that a run cut short says how far it came.
//
// After the warm-up (dumped first, so that the counters start from zero) it runs two phases of
// --calls round trips each, dumped after each (callgrind client requests; without valgrind they
// do nothing), so the two phase dumps must agree: they are the same work. It prints what fakeverbs
// carried in each phase (PrintPhase).
#include <valgrind/callgrind.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "benchmarks/bench.zrpc.h"
#include "benchmarks/bench_service.h"
#include "rpc/channel.h"
#include "rpc/common/manual_pollers.h"
#include "rpc/server.h"
#include "tests/fakeverbs/fake_device.h"
#include "tests/fakeverbs/fake_verbs.h"
#include "transport/connection.h"
#include "transport/device.h"
#include "transport/device_config.h"
#include "transport/listener.h"
#include "transport/poller.h"

namespace zrpc::bench {
namespace {

using fakeverbs::FakeDevice;

constexpr char kUsage[] =
    "usage: count_instructions transport|rpc [--calls N] [--warmup N] [--size B] [--depth D]\n"
    "                                        [--shared-receive-queue R] [--idle N (rpc)]\n"
    "                                        [--background-locks N]\n";

struct Args {
  std::string mode;
  uint64_t calls = 1000;
  uint64_t warmup = 1000;
  uint64_t size = 64;
  uint64_t depth = 1;
  uint64_t shared_receive_queue = 0;
  uint64_t idle = 0;              // rpc: idle connections to the server beside the counted one
  uint64_t background_locks = 0;  // a busy thread's mutex acquisitions a millisecond
};

// "count_instructions: step NAME after S s" on stderr (unbuffered): outside the counted phases
// only (a write is a wake, callgrind_counts.py).
const auto kStart = std::chrono::steady_clock::now();
void Step(const char* name) {
  const std::chrono::duration<double> since = std::chrono::steady_clock::now() - kStart;
  std::fprintf(stderr, "count_instructions: step %s after %.1f s\n", name, since.count());
}

// --background-locks: a thread that takes a mutex `locks` times every millisecond until it is
// destroyed, as a timer's pass over a thousand connections would.
class BackgroundLocks {
 public:
  explicit BackgroundLocks(uint64_t locks) {
    if (locks == 0) return;
    thread_ = std::thread([this, locks] {
      while (!stop_.load(std::memory_order_relaxed)) {
        for (uint64_t i = 0; i < locks; ++i) {
          absl::MutexLock lock(&mu_);
          ++taken_;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
    });
  }
  ~BackgroundLocks() {
    stop_.store(true, std::memory_order_relaxed);
    if (thread_.joinable()) thread_.join();
  }

 private:
  std::atomic<bool> stop_{false};
  absl::Mutex mu_;
  uint64_t taken_ ABSL_GUARDED_BY(mu_) = 0;
  std::thread thread_;
};

// "phase N: CALLS calls, SENDS sends, COMPLETIONS completions, S send doorbells, R receive
// doorbells": what the stand-in device carried in a phase (count_instructions.sh leaves its
// instructions out, so this says it did the work), from the counters before and after it.
void PrintPhase(int phase, uint64_t calls, const fakeverbs::Counters& before,
                const fakeverbs::Counters& after) {
  std::printf(
      "phase %d: %llu calls, %llu sends, %llu completions, %llu send doorbells, %llu receive "
      "doorbells\n",
      phase, static_cast<unsigned long long>(calls),
      static_cast<unsigned long long>(after.sends - before.sends),
      static_cast<unsigned long long>(after.completions - before.completions),
      static_cast<unsigned long long>(after.send_posts - before.send_posts),
      static_cast<unsigned long long>(after.recv_posts - before.recv_posts));
}

// The warm-up, then the two counted phases, each dumped (see the top of this file); false as soon
// as `run` (N round trips) fails. The phases are printed after the last dump: a print between
// them would be counted in the second (stdio's lock and buffer).
bool RunPhases(const Args& args, const std::function<bool(uint64_t)>& run) {
  Step("setup");
  BackgroundLocks background(args.background_locks);
  if (!run(args.warmup)) return false;
  // Each phase reads the counters at its start (so both pay for one reading), and the last
  // reading follows the last dump.
  fakeverbs::Counters counters[3];
  for (int phase = 1; phase <= 2; ++phase) {
    // Dumping zeroes every cost center; CALLGRIND_ZERO_STATS leaves some (its next dump was
    // found to hold part of the warm-up). So the warm-up is dumped, and each phase after it.
    if (phase == 1) CALLGRIND_DUMP_STATS_AT("setup and warm-up");
    counters[phase - 1] = fakeverbs::counters();
    const bool ok = run(args.calls);
    CALLGRIND_DUMP_STATS_AT(phase == 1 ? "phase 1" : "phase 2");
    if (!ok) return false;
  }
  counters[2] = fakeverbs::counters();
  Step("phases");
  for (int phase = 1; phase <= 2; ++phase) {
    PrintPhase(phase, args.calls, counters[phase - 1], counters[phase]);
  }
  return true;
}

// ---- transport ---------------------------------------------------------------------------------

// Both sides' handler: the server echoes each message; the client counts the echo and sends the
// next while `remaining` says so.
class EchoHandler final : public transport::ConnectionHandler, public transport::AcceptHandler {
 public:
  EchoHandler(transport::Poller* poller, bool server) : poller_(poller), server_(server) {}

  absl::StatusOr<transport::Placement> Place(const std::string&) override {
    return transport::Placement{poller_, this, nullptr};
  }
  void OnAccepted(std::shared_ptr<transport::Connection> connection) override {
    accepted_ = std::move(connection);
  }
  void OnMessage(transport::Connection& connection,
                 const transport::ReceivedMessage& message) override {
    if (server_) {
      error_.Update(Send(connection, message.data, message.size));
    } else {
      ++received_;
      if (remaining_ > 0) {
        --remaining_;
        error_.Update(Send(connection, message.data, message.size));
      }
    }
    error_.Update(connection.Release(message.handle));
  }
  void OnBulk(transport::Connection& connection, const transport::ReceivedBulk& bulk) override {
    error_.Update(connection.Release(bulk.handle));
  }
  void OnSendDone(transport::Connection&, uint64_t, const absl::Status& status) override {
    error_.Update(status);
  }
  void OnClosed(transport::Connection&, const absl::Status&) override {}

  static absl::Status Send(transport::Connection& connection, const void* data, uint32_t size) {
    absl::StatusOr<transport::SendBuffer> buffer = connection.AcquireSendBuffer();
    if (!buffer.ok()) return buffer.status();
    std::memcpy(buffer->data, data, size);
    return connection.Send(*buffer, size);
  }

  std::shared_ptr<transport::Connection> accepted_;
  uint64_t remaining_ = 0;
  uint64_t received_ = 0;
  absl::Status error_;

 private:
  transport::Poller* const poller_;
  const bool server_;
};

int RunTransport(const Args& args) {
  absl::StatusOr<std::unique_ptr<transport::Device>> device =
      transport::Device::Open(FakeDevice(), transport::SlotPoolOptions{});
  if (!device.ok()) {
    std::fprintf(stderr, "count_instructions: %s\n", device.status().ToString().c_str());
    return 1;
  }
  // Two pollers, never started: this thread runs their passes, through the same seam as the
  // RPC runtime's (manual_pollers.h), so that both modes pay the same for driving.
  transport::PollerOptions poller_options;
  poller_options.shared_receive_queue = static_cast<uint32_t>(args.shared_receive_queue);
  auto server_made = transport::Poller::Create(**device, poller_options);
  auto client_made = transport::Poller::Create(**device, poller_options);
  if (!server_made.ok() || !client_made.ok()) return 1;
  std::shared_ptr<transport::Poller> server_poller = *std::move(server_made);
  std::shared_ptr<transport::Poller> client_poller = *std::move(client_made);
  internal::AddManualPoller(server_poller);
  internal::AddManualPoller(client_poller);
  EchoHandler server(server_poller.get(), /*server=*/true);
  EchoHandler client(client_poller.get(), /*server=*/false);
  auto listener = transport::Listener::Create(**device, fakeverbs::kAddress, 0, &server);
  if (!listener.ok()) {
    std::fprintf(stderr, "count_instructions: %s\n", listener.status().ToString().c_str());
    return 1;
  }
  auto connection =
      transport::Connection::Connect(**device, *client_poller, fakeverbs::kAddress,
                                     (*listener)->port(), &client, {}, absl::Seconds(10));
  if (!connection.ok()) {
    std::fprintf(stderr, "count_instructions: %s\n", connection.status().ToString().c_str());
    return 1;
  }
  const std::string payload(args.size, 'x');
  auto run = [&](uint64_t calls) -> bool {
    const uint64_t target = client.received_ + calls;
    client.remaining_ = calls - args.depth;
    for (uint64_t i = 0; i < args.depth; ++i) {
      client.error_.Update(EchoHandler::Send(**connection, payload.data(), args.size));
    }
    // The two pollers' passes, as their threads would run them, and nothing else: no lookup
    // of which pollers exist (DriveManualPollersOnce's lock and references) between them.
    while (client.received_ < target && client.error_.ok() && server.error_.ok()) {
      server_poller->RunOnce(absl::ZeroDuration());
      client_poller->RunOnce(absl::ZeroDuration());
    }
    return client.error_.ok() && server.error_.ok();
  };
  if (!RunPhases(args, run)) {
    std::fprintf(stderr, "count_instructions: %s %s\n", client.error_.ToString().c_str(),
                 server.error_.ToString().c_str());
    return 1;
  }
  // What the shared receive queues hold posted (0 without them): count_instructions_test checks
  // that the queues it asked for carried the echo.
  std::printf("shared receives posted: %u %u\n", server_poller->shared_receives_posted(),
              client_poller->shared_receives_posted());
  (*connection)->Close();
  for (int i = 0; i < 100; ++i) internal::DriveManualPollersOnce();
  return 0;
}

// ---- rpc
// -----------------------------------------------------------------------------------------

int RunRpc(const Args& args) {
  internal::SetManualPollers(true);
  ServerOptions server_options;
  server_options.device = FakeDevice();
  server_options.address = fakeverbs::kAddress;
  server_options.port = 0;
  server_options.inline_by_default = true;
  server_options.shared_receive_queue = static_cast<uint32_t>(args.shared_receive_queue);
  // No sweeper passes, and (below) no keepalives: they run by the clock, not by the calls, and a
  // pass that fell in a phase moved its counts (8.10 atomics per round trip, 1 run in 3).
  server_options.idle_probe_interval = absl::ZeroDuration();
  server_options.liveness_probe_interval = absl::ZeroDuration();
  // One address holds every connection here (--idle): its limit stands at max_connections.
  server_options.listener.max_connections_per_peer = server_options.listener.max_connections;
  BenchService service(0);
  absl::StatusOr<std::unique_ptr<Server>> server = Server::Create(server_options);
  absl::Status s = server.ok() ? (*server)->AddService(&service) : server.status();
  if (s.ok()) s = (*server)->Start();
  if (!s.ok()) {
    std::fprintf(stderr, "count_instructions: %s\n", s.ToString().c_str());
    return 1;
  }
  ChannelOptions channel_options;
  channel_options.device = FakeDevice();
  channel_options.keepalive_interval = absl::ZeroDuration();
  channel_options.shared_receive_queue = static_cast<uint32_t>(args.shared_receive_queue);
  // With idle connections, both channels share their pollers (a poller group), so that the
  // driver's passes are the same pollers' whatever their number: compare --idle 1 with --idle N.
  if (args.idle > 0) channel_options.poller_group = "count_instructions";
  absl::StatusOr<std::unique_ptr<ClientChannel>> channel =
      CreateChannel(absl::StrCat(fakeverbs::kAddress, ":", (*server)->port()), channel_options);
  s = channel.ok() ? (*channel)->Connect(absl::Now() + absl::Seconds(10)) : channel.status();
  if (!s.ok()) {
    std::fprintf(stderr, "count_instructions: %s\n", s.ToString().c_str());
    return 1;
  }
  // Idle connections beside the counted one, from a channel of their own that never calls or
  // pings: whatever they add to a call's work (a poller's batch, the server's lookups) shows as
  // instructions per round trip.
  std::unique_ptr<ClientChannel> idle;
  if (args.idle > 0) {
    ChannelOptions idle_options = channel_options;
    idle_options.connections = static_cast<int>(args.idle);
    absl::StatusOr<std::unique_ptr<ClientChannel>> made =
        CreateChannel(absl::StrCat(fakeverbs::kAddress, ":", (*server)->port()), idle_options);
    s = made.ok() ? (*made)->Connect(absl::Now() + absl::Minutes(1)) : made.status();
    if (s.ok() && (*server)->stats().connections_open != args.idle + 1) {
      s = absl::UnavailableError(absl::StrCat("the server holds ",
                                              (*server)->stats().connections_open,
                                              " connections, not ", args.idle + 1));
    }
    if (!s.ok()) {
      std::fprintf(stderr, "count_instructions: idle connections: %s\n", s.ToString().c_str());
      return 1;
    }
    idle = std::move(*made);
    Step("idle connections");
  }
  Bench::Stub stub(channel->get());
  EchoMessage request;
  request.set_payload(std::string(args.size, 'x'));
  std::vector<EchoMessage> replies(args.depth);  // one per chain
  uint64_t remaining = 0, done_calls = 0;
  absl::Status error;
  // Each callback starts its chain's next call, on the poller pass that ran it, with a deadline
  // of its own, as zrpc_bench's client does (bench_client.cc): its clock read is counted too.
  std::function<void(EchoMessage*, absl::Status)> done = [&](EchoMessage* reply,
                                                             absl::Status status) {
    ++done_calls;
    error.Update(status);
    if (status.ok() && remaining > 0) {
      --remaining;
      stub.AsyncEcho(request, reply, CallOptions::Timeout(absl::Seconds(60)),
                     [&done, reply](absl::Status next) { done(reply, next); });
    }
  };
  // The runtimes' pollers, looked up once (see ManualPollersAlive): each pass of the loop below
  // is then only the pollers' own, as on their threads.
  std::vector<std::shared_ptr<transport::Poller>> pollers = internal::ManualPollersAlive();
  auto run = [&](uint64_t calls) -> bool {
    const uint64_t target = done_calls + calls;
    remaining = calls - args.depth;
    for (EchoMessage& reply : replies) {
      EchoMessage* chain = &reply;
      stub.AsyncEcho(request, chain, CallOptions::Timeout(absl::Seconds(60)),
                     [&done, chain](absl::Status next) { done(chain, next); });
    }
    while (done_calls < target && error.ok()) {
      for (const auto& poller : pollers) poller->RunOnce(absl::ZeroDuration());
    }
    return error.ok();
  };
  const bool ran = RunPhases(args, run);
  std::printf("shared receives posted:");
  for (const auto& poller : pollers) std::printf(" %u", poller->shared_receives_posted());
  std::printf("\n");
  pollers.clear();  // before the runtimes close
  if (!ran) {
    std::fprintf(stderr, "count_instructions: %s\n", error.ToString().c_str());
    return 1;
  }
  // The pollers get their threads, so that the channel and the server close as they always do.
  internal::StartManualPollers();
  return 0;
}

}  // namespace
}  // namespace zrpc::bench

int main(int argc, char** argv) {
  // As in every benchmark program (bench_args.h): Debian's Abseil checks lock order on every
  // lock unless told not to, which a release build of Abseil does not.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  zrpc::bench::Args args;
  if (argc < 2) {
    std::fputs(zrpc::bench::kUsage, stderr);
    return 2;
  }
  args.mode = argv[1];
  for (int i = 2; i < argc; i += 2) {
    const std::string flag = argv[i];
    uint64_t value = 0;
    if (i + 1 >= argc || !absl::SimpleAtoi(argv[i + 1], &value) || value == 0) {
      std::fprintf(stderr, "count_instructions: %s needs a positive number\n%s", flag.c_str(),
                   zrpc::bench::kUsage);
      return 2;
    }
    if (flag == "--calls") {
      args.calls = value;
    } else if (flag == "--warmup") {
      args.warmup = value;
    } else if (flag == "--size") {
      args.size = value;
    } else if (flag == "--depth") {
      args.depth = value;
    } else if (flag == "--shared-receive-queue") {
      args.shared_receive_queue = value;
    } else if (flag == "--idle" && args.mode == "rpc") {
      args.idle = value;
    } else if (flag == "--background-locks") {
      args.background_locks = value;
    } else {
      std::fprintf(stderr, "count_instructions: unknown flag %s\n%s", flag.c_str(),
                   zrpc::bench::kUsage);
      return 2;
    }
  }
  if (args.depth > args.calls || args.depth > args.warmup) {
    std::fprintf(stderr, "count_instructions: --depth is more than --calls or --warmup\n%s",
                 zrpc::bench::kUsage);
    return 2;
  }
  int status = 2;
  if (args.mode == "transport") {
    status = zrpc::bench::RunTransport(args);
  } else if (args.mode == "rpc") {
    status = zrpc::bench::RunRpc(args);
  } else {
    std::fputs(zrpc::bench::kUsage, stderr);
    return 2;
  }
  zrpc::bench::Step("teardown");
  return status;
}
