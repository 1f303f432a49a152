#include "tests/hosts/two_hosts.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "tests/read_line.h"

extern char** environ;

namespace zrpc::testing {
namespace {

std::string Env(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr ? value : "";
}

// Starts `argv` with its standard output (and, with `merge_stderr`, its standard error) on a
// pipe; the pipe's read end goes to *out.
absl::StatusOr<pid_t> Spawn(std::vector<std::string> argv, int* out, bool merge_stderr) {
  std::vector<char*> args;
  for (std::string& arg : argv) args.push_back(arg.data());
  args.push_back(nullptr);
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) return absl::InternalError("pipe");
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, fds[1], STDOUT_FILENO);
  if (merge_stderr) posix_spawn_file_actions_adddup2(&actions, fds[1], STDERR_FILENO);
  pid_t pid = 0;
  const int rc = posix_spawn(&pid, args[0], &actions, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  close(fds[1]);
  if (rc != 0) {
    close(fds[0]);
    return absl::InternalError(absl::StrCat("cannot start ", argv[0], ": errno ", rc));
  }
  *out = fds[0];
  return pid;
}

}  // namespace

absl::StatusOr<TwoHosts> TwoHostsFromEnv() {
  TwoHosts hosts{Env("ZRPC_SOFTROCE_PEER_ADDR"), Env("ZRPC_SOFTROCE_TOOL")};
  if (hosts.peer_addr.empty() && hosts.tool.empty()) {
    return absl::NotFoundError("not in a two-host session");
  }
  if (hosts.peer_addr.empty() || hosts.tool.empty() || Env("ZRPC_SOFTROCE_SESSION").empty()) {
    return absl::FailedPreconditionError(
        "a two-host session needs ZRPC_SOFTROCE_PEER_ADDR, ZRPC_SOFTROCE_TOOL and "
        "ZRPC_SOFTROCE_SESSION (pass the session to the test: --test_env)");
  }
  return hosts;
}

absl::StatusOr<std::string> Link(const TwoHosts& hosts, const std::string& request) {
  std::vector<std::string> argv = {hosts.tool, "link"};
  for (absl::string_view word : absl::StrSplit(request, ' ', absl::SkipEmpty())) {
    argv.emplace_back(word);
  }
  int out = -1;
  absl::StatusOr<pid_t> pid = Spawn(std::move(argv), &out, /*merge_stderr=*/true);
  if (!pid.ok()) return pid.status();
  std::string said;
  char buffer[4096];
  for (ssize_t n; (n = read(out, buffer, sizeof(buffer))) != 0;) {
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) break;
    said.append(buffer, static_cast<size_t>(n));
  }
  close(out);
  int status = 0;
  waitpid(*pid, &status, 0);
  while (!said.empty() && said.back() == '\n') said.pop_back();
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    return absl::InternalError(absl::StrCat("link ", request, ": ", said));
  }
  return said;
}

int64_t LinkCount(const std::string& stats, const std::string& direction,
                  const std::string& counter) {
  // {"a>b": {..., "frames": 6, ...}, "b>a": {...}}: the counter after the direction's key.
  const size_t at = stats.find(absl::StrCat("\"", direction, "\""));
  if (at == std::string::npos) return -1;
  const size_t key = stats.find(absl::StrCat("\"", counter, "\": "), at);
  if (key == std::string::npos) return -1;
  const size_t start = key + counter.size() + 4;
  const size_t end = stats.find_first_of(",}", start);
  int64_t value = -1;
  if (!absl::SimpleAtoi(stats.substr(start, end - start), &value)) return -1;
  return value;
}

RemotePeer::RemotePeer(const TwoHosts& hosts, std::vector<std::string> argv) {
  argv.insert(argv.begin(), {hosts.tool, "exec", "--guest", "b", "--"});
  absl::StatusOr<pid_t> pid = Spawn(std::move(argv), &out_, /*merge_stderr=*/false);
  INFO(pid.status());
  REQUIRE(pid.ok());
  pid_ = *pid;
}

RemotePeer::~RemotePeer() {
  Stop();
  if (out_ >= 0) close(out_);
}

std::string RemotePeer::ReadLine(absl::Duration timeout) {
  return zrpc::testing::ReadLine(out_, timeout);
}

void RemotePeer::Stop() {
  if (pid_ <= 0) return;
  // The harness's exec cancels the job in b on SIGTERM (its process group gets SIGTERM, then
  // SIGKILL after 5 s) and ends.
  kill(pid_, SIGTERM);
  int status = 0;
  waitpid(pid_, &status, 0);
  pid_ = 0;
}

std::string Runfile(const std::string& label_path) {
  return absl::StrCat(Env("TEST_SRCDIR"), "/", Env("TEST_WORKSPACE"), "/", label_path);
}

}  // namespace zrpc::testing
