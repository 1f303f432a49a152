// CRC-32C (Castagnoli), the checksum ObjectInfo.crc32c carries (proto/examples/object_store.proto).
// A plain table-driven software version: enough for an example, ~1 GB/s; Abseil gained a fast one
// (absl/crc) after the version Debian 12 ships.
#ifndef ZRPC_EXAMPLES_CRC32C_H_
#define ZRPC_EXAMPLES_CRC32C_H_

#include <cstdint>

#include "absl/strings/string_view.h"

namespace zrpc::examples {

// The CRC-32C of `bytes`: Crc32c("123456789") == 0xE3069283.
uint32_t Crc32c(absl::string_view bytes);

}  // namespace zrpc::examples

#endif  // ZRPC_EXAMPLES_CRC32C_H_
