// Little-endian integers: the wire formats' one way to put a number into bytes (transport/wire.h,
// rpc/WIRE.md). Never a memcpy of a struct, so the bytes depend on neither the compiler's layout
// nor padding, and a read needs no alignment. An integer is copied whole and byte-swapped on a
// big-endian host: GCC does not merge the byte-by-byte loop these once were into one load or
// store at -O2, and the headers of every message paid about 17 instructions per field for it
// (benchmarks/count_instructions).
#ifndef ZRPC_TRANSPORT_BYTE_ORDER_H_
#define ZRPC_TRANSPORT_BYTE_ORDER_H_

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

namespace zrpc::transport {
namespace byte_order_internal {

template <typename T>
T ToLittle(T value) {
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
  if constexpr (sizeof(T) == 2) return __builtin_bswap16(value);
  if constexpr (sizeof(T) == 4) return __builtin_bswap32(value);
  if constexpr (sizeof(T) == 8) return __builtin_bswap64(value);
#endif
  return value;
}

}  // namespace byte_order_internal

// Writes `value` into out[0, sizeof(T)), least significant byte first.
template <typename T>
void PutLe(uint8_t* out, T value) {
  static_assert(std::is_unsigned_v<T>, "wire integers are unsigned");
  value = byte_order_internal::ToLittle(value);
  std::memcpy(out, &value, sizeof(T));
}

// Reads a T from in[0, sizeof(T)), least significant byte first.
template <typename T>
T GetLe(const uint8_t* in) {
  static_assert(std::is_unsigned_v<T>, "wire integers are unsigned");
  T value;
  std::memcpy(&value, in, sizeof(T));
  return byte_order_internal::ToLittle(value);
}

}  // namespace zrpc::transport

#endif  // ZRPC_TRANSPORT_BYTE_ORDER_H_
