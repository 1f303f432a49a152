// The other process of the cross-process runtime tests (cross_process_test.cc).
//
//   rpc_peer server PORT [report]   serves Greeter on PORT (0: any); prints "listening PORT";
//                                   with "report", also "open N" each time the number of open
//                                   connections (handshakes too) changes, looked at every 10 ms,
//                                   "peak N" as the most open at once (ServerStats) grows,
//                                   "closed N" as the count of connections closed grows,
//                                   and "log COMPONENT: MESSAGE" for each line zrpc logs (on
//                                   standard error as well)
//   rpc_peer client ADDR:PORT N     keeps N SayHello("sleep:300") calls in flight forever;
//                                   prints "calling" once the first call is in flight
//   rpc_peer mixed PORT             serves Greeter, ObjectStore (Transform: the payload reversed)
//                                   and Numbers (Double) on PORT, reporting (see above) and
//                                   saying "pinned KB" each time its registered memory changes
//   rpc_peer store PORT             serves ObjectStore on PORT: Get("<size>") answers <size>
//                                   bytes (pulled by the client past its arena); prints
//                                   "listening PORT"
//   rpc_peer putter ADDR:PORT SIZE  Puts SIZE-byte payloads (pulled by the server past its
//                                   arena) one after another forever; prints "putting" first
//   rpc_peer streamer ADDR:PORT     opens a Numbers.Double stream and a Numbers.Count stream
//                                   (proto/examples/numbers.proto), reads and writes a few
//                                   messages on each, prints "streaming", then holds both open
//
// Both run until killed; that is the point.
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "proto/examples/greeter.zrpc.h"
#include "proto/examples/numbers.zrpc.h"
#include "proto/examples/object_store.zrpc.h"
#include "rpc/channel.h"
#include "rpc/server.h"
#include "rpc/streaming.h"
#include "tests/pinned_memory.h"
#include "tests/rpc/sleepy_greeter.h"
#include "transport/log.h"

namespace {

using zrpc::examples::Greeter;
using zrpc::examples::HelloReply;
using zrpc::examples::HelloRequest;

// Answers Get("<size>") with that many bytes of one static buffer (no copy per call).
class BigStore : public zrpc::examples::ObjectStore::Service {
 public:
  absl::Status Get(zrpc::ServerContext&, const zrpc::examples::ObjectKey& key,
                   zrpc::examples::ObjectInfo* info, zrpc::OutgoingBulk* bulk) override {
    static const std::string* bytes = new std::string(size_t{256} << 20, 'b');
    uint64_t size = 0;
    if (!absl::SimpleAtoi(key.name(), &size) || size > bytes->size()) {
      return absl::InvalidArgumentError("size");
    }
    info->set_size(size);
    *bulk = zrpc::OutgoingBulk(bytes->data(), size);
    return absl::OkStatus();
  }
};

// Transform answers the payload reversed; the rest of the service is unimplemented.
class ReversingStore : public zrpc::examples::ObjectStore::Service {
 public:
  absl::Status Transform(zrpc::ServerContext&, const zrpc::examples::ObjectKey&,
                         zrpc::IncomingBulk bulk, zrpc::examples::ObjectInfo* info,
                         zrpc::OutgoingBulk* out) override {
    std::string reversed(bulk.view().rbegin(), bulk.view().rend());
    info->set_size(reversed.size());
    *out = zrpc::OutgoingBulk::Copy(std::move(reversed));
    return absl::OkStatus();
  }
};

// Double answers each number twice its value, as it comes.
class Doubler : public zrpc::examples::Numbers::Service {
 public:
  absl::Status Double(
      zrpc::ServerContext&,
      zrpc::ServerReaderWriter<zrpc::examples::Number, zrpc::examples::Number>* stream) override {
    zrpc::examples::Number number;
    while (stream->Read(&number)) {
      number.set_value(number.value() * 2);
      if (!stream->Write(number)) return absl::CancelledError("write failed");
    }
    return absl::OkStatus();
  }
};

int Serve(std::vector<zrpc::Service*> services, uint16_t port, bool report = false,
          bool pinned = false) {
  zrpc::ServerOptions options;
  options.port = port;
  options.handler_threads = 16;
  auto server = zrpc::Server::Create(options);
  if (!server.ok()) {
    std::fprintf(stderr, "rpc_peer: %s\n", server.status().ToString().c_str());
    return 1;
  }
  for (zrpc::Service* service : services) {
    if (absl::Status s = (*server)->AddService(service); !s.ok()) return 1;
  }
  if (absl::Status s = (*server)->Start(); !s.ok()) {
    std::fprintf(stderr, "rpc_peer: %s\n", s.ToString().c_str());
    return 1;
  }
  std::printf("listening %u\n", (*server)->port());
  std::fflush(stdout);
  if (!report) {
    for (;;) absl::SleepFor(absl::Hours(1));
  }
  // Each record on standard output too, whole lines under one lock, so that whoever reads it
  // learns when this side gave a connection up.
  static absl::Mutex* out_mu = new absl::Mutex;
  zrpc::SetLogSink([](const zrpc::LogRecord& r) {
    std::fprintf(stderr, "zrpc %s %.*s: %.*s\n", std::string(zrpc::LogLevelName(r.level)).c_str(),
                 static_cast<int>(r.component.size()), r.component.data(),
                 static_cast<int>(r.message.size()), r.message.data());
    absl::MutexLock lock(out_mu);
    std::printf("log %.*s: %.*s\n", static_cast<int>(r.component.size()), r.component.data(),
                static_cast<int>(r.message.size()), r.message.data());
    std::fflush(stdout);
  });
  int64_t pinned_kb = -1;
  uint64_t peak = 0, closed = 0;
  for (uint64_t open = 0;; absl::SleepFor(absl::Milliseconds(10))) {
    const zrpc::ServerStats stats = (*server)->stats();
    const uint64_t now_open = stats.connections_open;
    const int64_t now_pinned = pinned ? zrpc::testing::PinnedKb() : -1;
    absl::MutexLock lock(out_mu);
    if (now_open != open) {
      open = now_open;
      std::printf("open %llu\n", static_cast<unsigned long long>(open));
    }
    if (stats.connections_closed != closed) {
      closed = stats.connections_closed;
      std::printf("closed %llu\n", static_cast<unsigned long long>(closed));
    }
    if (stats.connections_peak != peak) {
      peak = stats.connections_peak;
      std::printf("peak %llu\n", static_cast<unsigned long long>(peak));
    }
    if (now_pinned != pinned_kb) {
      pinned_kb = now_pinned;
      std::printf("pinned %lld\n", static_cast<long long>(pinned_kb));
    }
    std::fflush(stdout);
  }
}

int Putter(const std::string& target, size_t size) {
  auto channel = zrpc::CreateChannel(target, zrpc::ChannelOptions{});
  if (!channel.ok()) {
    std::fprintf(stderr, "rpc_peer: %s\n", channel.status().ToString().c_str());
    return 1;
  }
  zrpc::examples::ObjectStore::Stub stub(channel->get());
  const std::string bytes(size, 'p');
  zrpc::examples::ObjectKey key;
  key.set_name("put");
  std::printf("putting\n");
  std::fflush(stdout);
  for (;;) {
    zrpc::examples::PutReply reply;
    static_cast<void>(stub.Put(key, zrpc::OutgoingBulk(bytes.data(), bytes.size()), &reply,
                               zrpc::CallOptions::Timeout(absl::Seconds(60))));
  }
}

int Streamer(const std::string& target) {
  auto channel = zrpc::CreateChannel(target, zrpc::ChannelOptions{});
  if (!channel.ok()) {
    std::fprintf(stderr, "rpc_peer: %s\n", channel.status().ToString().c_str());
    return 1;
  }
  zrpc::examples::Numbers::Stub stub(channel->get());
  zrpc::ClientReaderWriter<zrpc::examples::Number, zrpc::examples::Number> both =
      stub.Double(zrpc::CallOptions());
  zrpc::examples::Number number;
  for (int i = 1; i <= 3; ++i) {
    number.set_value(i);
    if (!both.Write(number) || !both.Read(&number)) return 1;
  }
  zrpc::examples::CountRequest request;
  request.set_count(1'000'000);
  zrpc::ClientReader<zrpc::examples::Number> reader = stub.Count(request, zrpc::CallOptions());
  for (int i = 0; i < 3; ++i) {
    if (!reader.Read(&number)) return 1;
  }
  // The server's Double handler waits in Read, its Count handler in Write (a full window).
  std::printf("streaming\n");
  std::fflush(stdout);
  for (;;) absl::SleepFor(absl::Hours(1));
}

int Client(const std::string& target, int in_flight) {
  auto channel = zrpc::CreateChannel(target, zrpc::ChannelOptions{});
  if (!channel.ok()) {
    std::fprintf(stderr, "rpc_peer: %s\n", channel.status().ToString().c_str());
    return 1;
  }
  Greeter::Stub stub(channel->get());
  struct Window {
    absl::Mutex mu;
    int outstanding = 0;
    int limit = 0;
  } window;
  window.limit = in_flight;
  HelloRequest request;
  request.set_name("sleep:300");
  for (bool announced = false;;) {
    {
      absl::MutexLock lock(&window.mu);
      if (!announced && window.outstanding == window.limit) {
        std::printf("calling\n");
        std::fflush(stdout);
        announced = true;
      }
      window.mu.Await(absl::Condition(
          +[](Window* w) ABSL_NO_THREAD_SAFETY_ANALYSIS { return w->outstanding < w->limit; },
          &window));
      ++window.outstanding;
    }
    auto* reply = new HelloReply;
    stub.AsyncSayHello(request, reply, zrpc::CallOptions::Timeout(absl::Seconds(60)),
                       [&window, reply](absl::Status) {
                         delete reply;
                         absl::MutexLock lock(&window.mu);
                         --window.outstanding;
                       });
  }
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  uint32_t number = 0;
  if (mode == "server" && (argc == 3 || (argc == 4 && std::string(argv[3]) == "report")) &&
      absl::SimpleAtoi(argv[2], &number) && number < 65536) {
    zrpc::testing::SleepyGreeter greeter;
    return Serve({&greeter}, static_cast<uint16_t>(number), /*report=*/argc == 4);
  }
  if (mode == "client" && argc == 4 && absl::SimpleAtoi(argv[3], &number) && number > 0) {
    return Client(argv[2], static_cast<int>(number));
  }
  if (mode == "store" && argc == 3 && absl::SimpleAtoi(argv[2], &number) && number < 65536) {
    BigStore store;
    return Serve({&store}, static_cast<uint16_t>(number));
  }
  if (mode == "mixed" && argc == 3 && absl::SimpleAtoi(argv[2], &number) && number < 65536) {
    zrpc::testing::SleepyGreeter greeter;
    ReversingStore store;
    Doubler doubler;
    return Serve({&greeter, &store, &doubler}, static_cast<uint16_t>(number), /*report=*/true,
                 /*pinned=*/true);
  }
  if (mode == "putter" && argc == 4 && absl::SimpleAtoi(argv[3], &number) && number > 0) {
    return Putter(argv[2], number);
  }
  if (mode == "streamer" && argc == 3) return Streamer(argv[2]);
  std::fprintf(stderr,
               "usage: rpc_peer server PORT [report] | rpc_peer client ADDR:PORT IN_FLIGHT | "
               "rpc_peer mixed PORT | rpc_peer store PORT | rpc_peer putter ADDR:PORT SIZE | "
               "rpc_peer streamer ADDR:PORT\n");
  return 2;
}
