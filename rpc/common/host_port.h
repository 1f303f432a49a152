// "host:port" as zrpc's options spell addresses: "198.18.0.1:7471", "[fe80::1]:7471", "node7:80".
#ifndef ZRPC_RPC_COMMON_HOST_PORT_H_
#define ZRPC_RPC_COMMON_HOST_PORT_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace zrpc::internal {

// Splits `text` into a host (without the brackets of an IPv6 address) and a port in [1, 65535],
// or [0, 65535] with `allow_port_zero` (a listener's "any free port"). kInvalidArgument naming
// `what` ("target", "metrics_address") and the expected form otherwise.
absl::Status ParseHostPort(absl::string_view text, absl::string_view what, bool allow_port_zero,
                           std::string* host, uint16_t* port);

}  // namespace zrpc::internal

#endif  // ZRPC_RPC_COMMON_HOST_PORT_H_
