#include "examples/serve.h"

#include <cstdio>
#include <cstring>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace zrpc::examples {

std::optional<std::string> ApplyServerFlags(const cli::CommandLine& args, ServerOptions* options) {
  options->address.clear();  // the device's own address
  options->port = 7471;
  if (const std::string* text = args.Find("listen")) {
    std::optional<cli::HostPort> listen = cli::ParseHostPort(*text);
    if (!listen) return "bad --listen " + *text;
    options->address = listen->address;
    options->port = listen->port;
  }
  if (const std::string* text = args.Find("threads")) {
    std::optional<uint64_t> threads = cli::ParseNumber(*text, 1, 256);
    if (!threads) return "bad --threads " + *text;
    options->handler_threads = static_cast<int>(*threads);
  }
  return std::nullopt;
}

int ServeUntilStopped(absl::string_view program, const ServerOptions& options, Service* service,
                      const sigset_t& stop_signals) {
  absl::StatusOr<std::unique_ptr<Server>> server = Server::Create(options);
  absl::Status status = server.status();
  if (status.ok()) status = (*server)->AddService(service);
  if (status.ok()) status = (*server)->Start();
  if (!status.ok()) {
    std::fprintf(stderr, "%s: %s\n", std::string(program).c_str(), status.ToString().c_str());
    return 1;
  }
  std::printf("listening on %s\n",
              cli::FormatHostPort((*server)->address(), (*server)->port()).c_str());
  std::fflush(stdout);

  const int signal = cli::WaitForStopSignal(stop_signals);
  std::printf("%s: shutting down after %llu calls\n", strsignal(signal),
              static_cast<unsigned long long>((*server)->stats().calls_started));
  std::fflush(stdout);
  (*server)->Shutdown(absl::Seconds(5));
  return 0;
}

}  // namespace zrpc::examples
