// Reading a child process's output line by line, with a timeout (cross_process_test's peers in
// this guest, tests/hosts' peers in the other).
#ifndef ZRPC_TESTS_READ_LINE_H_
#define ZRPC_TESTS_READ_LINE_H_

#include <poll.h>
#include <unistd.h>

#include <string>

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace zrpc::testing {

// The next line read from `fd` (without its newline), or "" after `timeout` or at its end.
inline std::string ReadLine(int fd, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  std::string line;
  while (absl::Now() < deadline) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, 50) <= 0) continue;
    char c;
    if (read(fd, &c, 1) != 1) break;
    if (c == '\n') return line;
    line.push_back(c);
  }
  return "";
}

}  // namespace zrpc::testing

#endif  // ZRPC_TESTS_READ_LINE_H_
