// The Numbers service (proto/examples/numbers.proto) as the streaming tests serve it, and a
// server and channel around it on a device.
#ifndef ZRPC_TESTS_RPC_NUMBERS_FIXTURE_H_
#define ZRPC_TESTS_RPC_NUMBERS_FIXTURE_H_

#include <atomic>
#include <catch2/catch.hpp>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "proto/examples/numbers.zrpc.h"
#include "rpc/channel.h"
#include "rpc/server.h"
#include "transport/device.h"

namespace zrpc_test {

using zrpc::examples::CountRequest;
using zrpc::examples::Number;
using zrpc::examples::Numbers;
using zrpc::examples::Total;

class TestNumbers : public Numbers::Service {
 public:
  absl::Status Count(zrpc::ServerContext& context, const CountRequest& request,
                     zrpc::ServerWriter<Number>* writer) override {
    Number number;
    number.set_pad(std::string(request.pad_bytes(), 'p'));
    for (uint64_t i = 0; i < request.count(); ++i) {
      if (request.fail_after() > 0 && i == static_cast<uint64_t>(request.fail_after())) {
        return absl::AbortedError(absl::StrCat("failed after ", i, " numbers"));
      }
      if (request.delay_us() > 0) absl::SleepFor(absl::Microseconds(request.delay_us()));
      number.set_value(request.start() + i);
      if (!writer->Write(number)) {
        stopped.fetch_add(1);
        return absl::CancelledError(context.IsCancelled() ? "gone" : "write failed");
      }
      written.fetch_add(1);
    }
    return absl::OkStatus();
  }

  absl::Status Sum(zrpc::ServerContext&, zrpc::ServerReader<Number>* reader,
                   Total* total) override {
    Number number;
    uint64_t expected = 1;
    while (reader->Read(&number)) {
      if (number.value() != expected++) return absl::DataLossError("out of order");
      total->set_sum(total->sum() + number.value());
      total->set_count(total->count() + 1);
    }
    return absl::OkStatus();
  }

  absl::Status Double(zrpc::ServerContext&,
                      zrpc::ServerReaderWriter<Number, Number>* stream) override {
    Number number;
    while (stream->Read(&number)) {
      number.set_value(number.value() * 2);
      if (!stream->Write(number)) return absl::CancelledError("write failed");
    }
    return absl::OkStatus();
  }

  absl::Status Square(zrpc::ServerContext&, const Number& request, Number* reply) override {
    if (square_gate != nullptr) square_gate->WaitForNotification();
    reply->set_value(request.value() * request.value());
    return absl::OkStatus();
  }

  std::atomic<uint64_t> written{0};
  std::atomic<int> stopped{0};
  // Set: Square waits for it (calls the server holds, with their receive credits).
  absl::Notification* square_gate = nullptr;
};

// Serves `service` on `config`'s device and opens a channel to it.
inline void ServeAndConnect(zrpc::Service* service, const zrpc::transport::DeviceConfig& config,
                            zrpc::ServerOptions options, zrpc::ChannelOptions channel_options,
                            std::unique_ptr<zrpc::Server>* server,
                            std::unique_ptr<zrpc::ClientChannel>* channel) {
  options.device = config;
  auto s = zrpc::Server::Create(options);
  REQUIRE(s.ok());
  *server = std::move(*s);
  REQUIRE((*server)->AddService(service).ok());
  REQUIRE((*server)->Start().ok());
  channel_options.device = config;
  const std::string host =
      config.addr.find(':') != std::string::npos ? "[" + config.addr + "]" : config.addr;
  auto c = zrpc::CreateChannel(absl::StrCat(host, ":", (*server)->port()), channel_options);
  REQUIRE(c.ok());
  *channel = std::move(*c);
}

struct NumbersFixture {
  TestNumbers service;
  std::unique_ptr<zrpc::Server> server;
  std::unique_ptr<zrpc::ClientChannel> channel;

  explicit NumbersFixture(const zrpc::transport::DeviceConfig& config,
                          zrpc::ServerOptions options = {},
                          zrpc::ChannelOptions channel_options = {}) {
    ServeAndConnect(&service, config, std::move(options), std::move(channel_options), &server,
                    &channel);
  }
};

// Waits until `count()` is above `floor` and has not moved for 300 ms: what the tests call
// stuck (a thread merely slow for 300 ms is not, unless it is past the floor). Returns it.
template <typename Count>
uint64_t WaitUntilStuck(Count count, uint64_t floor, absl::Duration limit) {
  uint64_t value = 0;
  const absl::Time give_up = absl::Now() + limit;
  for (int stable = 0; stable < 6 || value <= floor;) {
    REQUIRE(absl::Now() < give_up);
    absl::SleepFor(absl::Milliseconds(50));
    const uint64_t now = count();
    stable = now == value ? stable + 1 : 0;
    value = now;
  }
  return value;
}

inline CountRequest Counting(uint64_t count) {
  CountRequest request;
  request.set_start(1);
  request.set_count(count);
  return request;
}

}  // namespace zrpc_test

#endif  // ZRPC_TESTS_RPC_NUMBERS_FIXTURE_H_
