// Linked into a test binary (//tests:counting_new), replaces the global operator new with one
// that counts every allocation of every thread: how a test proves a path allocates nothing.
#ifndef ZRPC_TESTS_COUNTING_NEW_H_
#define ZRPC_TESTS_COUNTING_NEW_H_

#include <cstdint>

namespace zrpc::testing {

// Allocations by operator new (any form) since the program started.
uint64_t AllocationCount();

}  // namespace zrpc::testing

#endif  // ZRPC_TESTS_COUNTING_NEW_H_
