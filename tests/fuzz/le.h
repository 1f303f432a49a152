// Little-endian reads for the fuzz targets' own reading of the wire formats. The targets restate
// each format from its documentation and compare the decoder with that restatement, so they must
// not borrow the decoders' helpers (transport/byte_order.h): a bug there would agree with itself.
#ifndef ZRPC_TESTS_FUZZ_LE_H_
#define ZRPC_TESTS_FUZZ_LE_H_

#include <cstddef>
#include <cstdint>

namespace zrpc::fuzz {

// The `width`-byte little-endian unsigned integer at `in` (width at most 8).
inline uint64_t ReadLe(const uint8_t* in, size_t width) {
  uint64_t value = 0;
  for (size_t i = width; i-- > 0;) value = (value << 8) | in[i];
  return value;
}

}  // namespace zrpc::fuzz

#endif  // ZRPC_TESTS_FUZZ_LE_H_
