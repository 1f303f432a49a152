// What the two example servers do alike: take --listen and --threads, and serve until SIGINT or
// SIGTERM. Their own files hold what differs: the service.
#ifndef ZRPC_EXAMPLES_SERVE_H_
#define ZRPC_EXAMPLES_SERVE_H_

#include <csignal>
#include <optional>
#include <string>

#include "absl/strings/string_view.h"
#include "examples/cli.h"
#include "rpc/server.h"

namespace zrpc::examples {

// Sets `options` from --listen and --threads, or to their defaults when absent. On a bad value,
// the message for the user.
std::optional<std::string> ApplyServerFlags(const cli::CommandLine& args, ServerOptions* options);

// Creates a server with `options` serving `service` and starts it; prints
// "listening on ADDR:PORT" to stdout (flushed: a script may wait for it); waits for one of
// `stop_signals` (from cli::BlockStopSignals, called before any thread started); shuts down,
// giving the calls in flight 5 s. Returns the exit code: 0, or 1 after printing why the server
// did not start.
int ServeUntilStopped(absl::string_view program, const ServerOptions& options, Service* service,
                      const sigset_t& stop_signals);

}  // namespace zrpc::examples

#endif  // ZRPC_EXAMPLES_SERVE_H_
