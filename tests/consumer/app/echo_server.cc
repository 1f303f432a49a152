// A user's server program: serves consumer.Echo on the RDMA device until SIGINT or SIGTERM.
//   echo_server [port]      (0 or none: any free port; the address and port are printed)
#include <csignal>
#include <cstdio>
#include <cstdlib>

#include "absl/time/clock.h"
#include "app/echo.zrpc.h"
#include "rpc/server.h"

namespace {

volatile std::sig_atomic_t stop = 0;

class EchoImpl : public consumer::Echo::Service {
 public:
  absl::Status Hello(zrpc::ServerContext&, const zrpc::examples::HelloRequest& request,
                     zrpc::examples::HelloReply* reply) override {
    reply->set_message("hello " + request.name());
    return absl::OkStatus();
  }
};

}  // namespace

int main(int argc, char** argv) {
  zrpc::ServerOptions options;
  if (argc > 1) options.port = static_cast<uint16_t>(std::atoi(argv[1]));
  auto server = zrpc::Server::Create(options);
  if (!server.ok()) {
    std::fprintf(stderr, "echo_server: %s\n", server.status().ToString().c_str());
    return 1;
  }
  EchoImpl impl;
  absl::Status s = (*server)->AddService(&impl);
  if (s.ok()) s = (*server)->Start();
  if (!s.ok()) {
    std::fprintf(stderr, "echo_server: %s\n", s.ToString().c_str());
    return 1;
  }
  std::printf("serving consumer.Echo on %s:%u\n", (*server)->address().c_str(), (*server)->port());
  std::fflush(stdout);
  std::signal(SIGINT, [](int) { stop = 1; });
  std::signal(SIGTERM, [](int) { stop = 1; });
  while (!stop) absl::SleepFor(absl::Milliseconds(100));
  (*server)->Shutdown(absl::Seconds(5));
  return 0;
}
