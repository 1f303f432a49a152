// What the runtime's end-to-end tests share: a Greeter and an ObjectStore that tests steer
// through their requests, a server and channel pair over the harness's device (Runtime), and a
// transport-level peer that speaks no RPC at all (Quiet).
#ifndef ZRPC_TESTS_RPC_RUNTIME_FIXTURE_H_
#define ZRPC_TESTS_RPC_RUNTIME_FIXTURE_H_

#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <deque>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "proto/examples/greeter.zrpc.h"
#include "proto/examples/object_store.zrpc.h"
#include "rpc/channel.h"
#include "rpc/server.h"
#include "tests/pattern.h"
#include "transport/connection.h"
#include "transport/device.h"
#include "transport/device_config.h"
#include "transport/poller.h"
#include "transport/process_limits.h"

namespace zrpc::testing {

using ::zrpc::CallOptions;
using ::zrpc::examples::Greeter;
using ::zrpc::examples::HelloReply;
using ::zrpc::examples::HelloRequest;
using ::zrpc::examples::ObjectInfo;
using ::zrpc::examples::ObjectKey;
using ::zrpc::examples::ObjectStore;
using ::zrpc::examples::PutReply;

inline constexpr absl::Duration kLong = absl::Seconds(30);

class TestGreeter : public Greeter::Service {
 public:
  absl::Status SayHello(zrpc::ServerContext& context, const HelloRequest& request,
                        HelloReply* reply) override {
    hellos.fetch_add(1);
    {
      absl::MutexLock lock(&mu_);
      last_deadline_ = context.deadline();
      say_hello_threads_.insert(std::this_thread::get_id());
    }
    const std::string& name = request.name();
    if (name == "error") {
      return absl::PermissionDeniedError("no hello for you, \xc3\xa9l\xc3\xa8ve \xe2\x9c\x93");
    }
    if (absl::StartsWith(name, "sleep:")) {
      int ms = std::stoi(name.substr(6));
      // On the steady clock, so that a test stepping the wall clock does not cut it short.
      const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
      // In slices of up to 20 ms: dozens of handlers waking every 2 ms starved the poller of
      // a 2-vCPU emulated guest under ASan, so a 200 ms keepalive ping went unanswered
      // (load_test's blocking-handlers case failed once that way).
      for (auto now = std::chrono::steady_clock::now(); now < until;
           now = std::chrono::steady_clock::now()) {
        absl::SleepFor(absl::FromChrono(std::min<std::chrono::steady_clock::duration>(
            until - now, std::chrono::milliseconds(20))));
      }
      if (context.IsCancelled()) saw_cancelled_.fetch_add(1);
    }
    reply->set_message("Hello, " + name);
    return absl::OkStatus();
  }

  absl::Status Ping(zrpc::ServerContext&, const google::protobuf::Empty&,
                    google::protobuf::Empty*) override {
    absl::MutexLock lock(&mu_);
    ping_threads_.insert(std::this_thread::get_id());
    return absl::OkStatus();
  }

  absl::Time last_deadline() {
    absl::MutexLock lock(&mu_);
    return last_deadline_;
  }
  std::set<std::thread::id> ping_threads() {
    absl::MutexLock lock(&mu_);
    return ping_threads_;
  }
  std::set<std::thread::id> say_hello_threads() {
    absl::MutexLock lock(&mu_);
    return say_hello_threads_;
  }
  std::atomic<int> saw_cancelled_{0};
  std::atomic<int> hellos{0};  // SayHello handlers run

 private:
  absl::Mutex mu_;
  absl::Time last_deadline_;
  std::set<std::thread::id> ping_threads_;
  std::set<std::thread::id> say_hello_threads_;
};

// Keeps objects; Transform reverses the payload.
class TestStore : public ObjectStore::Service {
 public:
  absl::Status Put(zrpc::ServerContext&, const ObjectKey& key, zrpc::IncomingBulk bulk,
                   PutReply* reply) override {
    absl::MutexLock lock(&mu_);
    objects_[key.name()] = std::string(bulk.view());
    reply->set_stored_bytes(bulk.size());
    return absl::OkStatus();
  }
  absl::Status Get(zrpc::ServerContext&, const ObjectKey& key, ObjectInfo* info,
                   zrpc::OutgoingBulk* bulk) override {
    absl::MutexLock lock(&mu_);
    auto it = objects_.find(key.name());
    if (it == objects_.end()) return absl::NotFoundError(key.name());
    info->set_size(it->second.size());
    *bulk = zrpc::OutgoingBulk::Copy(it->second);
    return absl::OkStatus();
  }
  absl::Status Transform(zrpc::ServerContext&, const ObjectKey&, zrpc::IncomingBulk bulk,
                         ObjectInfo* info, zrpc::OutgoingBulk* out) override {
    std::string reversed(bulk.view().rbegin(), bulk.view().rend());
    info->set_size(reversed.size());
    *out = zrpc::OutgoingBulk::Copy(std::move(reversed));
    return absl::OkStatus();
  }
  absl::Status Stat(zrpc::ServerContext&, const ObjectKey& key, ObjectInfo* info) override {
    absl::MutexLock lock(&mu_);
    auto it = objects_.find(key.name());
    if (it == objects_.end()) return absl::NotFoundError(key.name());
    info->set_size(it->second.size());
    return absl::OkStatus();
  }

 private:
  absl::Mutex mu_;
  std::map<std::string, std::string> objects_;
};

inline ObjectKey Key(const std::string& name) {
  ObjectKey key;
  key.set_name(name);
  return key;
}

// Stores what it is sent by name; a name starting with "hold" keeps the payload itself,
// unreleased, so the server's arena (or its memory for pulled payloads) stays taken until Drop.
// Tests add the Get and Transform they need.
class KeepingStore : public ObjectStore::Service {
 public:
  absl::Status Put(zrpc::ServerContext&, const ObjectKey& key, zrpc::IncomingBulk bulk,
                   PutReply* reply) override {
    puts.fetch_add(1);
    reply->set_stored_bytes(bulk.size());
    absl::MutexLock lock(&mu_);
    if (absl::StartsWith(key.name(), "hold")) {
      held_.push_back(std::move(bulk));
    } else {
      objects_[key.name()] = std::string(bulk.view());
    }
    return absl::OkStatus();
  }
  std::string object(const std::string& name) {
    absl::MutexLock lock(&mu_);
    return objects_[name];
  }
  void Drop() {
    absl::MutexLock lock(&mu_);
    held_.clear();
  }
  std::atomic<int> puts{0};

 private:
  absl::Mutex mu_;
  std::map<std::string, std::string> objects_;
  std::vector<zrpc::IncomingBulk> held_;
};

// "host:port" of a server on `device`'s address (an IPv6 one in brackets).
// Whether RLIMIT_MEMLOCK leaves room for a side's default queues and pools uncut (256 MiB or
// unlimited): where figures that a tight limit cuts (process_limits_test) can be checked exactly.
inline bool RoomyLockedMemory() {
  const transport::LockedMemory memory = transport::ReadLockedMemory();
  return memory.unlimited || memory.limit >= memory.locked + (uint64_t{256} << 20);
}

inline std::string TargetOf(const zrpc::transport::DeviceConfig& device, uint16_t port) {
  return absl::StrCat(
      device.addr.find(':') != std::string::npos ? "[" + device.addr + "]" : device.addr, ":",
      port);
}

struct Runtime {
  TestGreeter greeter;
  TestStore store;
  zrpc::transport::DeviceConfig config;
  std::unique_ptr<zrpc::Server> server;
  std::unique_ptr<zrpc::ClientChannel> channel;

  explicit Runtime(const zrpc::transport::DeviceConfig& device,
                   zrpc::ServerOptions server_options = {},
                   zrpc::ChannelOptions channel_options = {}, uint16_t port = 0)
      : config(device) {
    StartServer(server_options, port);
    channel_options.device = config;
    auto c = zrpc::CreateChannel(target(), channel_options);
    INFO(c.status());
    REQUIRE(c.ok());
    channel = std::move(*c);
  }

  void StartServer(zrpc::ServerOptions options, uint16_t port) {
    options.device = config;
    options.port = port;
    auto s = zrpc::Server::Create(options);
    INFO(s.status());
    REQUIRE(s.ok());
    server = std::move(*s);
    REQUIRE((*server).AddService(&greeter).ok());
    REQUIRE((*server).AddService(&store).ok());
    for (const std::string& method : inline_methods) REQUIRE(server->SetInline(method, true).ok());
    absl::Status started = server->Start();
    INFO(started);
    REQUIRE(started.ok());
    port_ = server->port();
  }

  std::string target() const { return TargetOf(config, port_); }

  std::vector<std::string> inline_methods;
  uint16_t port_ = 0;
};

inline CallOptions Within(absl::Duration timeout) { return CallOptions::Timeout(timeout); }

inline HelloRequest Named(const std::string& name) {
  HelloRequest request;
  request.set_name(name);
  return request;
}

// SayHello calls started together, asynchronously, one per name, each within `timeout`.
// Wait() waits up to `within` for all of them to end; the statuses and replies are in the
// order of the names. The calls' memory lives as long as the batch or its last callback.
class HelloBatch {
 public:
  HelloBatch(Greeter::Stub& stub, const std::vector<std::string>& names, absl::Duration timeout)
      : state_(std::make_shared<State>(names.size())) {
    for (size_t i = 0; i < names.size(); ++i) {
      state_->requests[i].set_name(names[i]);
      stub.AsyncSayHello(state_->requests[i], &state_->replies[i], CallOptions::Timeout(timeout),
                         [state = state_, i](absl::Status s) {
                           state->statuses[i] = std::move(s);
                           if (state->done.fetch_add(1) + 1 == state->statuses.size()) {
                             state->all_done.Notify();
                           }
                         });
    }
  }
  bool Wait(absl::Duration within) {
    return state_->all_done.WaitForNotificationWithTimeout(within);
  }
  const absl::Status& status(size_t i) const { return state_->statuses[i]; }
  const HelloReply& reply(size_t i) const { return state_->replies[i]; }
  size_t size() const { return state_->statuses.size(); }

 private:
  struct State {
    explicit State(size_t n) : requests(n), replies(n), statuses(n) {
      if (n == 0) all_done.Notify();
    }
    std::vector<HelloRequest> requests;
    std::vector<HelloReply> replies;
    std::vector<absl::Status> statuses;
    std::atomic<size_t> done{0};
    absl::Notification all_done;
  };
  std::shared_ptr<State> state_;
};

inline std::string Pattern(size_t size, uint32_t seed) {
  std::string bytes(size, '\0');
  zrpc::testing::Fill(reinterpret_cast<uint8_t*>(bytes.data()), size, seed);
  return bytes;
}

// A peer that speaks the transport but not the RPC protocol.
class Quiet : public zrpc::transport::ConnectionHandler {
 public:
  void OnMessage(zrpc::transport::Connection& c,
                 const zrpc::transport::ReceivedMessage& m) override {
    static_cast<void>(c.Release(m.handle));
  }
  void OnBulk(zrpc::transport::Connection& c, const zrpc::transport::ReceivedBulk& b) override {
    static_cast<void>(c.Release(b.handle));
  }
  void OnSendDone(zrpc::transport::Connection&, uint64_t, const absl::Status&) override {}
  void OnClosed(zrpc::transport::Connection&, const absl::Status&) override { closed.Notify(); }
  absl::Notification closed;
};

// Holds every call it gets until Release(), then answers them ("Hello, <name>", the client's
// metadata echoed as trailers) from the releasing thread and `threads - 1` more: an AsyncService
// whose calls wait on something slow (a long poll, a disk), or finish in a burst from threads of
// the service's own.
class HoldingGreeter : public Greeter::AsyncService {
 public:
  using Pending = PendingCall<HelloRequest, HelloReply>;
  ~HoldingGreeter() override { Release(); }

  void SayHello(std::unique_ptr<Pending> call) override {
    absl::MutexLock lock(&mu_);
    held_.push_back(std::move(call));
  }
  void Ping(std::unique_ptr<PendingCall<google::protobuf::Empty, google::protobuf::Empty>> call)
      override {
    call->Finish(absl::OkStatus());
  }
  size_t held() {
    absl::MutexLock lock(&mu_);
    return held_.size();
  }
  void Release(int threads = 1) {
    std::deque<std::unique_ptr<Pending>> calls;
    {
      absl::MutexLock lock(&mu_);
      calls.swap(held_);
    }
    absl::Mutex calls_mu;
    auto finish = [&] {
      for (;;) {
        std::unique_ptr<Pending> call;
        {
          absl::MutexLock lock(&calls_mu);
          if (calls.empty()) return;
          call = std::move(calls.front());
          calls.pop_front();
        }
        call->response()->set_message("Hello, " + call->request().name());
        // The client's metadata comes back as trailers, "echo-" + each key (metadata tests).
        for (const auto& entry : call->context().client_metadata().entries()) {
          static_cast<void>(call->context().AddTrailingMetadata("echo-" + entry.key, entry.value));
        }
        call->Finish(absl::OkStatus());
      }
    };
    std::vector<std::thread> helpers;
    for (int t = 1; t < threads; ++t) helpers.emplace_back(finish);
    finish();
    for (auto& helper : helpers) helper.join();
  }

 private:
  absl::Mutex mu_;
  std::deque<std::unique_ptr<Pending>> held_;
};

// A server serving `services` (started) and a channel to it, over the harness's device: for
// tests whose services are their own. `pool_methods` run on the handler pool (SetInline false).
struct Served {
  Served(const transport::DeviceConfig& device, std::vector<Service*> services,
         ServerOptions server_options = {}, ChannelOptions channel_options = {},
         const std::vector<std::string>& pool_methods = {}) {
    server_options.device = device;
    auto s = Server::Create(server_options);
    INFO(s.status());
    REQUIRE(s.ok());
    server = std::move(*s);
    for (Service* service : services) REQUIRE(server->AddService(service).ok());
    for (const std::string& method : pool_methods) REQUIRE(server->SetInline(method, false).ok());
    REQUIRE(server->Start().ok());
    channel_options.device = device;
    auto c = CreateChannel(TargetOf(device, server->port()), channel_options);
    INFO(c.status());
    REQUIRE(c.ok());
    channel = std::move(*c);
  }
  std::unique_ptr<Server> server;
  std::unique_ptr<ClientChannel> channel;
};

// A device and a running poller of the test's own, for peers that speak the transport only.
struct TransportPeer {
  explicit TransportPeer(const transport::DeviceConfig& config) {
    auto d = transport::Device::Open(config);
    REQUIRE(d.ok());
    device = std::move(*d);
    auto p = transport::Poller::Create(*device);
    REQUIRE(p.ok());
    poller = std::move(*p);
    REQUIRE(poller->Start().ok());
  }
  // Connects to `port` on the harness's address, with `handler`.
  absl::StatusOr<std::shared_ptr<transport::Connection>> Connect(
      const std::string& addr, uint16_t port, transport::ConnectionHandler* handler) {
    return transport::Connection::Connect(*device, *poller, addr, port, handler, {}, kLong);
  }
  std::unique_ptr<transport::Device> device;
  std::unique_ptr<transport::Poller> poller;
};

}  // namespace zrpc::testing

#endif  // ZRPC_TESTS_RPC_RUNTIME_FIXTURE_H_
