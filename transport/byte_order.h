// Little-endian integers, written and read byte by byte: the wire formats' one way to put a
// number into bytes (transport/wire.h, rpc/WIRE.md). Byte by byte, never a memcpy of a struct or
// an integer, so the bytes do not depend on the host's byte order or the compiler's layout, and
// a read needs no alignment.
#ifndef ZRPC_TRANSPORT_BYTE_ORDER_H_
#define ZRPC_TRANSPORT_BYTE_ORDER_H_

#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace zrpc::transport {

// Writes `value` into out[0, sizeof(T)), least significant byte first.
template <typename T>
void PutLe(uint8_t* out, T value) {
  static_assert(std::is_unsigned_v<T>, "wire integers are unsigned");
  for (size_t i = 0; i < sizeof(T); ++i) out[i] = static_cast<uint8_t>(value >> (8 * i));
}

// Reads a T from in[0, sizeof(T)), least significant byte first.
template <typename T>
T GetLe(const uint8_t* in) {
  static_assert(std::is_unsigned_v<T>, "wire integers are unsigned");
  T value = 0;
  for (size_t i = 0; i < sizeof(T); ++i) value |= static_cast<T>(in[i]) << (8 * i);
  return value;
}

}  // namespace zrpc::transport

#endif  // ZRPC_TRANSPORT_BYTE_ORDER_H_
