// Test data: deterministic bytes that differ per seed and per position, so a misplaced, stale or
// truncated buffer never matches by accident.
#ifndef ZRPC_TESTS_PATTERN_H_
#define ZRPC_TESTS_PATTERN_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace zrpc::testing {

// Fills p[0, n) from an xorshift64 stream seeded by `seed`.
inline void Fill(uint8_t* p, size_t n, uint64_t seed) {
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (size_t i = 0; i < n; ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    p[i] = static_cast<uint8_t>(x >> 24);
  }
}

// The same bytes as a string, for comparisons.
inline std::string Filled(size_t n, uint64_t seed) {
  std::string s(n, '\0');
  Fill(reinterpret_cast<uint8_t*>(s.data()), n, seed);
  return s;
}

// "equal", or where two byte strings first differ, for a readable failure of large payloads.
inline std::string FirstDifference(absl::string_view a, absl::string_view b) {
  if (a == b) return "equal";  // memcmp: the byte loop below is slow under emulation
  if (a.size() != b.size()) return absl::StrCat("sizes ", a.size(), " and ", b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i] != b[i]) return absl::StrCat("first difference at byte ", i);
  }
  return "equal";
}

}  // namespace zrpc::testing

#endif  // ZRPC_TESTS_PATTERN_H_
