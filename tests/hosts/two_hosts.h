// For tests between two hosts (tag "two_hosts"; tools/test runs them in a `tools/softroce start
// --hosts 2` session): the test runs in guest a, its peers in guest b, and the link between the
// two kernels is told to lose, delay, duplicate or reorder frames, to go down, or to kill b.
//
// Outside such a session the test is SKIPPED with a message saying how to run it; inside one
// (ZRPC_SOFTROCE_MODE=vm2), anything missing is a failure.
#ifndef ZRPC_TESTS_HOSTS_TWO_HOSTS_H_
#define ZRPC_TESTS_HOSTS_TWO_HOSTS_H_

#include <sys/types.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "tests/rdma_device.h"

namespace zrpc::testing {

// What a two-host session tells the test: the other guest's address and the harness.
struct TwoHosts {
  std::string peer_addr;  // guest b's address on its RDMA device
  std::string tool;       // tools/softroce
  std::string session;    // the session's directory (the host's, seen over 9p)
};

// The session's two hosts, or NotFound outside one (FailedPrecondition: half described).
absl::StatusOr<TwoHosts> TwoHostsFromEnv();

// What `tools/softroce link REQUEST` does, without starting the script: "faults both loss=0.01
// seed=3", "down b", "up b", "down b for=MS", "kill b", "revive b", "stats". Returns what the
// link answered (stats: JSON), or why it refused. The request reaches the relay within tens of
// milliseconds (revive takes the boot's time).
absl::StatusOr<std::string> Link(const TwoHosts& hosts, const std::string& request);

// A frame count from `Link(hosts, "stats")`: `direction` "a>b" or "b>a", `counter` "frames",
// "lost", "delivered", ... ; -1 when the answer has no such figure.
int64_t LinkCount(const std::string& stats, const std::string& direction,
                  const std::string& counter);

// A program run in guest b (`tools/softroce exec --guest b`), its standard output on a pipe.
// Stopped (SIGTERM to it in b) when destroyed. Guest b runs one command at a time.
class RemotePeer {
 public:
  RemotePeer(const TwoHosts& hosts, std::vector<std::string> argv);
  ~RemotePeer();
  RemotePeer(const RemotePeer&) = delete;
  RemotePeer& operator=(const RemotePeer&) = delete;

  // The next line it printed, or "" after `timeout` (or once it ended).
  std::string ReadLine(absl::Duration timeout);
  // Stops it: the harness cancels it in b (which takes its next command once it has ended).
  void Stop();

 private:
  pid_t pid_ = 0;
  int out_ = -1;
};

// A test program's runfile: `label_path` is the workspace path ("tests/rpc/rpc_peer").
std::string Runfile(const std::string& label_path);

}  // namespace zrpc::testing

// Declares `const zrpc::transport::DeviceConfig& var` (guest a's device) and
// `const zrpc::testing::TwoHosts& var_hosts`, or skips / fails the test case.
#define ZRPC_REQUIRE_TWO_HOSTS(var)                                                            \
  ZRPC_REQUIRE_RDMA_DEVICE(var);                                                               \
  auto var##_hosts_or = ::zrpc::testing::TwoHostsFromEnv();                                    \
  if (!var##_hosts_or.ok()) {                                                                  \
    if (var##_hosts_or.status().code() == absl::StatusCode::kNotFound) {                       \
      ZRPC_SKIP(                                                                               \
          "needs two hosts: run it in a `tools/softroce start --hosts 2` session (tools/test " \
          "does)");                                                                            \
    }                                                                                          \
    FAIL(var##_hosts_or.status().ToString());                                                  \
  }                                                                                            \
  const ::zrpc::testing::TwoHosts& var##_hosts = *var##_hosts_or

#endif  // ZRPC_TESTS_HOSTS_TWO_HOSTS_H_
