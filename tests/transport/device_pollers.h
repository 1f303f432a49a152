// The device and pollers most transport tests start from: the harness's device, a server poller
// in event mode (or with the options given) and a client poller busy-polling, both running.
#ifndef ZRPC_TESTS_TRANSPORT_DEVICE_POLLERS_H_
#define ZRPC_TESTS_TRANSPORT_DEVICE_POLLERS_H_

#include <catch2/catch.hpp>
#include <memory>

#include "transport/device.h"
#include "transport/poller.h"

namespace zrpc::testing {

struct DevicePollers {
  std::unique_ptr<transport::Device> device;
  std::unique_ptr<transport::Poller> server_poller;
  std::unique_ptr<transport::Poller> client_poller;

  static transport::PollerOptions EventMode() {
    transport::PollerOptions event;
    event.mode = transport::PollMode::kEvent;
    return event;
  }

  explicit DevicePollers(const transport::DeviceConfig& config,
                         const transport::PollerOptions& server = EventMode(),
                         const transport::PollerOptions& client = {}) {
    auto d = transport::Device::Open(config);
    INFO(d.status());
    REQUIRE(d.ok());
    device = std::move(*d);
    auto sp = transport::Poller::Create(*device, server);
    auto cp = transport::Poller::Create(*device, client);
    INFO(sp.status() << "; " << cp.status());
    REQUIRE(sp.ok());
    REQUIRE(cp.ok());
    server_poller = std::move(*sp);
    client_poller = std::move(*cp);
    REQUIRE(server_poller->Start().ok());
    REQUIRE(client_poller->Start().ok());
  }
};

}  // namespace zrpc::testing

#endif  // ZRPC_TESTS_TRANSPORT_DEVICE_POLLERS_H_
