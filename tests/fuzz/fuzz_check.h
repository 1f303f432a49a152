// FUZZ_CHECK(condition): how the fuzz targets state a property. A violated property has to end
// the process abnormally, or libFuzzer would neither stop nor save the input; it also names the
// property and its line, because a bare trap only shows a stack and the reader of a CI log wants
// to know which rule broke before they reproduce anything.
#ifndef ZRPC_TESTS_FUZZ_FUZZ_CHECK_H_
#define ZRPC_TESTS_FUZZ_FUZZ_CHECK_H_

#include <cstdio>

namespace zrpc::fuzz {

[[noreturn]] inline void PropertyViolated(const char* condition, const char* file, int line) {
  std::fprintf(stderr, "%s:%d: fuzz property violated: %s\n", file, line, condition);
  std::fflush(stderr);
  __builtin_trap();  // libFuzzer treats the signal as a crash and writes the input out
}

}  // namespace zrpc::fuzz

#define FUZZ_CHECK(condition)                                                         \
  do {                                                                                \
    if (!(condition)) ::zrpc::fuzz::PropertyViolated(#condition, __FILE__, __LINE__); \
  } while (0)

#endif  // ZRPC_TESTS_FUZZ_FUZZ_CHECK_H_
