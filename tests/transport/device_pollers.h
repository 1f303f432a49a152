// The device and pollers most transport tests start from: the harness's device, a server poller
// in event mode and a client poller busy-polling, both running.
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

  explicit DevicePollers(const transport::DeviceConfig& config) {
    auto d = transport::Device::Open(config);
    INFO(d.status());
    REQUIRE(d.ok());
    device = std::move(*d);
    transport::PollerOptions event;
    event.mode = transport::PollMode::kEvent;
    auto sp = transport::Poller::Create(*device, event);
    auto cp = transport::Poller::Create(*device);
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
