// Raw-verbs baseline: RC SEND/RECV ping-pong latency and RDMA WRITE throughput over
// transport::RcEndpoint (the verbs smoke test's code), server and client as two threads of this
// process, busy-polling like perftest does. tools/bench runs it next to perftest's ib_send_lat
// and ib_write_bw in the same Soft-RoCE guest, so the figures compare as ratios.
//
// Usage: verbs_pingpong [--size B] [--iters N] [--write-size B] [--write-total B] [--window N]
// The device comes from ZRPC_RDMA_ADDR (tools/softroce sets it).
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "transport/device_config.h"
#include "transport/rc_endpoint.h"

namespace {

using zrpc::transport::Completion;
using zrpc::transport::RcEndpoint;
using zrpc::transport::RcListener;
using zrpc::transport::RcOptions;
using Clock = std::chrono::steady_clock;

constexpr absl::Duration kTimeout = absl::Seconds(60);
constexpr uint32_t kRecvDepth = 64;   // receives kept posted on each side
constexpr uint32_t kSignalEvery = 32;  // selective signalling; < send queue depth / 2

struct Config {
  size_t size = 64;
  size_t iters = 10000;
  size_t warmup = 500;
  size_t write_size = 64 * 1024;
  size_t write_total = 32 << 20;
  size_t window = 16;
};

bool ParseFlags(int argc, char** argv, Config* config) {
  for (int i = 1; i < argc; ++i) {
    std::string flag = argv[i];
    size_t* target = nullptr;
    if (flag == "--size") target = &config->size;
    if (flag == "--iters") target = &config->iters;
    if (flag == "--write-size") target = &config->write_size;
    if (flag == "--write-total") target = &config->write_total;
    if (flag == "--window") target = &config->window;
    if (target == nullptr || i + 1 >= argc || !absl::SimpleAtoi(argv[i + 1], target)) {
      std::fprintf(stderr, "bad flag %s (see the comment at the top of verbs_pingpong.cc)\n",
                   flag.c_str());
      return false;
    }
    ++i;
  }
  if (config->iters == 0 || config->window == 0 || config->write_size == 0 ||
      config->window > 64 || config->size > 1 << 20 || config->write_size > 4 << 20) {
    std::fprintf(stderr, "flags out of range\n");
    return false;
  }
  return true;
}

RcOptions Options(const Config& config) {
  RcOptions options;
  options.recv_size = static_cast<uint32_t>(std::max<size_t>(config.size, 64));
  options.initial_recvs = kRecvDepth;
  // Receive slots, then a send area, then room for the WRITE window.
  options.buffer_size = size_t{kRecvDepth} * options.recv_size + config.size +
                        config.window * config.write_size;
  options.max_send_wr = 128;
  options.max_recv_wr = kRecvDepth;
  return options;
}

size_t SendArea(const RcOptions& options) { return size_t{kRecvDepth} * options.recv_size; }

// Waits for the next receive (returning it) while reaping send completions on the way.
absl::StatusOr<Completion> NextRecv(RcEndpoint& ep) {
  for (;;) {
    auto c = ep.Poll(kTimeout);
    if (!c.ok() || c->kind == Completion::Kind::kRecv ||
        c->kind == Completion::Kind::kRecvWithImm) {
      return c;
    }
  }
}

// Echoes `total` messages, then waits for the WRITE phase's end marker (a WRITE_WITH_IMM).
absl::Status Serve(RcEndpoint& ep, const RcOptions& options, size_t total) {
  for (size_t i = 0; i < total; ++i) {
    auto got = NextRecv(ep);
    if (!got.ok()) return got.status();
    if (auto s = ep.PostRecv(got->wr_id * options.recv_size, options.recv_size, got->wr_id);
        !s.ok()) {
      return s;
    }
    if (auto s = ep.PostSend(SendArea(options), got->byte_len, i, i % kSignalEvery == 0);
        !s.ok()) {
      return s;
    }
  }
  auto end = NextRecv(ep);
  return end.ok() ? absl::OkStatus() : end.status();
}

double Percentile(std::vector<double>& sorted, double p) {
  size_t index = std::min(sorted.size() - 1, static_cast<size_t>(p * sorted.size()));
  return sorted[index];
}

absl::Status PingPong(RcEndpoint& ep, const RcOptions& options, const Config& config) {
  std::vector<double> rtt_us;
  rtt_us.reserve(config.iters);
  std::memset(ep.buffer() + SendArea(options), 0x5a, config.size);
  for (size_t i = 0; i < config.warmup + config.iters; ++i) {
    Clock::time_point start = Clock::now();
    if (auto s = ep.PostSend(SendArea(options), config.size, i, i % kSignalEvery == 0); !s.ok()) {
      return s;
    }
    auto got = NextRecv(ep);
    if (!got.ok()) return got.status();
    double us = std::chrono::duration<double, std::micro>(Clock::now() - start).count();
    if (auto s = ep.PostRecv(got->wr_id * options.recv_size, options.recv_size, got->wr_id);
        !s.ok()) {
      return s;
    }
    if (i >= config.warmup) rtt_us.push_back(us);
  }
  std::sort(rtt_us.begin(), rtt_us.end());
  std::printf("zrpc raw verbs: SEND/RECV ping-pong, %zu B, %zu iterations (+%zu warm-up)\n",
              config.size, config.iters, config.warmup);
  std::printf("  round trip us: p50 %.2f  p90 %.2f  p99 %.2f  p99.9 %.2f  max %.2f\n",
              Percentile(rtt_us, 0.5), Percentile(rtt_us, 0.9), Percentile(rtt_us, 0.99),
              Percentile(rtt_us, 0.999), rtt_us.back());
  std::printf("  one-way us (p50 / 2, as perftest's t_typical): %.2f\n",
              Percentile(rtt_us, 0.5) / 2);
  return absl::OkStatus();
}

absl::Status WriteThroughput(RcEndpoint& ep, const RcOptions& options, const Config& config) {
  size_t base = SendArea(options) + config.size;  // local source and remote target region
  size_t writes = (config.write_total + config.write_size - 1) / config.write_size;
  size_t posted = 0, completed = 0;
  Clock::time_point start = Clock::now();
  while (completed < writes) {
    while (posted < writes && posted - completed < config.window) {
      size_t slot = posted % config.window;
      if (auto s = ep.PostWrite(base + slot * config.write_size, config.write_size,
                                base + slot * config.write_size, posted, /*signaled=*/true,
                                /*with_imm=*/false, 0);
          !s.ok()) {
        return s;
      }
      ++posted;
    }
    auto c = ep.Poll(kTimeout);
    if (!c.ok()) return c.status();
    if (c->kind == Completion::Kind::kWrite) ++completed;
  }
  double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  double bytes = static_cast<double>(writes * config.write_size);
  std::printf("zrpc raw verbs: RDMA WRITE, %zu B writes, window %zu, %.1f MiB\n",
              config.write_size, config.window, bytes / (1 << 20));
  // MiB/s, the unit perftest's "MB/sec" column uses.
  std::printf("  throughput MiB/s: %.2f  (%.3f s, %.0f writes/s)\n",
              bytes / seconds / (1 << 20), seconds, writes / seconds);
  // Tell the server the run is over.
  return ep.PostWrite(base, 0, base, writes, /*signaled=*/false, /*with_imm=*/true, 0);
}

int Run(const Config& config) {
  auto device = zrpc::transport::DeviceConfigFromEnv();
  if (!device.ok()) {
    std::fprintf(stderr, "verbs_pingpong: %s\n", device.status().ToString().c_str());
    return 2;
  }
  RcOptions options = Options(config);
  auto listener = RcListener::Create(device->addr, 0);
  if (!listener.ok()) {
    std::fprintf(stderr, "verbs_pingpong: %s\n", listener.status().ToString().c_str());
    return 1;
  }
  absl::Status server_status;
  std::unique_ptr<RcEndpoint> server_keep;
  std::thread server([&] {
    auto ep = (*listener)->Accept(options, kTimeout);
    if (!ep.ok()) {
      server_status = ep.status();
      return;
    }
    server_status = Serve(**ep, options, config.warmup + config.iters);
    server_keep = std::move(*ep);  // disconnect only after the client is done
  });
  auto client = RcEndpoint::Connect(device->addr, (*listener)->port(), options, kTimeout);
  absl::Status status = client.status();
  if (client.ok()) {
    std::printf("device %s port %d gid %s, max inline %u\n", (*client)->DeviceName().c_str(),
                (*client)->PortNum(), (*client)->GidText().c_str(), (*client)->max_inline());
    status = PingPong(**client, options, config);
    if (status.ok()) status = WriteThroughput(**client, options, config);
  }
  server.join();
  if (status.ok()) status = server_status;
  if (!status.ok()) {
    std::fprintf(stderr, "verbs_pingpong: %s\n", status.ToString().c_str());
    return 1;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Config config;
  if (!ParseFlags(argc, argv, &config)) return 2;
  return Run(config);
}
