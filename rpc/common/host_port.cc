// "host:port" parsing, as the options spell addresses.

#include "rpc/common/host_port.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace zrpc::internal {

absl::Status ParseHostPort(absl::string_view text, absl::string_view what, bool allow_port_zero,
                           std::string* host, uint16_t* port) {
  const size_t colon = text.rfind(':');
  if (colon == absl::string_view::npos || colon == 0) {
    return absl::InvalidArgumentError(absl::StrCat(what, " \"", text, "\" is not \"host:port\""));
  }
  absl::string_view h = text.substr(0, colon);
  if (h.front() == '[') {
    if (h.size() < 3 || h.back() != ']') {
      return absl::InvalidArgumentError(
          absl::StrCat(what, " \"", text, "\": an IPv6 address goes in brackets, [addr]:port"));
    }
    h = h.substr(1, h.size() - 2);
  } else if (h.find(':') != absl::string_view::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " \"", text, "\": write an IPv6 address in brackets, [addr]:port"));
  }
  uint32_t p = 0;
  const uint32_t lowest = allow_port_zero ? 0 : 1;
  const absl::string_view digits = text.substr(colon + 1);
  // Digits only: SimpleAtoi would also take " 80" and "+80".
  if (digits.empty() || digits.size() > 5 ||
      digits.find_first_not_of("0123456789") != absl::string_view::npos ||
      !absl::SimpleAtoi(digits, &p) || p < lowest || p > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " \"", text, "\": the port must be a number in [", lowest, ", 65535]"));
  }
  *host = std::string(h);
  *port = static_cast<uint16_t>(p);
  return absl::OkStatus();
}

}  // namespace zrpc::internal
