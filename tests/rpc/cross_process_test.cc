// The runtime across processes (tag "rdma"; tools/test runs it inside tools/softroce): a server
// process killed mid-load and restarted under the same channel, and a client process killed with
// calls in flight. The other process is rpc_peer.
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "proto/examples/greeter.zrpc.h"
#include "proto/examples/numbers.zrpc.h"
#include "proto/examples/object_store.zrpc.h"
#include "rpc/channel.h"
#include "rpc/server.h"
#include "rpc/streaming.h"
#include "tests/eventually.h"
#include "tests/rdma_device.h"
#include "tests/read_line.h"
#include "tests/rpc/sleepy_greeter.h"

extern char** environ;

namespace {

using zrpc::examples::Greeter;
using zrpc::examples::HelloReply;
using zrpc::examples::HelloRequest;

// rpc_peer in a child process, its stdout on a pipe.
class Peer {
 public:
  explicit Peer(std::vector<std::string> args) {
    std::string path = absl::StrCat(std::getenv("TEST_SRCDIR"), "/", std::getenv("TEST_WORKSPACE"),
                                    "/tests/rpc/rpc_peer");
    args.insert(args.begin(), path);
    std::vector<char*> argv;
    for (std::string& arg : args) argv.push_back(arg.data());
    argv.push_back(nullptr);
    int fds[2];
    REQUIRE(pipe(fds) == 0);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, fds[1], STDOUT_FILENO);
    posix_spawn_file_actions_addclose(&actions, fds[0]);
    REQUIRE(posix_spawn(&pid_, path.c_str(), &actions, nullptr, argv.data(), environ) == 0);
    posix_spawn_file_actions_destroy(&actions);
    close(fds[1]);
    out_ = fds[0];
  }
  ~Peer() {
    Kill();
    close(out_);
  }

  // The next line the peer prints, or "" after `timeout`.
  std::string ReadLine(absl::Duration timeout) { return zrpc::testing::ReadLine(out_, timeout); }

  void Kill() {
    if (pid_ <= 0) return;
    kill(pid_, SIGKILL);
    int status = 0;
    waitpid(pid_, &status, 0);
    pid_ = 0;
  }

 private:
  pid_t pid_ = 0;
  int out_ = -1;
};

uint16_t ListeningPort(Peer& server) {
  const std::string line = server.ReadLine(absl::Seconds(60));
  INFO("rpc_peer said: \"" << line << "\"");
  int port = 0;
  REQUIRE(std::sscanf(line.c_str(), "listening %d", &port) == 1);
  return static_cast<uint16_t>(port);
}

struct CallRecord {
  absl::Time start;
  absl::Time end;
  absl::Status status;
};

TEST_CASE(
    "a server process killed mid-load: every call ends UNAVAILABLE within 1 s, none "
    "hangs; restarted, the same channel reconnects and succeeds") {
  ZRPC_REQUIRE_RDMA_DEVICE(config);
  auto server = std::make_unique<Peer>(std::vector<std::string>{"server", "0"});
  const uint16_t port = ListeningPort(*server);
  zrpc::ChannelOptions options;
  options.device = config;
  options.connections = 2;
  options.reconnect_backoff_initial = absl::Milliseconds(20);
  options.reconnect_backoff_max = absl::Milliseconds(250);
  auto channel = zrpc::CreateChannel(absl::StrCat(config.addr, ":", port), options);
  REQUIRE(channel.ok());
  Greeter::Stub stub(channel->get());

  absl::Mutex mu;
  std::vector<CallRecord> records;
  std::atomic<bool> stop{false};
  std::atomic<int> ok{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      HelloRequest request;
      request.set_name("sleep:20");
      HelloReply reply;
      while (!stop.load()) {
        CallRecord record;
        record.start = absl::Now();
        record.status =
            stub.SayHello(request, &reply, zrpc::CallOptions::Timeout(absl::Seconds(60)));
        record.end = absl::Now();
        if (record.status.ok()) ok.fetch_add(1);
        absl::MutexLock lock(&mu);
        records.push_back(record);
      }
    });
  }
  absl::Time until = absl::Now() + absl::Seconds(60);
  while (ok.load() < 100 && absl::Now() < until) absl::SleepFor(absl::Milliseconds(5));
  REQUIRE(ok.load() >= 100);
  const absl::Time killed = absl::Now();
  server->Kill();
  absl::SleepFor(absl::Milliseconds(100));  // a few calls after the kill, failing fast
  stop.store(true);
  for (std::thread& thread : threads) thread.join();

  int failed = 0;
  absl::Duration slowest = absl::ZeroDuration();
  for (const CallRecord& r : records) {
    if (r.status.ok()) continue;
    ++failed;
    INFO(r.status);
    CHECK(r.status.code() == absl::StatusCode::kUnavailable);
    slowest = std::max(slowest, r.end - std::max(r.start, killed));
  }
  std::printf("server killed: %d calls failed, the slowest %s after the kill or its start\n",
              failed, absl::FormatDuration(slowest).c_str());
  CHECK(failed >= 4);  // at least the calls in flight at the kill
  CHECK(slowest < absl::Seconds(1));

  server = std::make_unique<Peer>(std::vector<std::string>{"server", std::to_string(port)});
  REQUIRE(ListeningPort(*server) == port);
  HelloRequest request;
  request.set_name("again");
  HelloReply reply;
  absl::Status s;
  until = absl::Now() + absl::Seconds(20);
  do {
    s = stub.SayHello(request, &reply, zrpc::CallOptions::Timeout(absl::Seconds(5)));
    if (!s.ok()) absl::SleepFor(absl::Milliseconds(10));
  } while (!s.ok() && absl::Now() < until);
  INFO(s);
  REQUIRE(s.ok());
  CHECK(reply.message() == "Hello, again");
  CHECK((*channel)->stats().connections_lost >= 1);
}

TEST_CASE(
    "a client process killed with calls in flight: the server frees them and serves "
    "another client") {
  ZRPC_REQUIRE_RDMA_DEVICE(config);
  zrpc::testing::SleepyGreeter greeter;
  zrpc::ServerOptions options;
  options.device = config;
  options.handler_threads = 16;
  auto server = zrpc::Server::Create(options);
  REQUIRE(server.ok());
  REQUIRE((*server)->AddService(&greeter).ok());
  REQUIRE((*server)->Start().ok());

  constexpr int kInFlight = 8;
  Peer client(
      {"client", absl::StrCat(config.addr, ":", (*server)->port()), std::to_string(kInFlight)});
  REQUIRE(client.ReadLine(absl::Seconds(60)) == "calling");
  absl::Time until = absl::Now() + absl::Seconds(30);
  while ((*server)->stats().calls_in_flight < kInFlight && absl::Now() < until) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  REQUIRE((*server)->stats().calls_in_flight == kInFlight);
  client.Kill();

  // The kernel disconnects for the dead process; the server cancels its calls (the handlers
  // stop sleeping), finishes them into the void and lets the connection go.
  until = absl::Now() + absl::Seconds(10);
  while (((*server)->stats().calls_in_flight > 0 || (*server)->stats().connections_open > 0) &&
         absl::Now() < until) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  CHECK((*server)->stats().calls_in_flight == 0);
  CHECK((*server)->stats().connections_open == 0);
  CHECK((*server)->stats().connections_closed == 1);
  CHECK(greeter.cancelled.load() >= 1);

  zrpc::ChannelOptions channel_options;
  channel_options.device = config;
  auto channel =
      zrpc::CreateChannel(absl::StrCat(config.addr, ":", (*server)->port()), channel_options);
  REQUIRE(channel.ok());
  Greeter::Stub stub(channel->get());
  HelloRequest request;
  request.set_name("next");
  HelloReply reply;
  REQUIRE(stub.SayHello(request, &reply, zrpc::CallOptions::Timeout(absl::Seconds(30))).ok());
  CHECK(reply.message() == "Hello, next");
}

// Serves Numbers' Double and Count (numbers.proto), counting handlers that end and why.
class EndingNumbers : public zrpc::examples::Numbers::Service {
 public:
  absl::Status Count(zrpc::ServerContext& context, const zrpc::examples::CountRequest& request,
                     zrpc::ServerWriter<zrpc::examples::Number>* writer) override {
    zrpc::examples::Number number;
    for (uint64_t i = 0; i < request.count(); ++i) {
      number.set_value(i);
      if (!writer->Write(number)) break;
    }
    ended.fetch_add(1);
    if (context.IsCancelled()) cancelled.fetch_add(1);
    return absl::CancelledError("the client went away");
  }
  absl::Status Double(
      zrpc::ServerContext& context,
      zrpc::ServerReaderWriter<zrpc::examples::Number, zrpc::examples::Number>* stream) override {
    zrpc::examples::Number number;
    while (stream->Read(&number)) {
      number.set_value(2 * number.value());
      if (!stream->Write(number)) break;
    }
    ended.fetch_add(1);
    if (context.IsCancelled()) cancelled.fetch_add(1);
    return absl::OkStatus();
  }
  std::atomic<int> ended{0};
  std::atomic<int> cancelled{0};
};

TEST_CASE(
    "a client process killed mid-stream: both of its streams end on the server, which "
    "frees them and serves another client") {
  ZRPC_REQUIRE_RDMA_DEVICE(config);
  EndingNumbers numbers;
  zrpc::ServerOptions options;
  options.device = config;
  auto server = zrpc::Server::Create(options);
  REQUIRE(server.ok());
  REQUIRE((*server)->AddService(&numbers).ok());
  REQUIRE((*server)->Start().ok());

  Peer client({"streamer", absl::StrCat(config.addr, ":", (*server)->port())});
  REQUIRE(client.ReadLine(absl::Seconds(60)) == "streaming");
  CHECK((*server)->stats().streams_open == 2);
  client.Kill();

  // The kernel disconnects for the dead process: the blocked Read and Write end, the handlers
  // return, their threads and calls go.
  CHECK(zrpc::testing::Eventually([&] { return numbers.ended.load() == 2; }));
  CHECK(numbers.cancelled.load() == 2);
  CHECK(zrpc::testing::Eventually([&] {
    const zrpc::ServerStats stats = (*server)->stats();
    return stats.streams_open == 0 && stats.calls_in_flight == 0 && stats.connections_open == 0;
  }));

  zrpc::ChannelOptions channel_options;
  channel_options.device = config;
  auto channel =
      zrpc::CreateChannel(absl::StrCat(config.addr, ":", (*server)->port()), channel_options);
  REQUIRE(channel.ok());
  zrpc::examples::Numbers::Stub stub(channel->get());
  zrpc::examples::CountRequest request;
  request.set_count(5);
  zrpc::ClientReader<zrpc::examples::Number> reader =
      stub.Count(request, zrpc::CallOptions::Timeout(absl::Seconds(30)));
  zrpc::examples::Number number;
  int read = 0;
  while (reader.Read(&number)) ++read;
  CHECK(read == 5);
  // The handler above answers CANCELLED even when it wrote everything: that is its status.
  CHECK(reader.Finish().code() == absl::StatusCode::kCancelled);
}

// Takes Puts and lets the payload go at once.
class SinkStore : public zrpc::examples::ObjectStore::Service {
 public:
  absl::Status Put(zrpc::ServerContext&, const zrpc::examples::ObjectKey&, zrpc::IncomingBulk bulk,
                   zrpc::examples::PutReply* reply) override {
    reply->set_stored_bytes(bulk.size());
    return absl::OkStatus();
  }
};

using zrpc::testing::Eventually;

TEST_CASE(
    "a client process killed while the server pulls its payload: the server frees the "
    "pulled memory and serves another client") {
  ZRPC_REQUIRE_RDMA_DEVICE(config);
  SinkStore store;
  zrpc::ServerOptions options;
  options.device = config;
  auto server = zrpc::Server::Create(options);
  REQUIRE(server.ok());
  REQUIRE((*server)->AddService(&store).ok());
  REQUIRE((*server)->Start().ok());
  const std::string target = absl::StrCat(config.addr, ":", (*server)->port());
  Peer putter({"putter", target, std::to_string(64 << 20)});
  REQUIRE(putter.ReadLine(absl::Seconds(60)) == "putting");
  REQUIRE(Eventually([&] { return (*server)->stats().pulled_bytes_held > 0; }, absl::Seconds(60)));
  putter.Kill();  // mid-READ, most likely: a 64 MiB pull takes a while here
  CHECK(Eventually(
      [&] {
        const zrpc::ServerStats s = (*server)->stats();
        return s.pulled_bytes_held == 0 && s.connections_open == 0;
      },
      absl::Seconds(10)));
  CHECK((*server)->stats().pulled_bytes_held == 0);

  zrpc::ChannelOptions channel_options;
  channel_options.device = config;
  auto channel = zrpc::CreateChannel(target, channel_options);
  REQUIRE(channel.ok());
  zrpc::examples::ObjectStore::Stub stub(channel->get());
  const std::string bytes(1 << 20, 'n');
  zrpc::examples::ObjectKey key;
  key.set_name("next");
  zrpc::examples::PutReply reply;
  absl::Status s = stub.Put(key, zrpc::OutgoingBulk(bytes.data(), bytes.size()), &reply,
                            zrpc::CallOptions::Timeout(absl::Seconds(30)));
  INFO(s);
  CHECK(s.ok());
  CHECK(reply.stored_bytes() == bytes.size());
}

TEST_CASE(
    "a server process killed while the client pulls its answer: the call fails at once and "
    "the client frees the pulled memory") {
  ZRPC_REQUIRE_RDMA_DEVICE(config);
  Peer server({"store", "0"});
  const uint16_t port = ListeningPort(server);
  zrpc::ChannelOptions channel_options;
  channel_options.device = config;
  auto channel = zrpc::CreateChannel(absl::StrCat(config.addr, ":", port), channel_options);
  REQUIRE(channel.ok());
  zrpc::examples::ObjectStore::Stub stub(channel->get());
  zrpc::examples::ObjectKey key;
  key.set_name(std::to_string(128 << 20));
  zrpc::examples::ObjectInfo info;
  zrpc::IncomingBulk got;
  absl::Notification done;
  absl::Status status;
  stub.AsyncGet(key, &info, &got, zrpc::CallOptions::Timeout(absl::Seconds(120)),
                [&](absl::Status s) {
                  status = std::move(s);
                  done.Notify();
                });
  REQUIRE(Eventually([&] { return (*channel)->stats().pulled_bytes_held > 0; }, absl::Seconds(60)));
  const absl::Time killed = absl::Now();
  server.Kill();
  REQUIRE(done.WaitForNotificationWithTimeout(absl::Seconds(30)));
  INFO(status);
  if (status.ok()) {
    WARN("the 128 MiB answer landed before the kill; nothing was cut short");
  } else {
    CHECK(status.code() == absl::StatusCode::kUnavailable);
    CHECK(absl::Now() - killed < absl::Seconds(5));
  }
  got.Reset();
  CHECK((*channel)->stats().pulled_bytes_held == 0);
}

}  // namespace
