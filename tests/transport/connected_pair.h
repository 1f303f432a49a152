// A connected pair of transport connections on the harness's device, and helpers to send on
// them: what the transport tests on a device start from.
#ifndef ZRPC_TESTS_TRANSPORT_CONNECTED_PAIR_H_
#define ZRPC_TESTS_TRANSPORT_CONNECTED_PAIR_H_

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstring>
#include <memory>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "tests/transport/accept_queue.h"
#include "tests/transport/device_pollers.h"
#include "tests/transport/recorder.h"
#include "transport/connection.h"
#include "transport/device.h"
#include "transport/listener.h"

namespace zrpc::testing {

using transport::ConnectionOptions;
using transport::ConnectionStats;
using transport::Device;
using transport::DeviceConfig;
using transport::Listener;
using transport::ListenerOptions;

inline constexpr absl::Duration kTimeout = absl::Seconds(60);

// A device, a server poller in event mode, a client poller busy-polling, and a listener that
// places connections on the server poller and queues them (AcceptQueue).
struct Setup : zrpc::testing::DevicePollers {
  std::unique_ptr<AcceptQueue> accepts;
  std::unique_ptr<Listener> listener;

  explicit Setup(const DeviceConfig& config,
                 const transport::PollerOptions& server = DevicePollers::EventMode(),
                 const transport::PollerOptions& client = {})
      : DevicePollers(config, server, client) {
    accepts = std::make_unique<AcceptQueue>(server_poller.get(), nullptr);
    Listen();
  }

  // (Re)starts the listener, on a new port, with these options for accepted connections.
  void Listen(const ListenerOptions& options = {}) {
    listener.reset();
    auto l = Listener::Create(*device, "", 0, accepts.get(), options);
    INFO(l.status());
    REQUIRE(l.ok());
    listener = std::move(*l);
  }
};

// Connection options with a receive window of `credits`, the rest the defaults.
inline ConnectionOptions Window(uint32_t credits) {
  ConnectionOptions options;
  options.recv_credits = credits;
  return options;
}

struct Pair {
  std::shared_ptr<Connection> server;
  std::shared_ptr<Connection> client;
};

inline Pair ConnectPair(Setup& setup, transport::ConnectionHandler* server_handler,
                        transport::ConnectionHandler* client_handler,
                        const ConnectionOptions& server_options = {},
                        const ConnectionOptions& client_options = {}) {
  ListenerOptions listen;
  listen.connection = server_options;
  setup.Listen(listen);
  setup.accepts->Use(setup.server_poller.get(), server_handler);
  auto client =
      Connection::Connect(*setup.device, *setup.client_poller, setup.device->selection().addr,
                          setup.listener->port(), client_handler, client_options, kTimeout);
  INFO("client: " << client.status());
  REQUIRE(client.ok());
  auto server = setup.accepts->Next(kTimeout);
  INFO("server: " << server.status());
  REQUIRE(server.ok());
  return Pair{*server, *client};
}

// Pool slots allocated now (the pool grows, so free slots alone say nothing).
inline uint32_t SlotsInUse(const Device& device) {
  return device.slots().slot_count() - device.slots().available();
}

// Sends `payload` as one message, retrying while the slot pool is momentarily empty or too
// many operations wait for credits (for up to kTimeout: a stall is a failure, not a hang).
inline absl::Status SendBytes(Connection& c, const std::string& payload, uint64_t token) {
  absl::Time deadline = absl::Now() + kTimeout;
  for (;;) {
    if (absl::Now() > deadline) {
      ConnectionStats st = c.stats();
      return absl::DeadlineExceededError(
          absl::StrCat("send stalled: sent ", st.messages_sent, ", received ", st.messages_received,
                       ", credit frames ", st.credit_frames_sent, ", waited ", st.waited, "; ",
                       c.DebugString()));
    }
    auto buffer = c.AcquireSendBuffer();
    if (buffer.status().code() == absl::StatusCode::kResourceExhausted) {
      std::this_thread::yield();
      continue;
    }
    if (!buffer.ok()) return buffer.status();
    std::memcpy(buffer->data, payload.data(), std::min<size_t>(payload.size(), buffer->capacity));
    absl::Status s = c.Send(*buffer, static_cast<uint32_t>(payload.size()), token);
    if (s.code() != absl::StatusCode::kResourceExhausted) return s;
    std::this_thread::yield();  // too many waiting for credits: let them drain
  }
}

}  // namespace zrpc::testing

#endif  // ZRPC_TESTS_TRANSPORT_CONNECTED_PAIR_H_
