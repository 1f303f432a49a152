// transport_bench: zrpc's transport alone (transport::Connection, no RPC layer), measured the way
// zrpc_bench measures RPCs, so that one harness run can split zrpc's cost over perftest into
// "what the transport adds" and "what the RPC layer adds" (benchmarks/CALL_PATH.md).
//
//   transport_bench server --listen ADDR:PORT [--event [--spin DURATION]]
//   transport_bench client --connect ADDR:PORT [--size B[,B...]] [--in-flight N[,N...]]
//                          [--calls N] [--warmup N] [--round N] [--json FILE]
//                          [--event [--spin DURATION]]
//
// The server echoes every message it receives: a pool slot, a copy, Send, Release. The client
// keeps `in_flight` messages outstanding and sends the next one from the handler of each echo,
// on its poller thread: the structure of zrpc_bench's client (chained windows on the channel's
// poller) without calls, headers, call table, metrics or protobuf. Latency is per message, from
// Send to the echo's arrival. Rows go out as zrpc_bench's, with system "transport" and workload
// "echo" ("echo_event" with --event: both sides' pollers sleep when idle after their spin, as
// zrpc_bench --event's do, so event mode has a layer split too); the server's CPU is not
// measured (-1).
#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "benchmarks/bench_args.h"
#include "benchmarks/report.h"
#include "benchmarks/run_row.h"
#include "benchmarks/stop_signal.h"
#include "transport/connection.h"
#include "transport/device.h"
#include "transport/device_config.h"
#include "transport/listener.h"
#include "transport/poller.h"

namespace zrpc::bench {
namespace {

using transport::Connection;
using transport::ConnectionHandler;
using transport::ReceivedBulk;
using transport::ReceivedMessage;

constexpr char kUsage[] =
    "usage: transport_bench server --listen ADDR:PORT [--event [--spin DURATION]]\n"
    "       transport_bench client --connect ADDR:PORT [--size B[,B...]] [--in-flight N[,N...]]\n"
    "                              [--calls N] [--warmup N] [--round N] [--json FILE]\n"
    "                              [--event [--spin DURATION]]\n"
    "(zrpc_bench's flags; the transport runs only echo, one connection, one thread)\n"
    "Options take --name VALUE or --name=VALUE; byte counts take a K, M or G suffix (64K).\n";

// Slots as zrpc_bench's, so the same sizes fit.
constexpr size_t kSlotSize = 8192;

// What zrpc_bench accepts but this program does not measure: an error naming the flag.
absl::Status CheckSupported(const BenchArgs& args) {
  const BenchArgs defaults;
  if (args.pollers != defaults.pollers) return absl::InvalidArgumentError("--pollers: one poller");
  if (args.server) {
    if (args.max_bulk != defaults.max_bulk) {
      return absl::InvalidArgumentError("--max-bulk: the transport bench runs only echo");
    }
    if (args.listen.empty()) return absl::InvalidArgumentError("server: --listen is required");
    return ParseAddress("--listen", args.listen, true).status();
  }
  if (args.workload != Workload::kEcho) {
    return absl::InvalidArgumentError(
        absl::StrCat("--workload ", WorkloadName(args.workload), ": only echo"));
  }
  if (args.connections != defaults.connections) {
    return absl::InvalidArgumentError("--connections/--sweep: one connection only");
  }
  if (args.threads != defaults.threads) {
    return absl::InvalidArgumentError("--threads: one client thread only");
  }
  if (args.blocking) {
    return absl::InvalidArgumentError("--blocking: the transport bench sends from its poller");
  }
  if (args.duration > absl::ZeroDuration()) {
    return absl::InvalidArgumentError("--duration: the transport bench runs --calls only");
  }
  for (uint64_t size : args.sizes) {
    if (size < sizeof(uint32_t)) {
      return absl::InvalidArgumentError("--size: at least 4 bytes (a message carries its lane)");
    }
  }
  return ParseAddress("--connect", args.connect, true).status();
}

// Sends `length` bytes of `pattern` (the first four replaced by `lane`).
absl::Status SendMessage(Connection& connection, uint32_t length, uint32_t lane) {
  absl::StatusOr<transport::SendBuffer> buffer = connection.AcquireSendBuffer();
  if (!buffer.ok()) return buffer.status();
  if (length > buffer->capacity) {
    connection.ReleaseSendBuffer(*buffer);
    return absl::InvalidArgumentError(
        absl::StrCat(length, " B does not fit a message (", buffer->capacity, " B)"));
  }
  std::memset(buffer->data, 0x5a, length);
  std::memcpy(buffer->data, &lane, sizeof(lane));
  return connection.Send(*buffer, length);  // no OnSendDone: a failure shows in OnClosed
}

// The server's side: every message comes straight back.
class Echoer final : public ConnectionHandler, public transport::AcceptHandler {
 public:
  void set_poller(transport::Poller* poller) { poller_ = poller; }
  // The connections still held; the caller drops them before the poller and device go.
  std::vector<std::shared_ptr<Connection>> TakeAll() {
    absl::MutexLock lock(&mu_);
    return std::move(connections_);
  }

  absl::StatusOr<transport::Placement> Place(const std::string&) override {
    return transport::Placement{poller_, this, nullptr};
  }
  void OnAccepted(std::shared_ptr<Connection> connection) override {
    absl::MutexLock lock(&mu_);
    connections_.push_back(std::move(connection));
  }
  void OnMessage(Connection& connection, const ReceivedMessage& message) override {
    absl::StatusOr<transport::SendBuffer> buffer = connection.AcquireSendBuffer();
    if (buffer.ok() && message.size <= buffer->capacity) {
      std::memcpy(buffer->data, message.data, message.size);
      (void)connection.Send(*buffer, message.size);  // a failure closes the connection
    } else if (buffer.ok()) {
      connection.ReleaseSendBuffer(*buffer);
    }
    (void)connection.Release(message.handle);
  }
  void OnBulk(Connection& connection, const ReceivedBulk& bulk) override {
    (void)connection.Release(bulk.handle);
  }
  void OnSendDone(Connection&, uint64_t, const absl::Status&) override {}
  void OnClosed(Connection& connection, const absl::Status&) override {
    absl::MutexLock lock(&mu_);
    connections_.erase(std::remove_if(connections_.begin(), connections_.end(),
                                      [&](const auto& c) { return c.get() == &connection; }),
                       connections_.end());
  }

 private:
  transport::Poller* poller_ = nullptr;
  absl::Mutex mu_;
  std::vector<std::shared_ptr<Connection>> connections_ ABSL_GUARDED_BY(mu_);
};

// What either side runs on: the device and one started poller, busy or (--event) sleeping when
// idle (destroyed in that order reversed, as they must be).
transport::PollerOptions PollerOptionsFor(const BenchArgs& args) {
  transport::PollerOptions options;
  if (args.event) options.mode = transport::PollMode::kEvent;
  if (args.spin) options.spin = *args.spin;
  return options;
}

struct Stack {
  std::unique_ptr<transport::Device> device;
  std::unique_ptr<transport::Poller> poller;
};

absl::StatusOr<Stack> OpenStack(const BenchArgs& args) {
  absl::StatusOr<transport::DeviceConfig> config = transport::DeviceConfigFromEnv();
  if (!config.ok()) return config.status();
  transport::SlotPoolOptions slots;
  slots.slot_size = kSlotSize;
  Stack stack;
  absl::StatusOr<std::unique_ptr<transport::Device>> device =
      transport::Device::Open(*config, slots);
  if (!device.ok()) return device.status();
  stack.device = *std::move(device);
  absl::StatusOr<std::unique_ptr<transport::Poller>> poller =
      transport::Poller::Create(*stack.device, PollerOptionsFor(args));
  if (!poller.ok()) return poller.status();
  stack.poller = *std::move(poller);
  if (absl::Status s = stack.poller->Start(); !s.ok()) return s;
  return stack;
}

int Serve(const BenchArgs& args) {
  const StopSignal stop;  // before any thread starts
  auto where = ParseAddress("--listen", args.listen, true);
  Echoer echoer;  // declared first: the poller's teardown still reports to it
  absl::StatusOr<Stack> stack = OpenStack(args);
  if (!stack.ok()) {
    std::fprintf(stderr, "transport_bench server: %s\n", stack.status().ToString().c_str());
    return 1;
  }
  echoer.set_poller(stack->poller.get());
  auto listener = transport::Listener::Create(*stack->device, where->address, where->port, &echoer);
  if (!listener.ok()) {
    std::fprintf(stderr, "transport_bench server: %s\n", listener.status().ToString().c_str());
    return 1;
  }
  std::printf("listening %s:%u\n", where->address.c_str(), (*listener)->port());
  std::fflush(stdout);
  stop.Wait();
  listener->reset();
  for (const auto& connection : echoer.TakeAll()) connection->Close();
  stack->poller.reset();  // drives the closes, then stops
  return 0;
}

// The client's side of one run: `in_flight` lanes, each re-sent from its echo's handler.
class Pinger final : public ConnectionHandler {
 public:
  void Begin(Connection* connection, uint32_t size, int in_flight, uint64_t warmup,
             uint64_t total) {
    absl::MutexLock lock(&mu_);
    connection_ = connection;
    size_ = size;
    warmup_ = warmup;
    total_ = total;
    issued_ = 0;
    received_ = 0;
    latencies_.clear();
    latencies_.reserve(total - warmup);
    sent_at_.assign(in_flight, absl::InfinitePast());
    error_ = absl::OkStatus();
    done_ = std::make_unique<absl::Notification>();
    for (int lane = 0; lane < in_flight && issued_ < total_; ++lane) IssueLocked(lane);
  }

  // Waits for the run; the measured latencies, and the time from the first measured send.
  absl::Status Wait(std::vector<int64_t>* latencies, absl::Duration* elapsed) {
    done_->WaitForNotification();
    absl::MutexLock lock(&mu_);
    *latencies = std::move(latencies_);
    *elapsed = last_ - first_measured_;
    return error_;
  }

  void OnMessage(Connection& connection, const ReceivedMessage& message) override {
    const absl::Time now = absl::Now();
    uint32_t lane = UINT32_MAX;
    if (message.size >= sizeof(lane)) std::memcpy(&lane, message.data, sizeof(lane));
    (void)connection.Release(message.handle);
    absl::MutexLock lock(&mu_);
    if (lane >= sent_at_.size() || message.size != size_) {
      FailLocked(absl::DataLossError("an echo came back with another lane or size"));
      return;
    }
    if (received_ == warmup_) first_measured_ = sent_at_[lane];
    if (received_ >= warmup_) latencies_.push_back(absl::ToInt64Nanoseconds(now - sent_at_[lane]));
    ++received_;
    last_ = now;
    if (issued_ < total_) {
      IssueLocked(lane);
    } else if (received_ == total_) {
      done_->Notify();
    }
  }
  void OnBulk(Connection& connection, const ReceivedBulk& bulk) override {
    (void)connection.Release(bulk.handle);
  }
  void OnSendDone(Connection&, uint64_t, const absl::Status& status) override {
    if (status.ok()) return;
    absl::MutexLock lock(&mu_);
    FailLocked(status);
  }
  void OnClosed(Connection&, const absl::Status& why) override {
    absl::MutexLock lock(&mu_);
    FailLocked(absl::UnavailableError(absl::StrCat("connection closed: ", why.ToString())));
  }

 private:
  void IssueLocked(uint32_t lane) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    sent_at_[lane] = absl::Now();
    ++issued_;
    absl::Status s = SendMessage(*connection_, size_, lane);
    if (!s.ok()) FailLocked(s);
  }
  void FailLocked(absl::Status why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (done_ == nullptr || done_->HasBeenNotified()) return;
    error_ = std::move(why);
    done_->Notify();
  }

  absl::Mutex mu_;
  Connection* connection_ ABSL_GUARDED_BY(mu_) = nullptr;
  uint32_t size_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t warmup_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t total_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t issued_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t received_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<absl::Time> sent_at_ ABSL_GUARDED_BY(mu_);
  std::vector<int64_t> latencies_ ABSL_GUARDED_BY(mu_);
  absl::Time first_measured_ ABSL_GUARDED_BY(mu_);
  absl::Time last_ ABSL_GUARDED_BY(mu_);
  absl::Status error_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<absl::Notification> done_;
};

int Client(const BenchArgs& args) {
  auto where = ParseAddress("--connect", args.connect, true);
  absl::StatusOr<RowWriter> rows = RowWriter::Open(args.json);
  if (!rows.ok()) {
    std::fprintf(stderr, "transport_bench: %s\n", std::string(rows.status().message()).c_str());
    return 1;
  }
  Pinger pinger;  // declared first: the poller's teardown still reports to it
  absl::StatusOr<Stack> stack = OpenStack(args);
  absl::StatusOr<std::shared_ptr<Connection>> connection =
      stack.ok() ? Connection::Connect(*stack->device, *stack->poller, where->address, where->port,
                                       &pinger, {}, absl::Seconds(30))
                 : absl::StatusOr<std::shared_ptr<Connection>>(stack.status());
  if (!connection.ok()) {
    std::fprintf(stderr, "transport_bench client: %s\n", connection.status().ToString().c_str());
    return 1;
  }
  const std::string workload = RowWorkload(args, transport::PollerOptions().spin);
  for (uint64_t size : args.sizes) {
    if (size > (*connection)->max_message_size()) {
      std::fprintf(stderr, "transport_bench: a message is at most %u bytes here\n",
                   (*connection)->max_message_size());
      return 2;
    }
    for (int in_flight : args.in_flight) {
      const uint64_t cpu_before = ProcessCpuNanos();
      pinger.Begin(connection->get(), static_cast<uint32_t>(size), in_flight, args.warmup,
                   args.warmup + args.calls);
      RunMeasurement run;
      absl::Status s = pinger.Wait(&run.latencies_ns, &run.elapsed);
      if (!s.ok()) {
        std::fprintf(stderr, "transport_bench client: echo %llu B x%d: %s\n",
                     static_cast<unsigned long long>(size), in_flight, s.ToString().c_str());
        return 1;
      }
      // The warm-up's CPU is included; over a run of thousands of messages it is small.
      run.client_cpu_ns = static_cast<double>(ProcessCpuNanos() - cpu_before);
      run.payload_bytes = 2 * size * args.calls;
      run.note = "transport::Connection echo, no RPC layer";
      rows->Write(
          MakeRow({"transport", workload, size, in_flight, 1, 1, args.round}, std::move(run)));
    }
  }
  (*connection)->Close();
  return 0;
}

}  // namespace
}  // namespace zrpc::bench

int main(int argc, char** argv) {
  return zrpc::bench::BenchMain("transport_bench", zrpc::bench::kUsage, argc, argv,
                                zrpc::bench::CheckSupported, zrpc::bench::Serve,
                                zrpc::bench::Client);
}
