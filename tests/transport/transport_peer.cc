// A peer process for the failure tests: connects to ADDR PORT and then never polls, so the
// messages it receives are never released and the other side runs out of credits. The test
// kills it with SIGKILL mid-stream. Prints "connected" once the connection is up.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>

#include "transport/connection.h"
#include "transport/device.h"
#include "transport/poller.h"

namespace {
class Silent : public zrpc::transport::ConnectionHandler {
  void OnMessage(zrpc::transport::Connection&, const zrpc::transport::ReceivedMessage&) override {}
  void OnBulk(zrpc::transport::Connection&, const zrpc::transport::ReceivedBulk&) override {}
  void OnSendDone(zrpc::transport::Connection&, uint64_t, const absl::Status&) override {}
  void OnClosed(zrpc::transport::Connection&, const absl::Status&) override {}
};
}  // namespace

int main(int argc, char** argv) {
  using namespace zrpc::transport;
  if (argc != 4) {
    std::fprintf(stderr, "usage: %s ADDR PORT RECV_CREDITS\n", argv[0]);
    return 2;
  }
  auto config = DeviceConfigFromEnv();
  if (!config.ok()) {
    std::fprintf(stderr, "transport_peer: %s\n", config.status().ToString().c_str());
    return 1;
  }
  auto device = Device::Open(*config);
  if (!device.ok()) {
    std::fprintf(stderr, "transport_peer: %s\n", device.status().ToString().c_str());
    return 1;
  }
  auto poller = Poller::Create(**device);
  if (!poller.ok()) return 1;
  Silent handler;
  ConnectionOptions options;
  options.recv_credits = static_cast<uint32_t>(std::atoi(argv[3]));
  auto connection =
      Connection::Connect(**device, **poller, argv[1], static_cast<uint16_t>(std::atoi(argv[2])),
                          &handler, options, absl::Seconds(60));
  if (!connection.ok()) {
    std::fprintf(stderr, "transport_peer: %s\n", connection.status().ToString().c_str());
    return 1;
  }
  std::printf("connected\n");
  std::fflush(stdout);
  for (;;) pause();
}
