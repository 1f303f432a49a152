#include "tests/hosts/two_hosts.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
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
  TwoHosts hosts{Env("ZRPC_SOFTROCE_PEER_ADDR"), Env("ZRPC_SOFTROCE_TOOL"),
                 Env("ZRPC_SOFTROCE_SESSION")};
  if (hosts.peer_addr.empty() && hosts.tool.empty() && Env("ZRPC_SOFTROCE_MODE") != "vm2") {
    return absl::NotFoundError("not in a two-host session");
  }
  if (hosts.peer_addr.empty() || hosts.tool.empty() || hosts.session.empty()) {
    return absl::FailedPreconditionError(
        "a two-host session needs ZRPC_SOFTROCE_PEER_ADDR, ZRPC_SOFTROCE_TOOL and "
        "ZRPC_SOFTROCE_SESSION (pass the session to the test: --test_env)");
  }
  return hosts;
}

absl::StatusOr<std::string> Link(const TwoHosts& hosts, const std::string& request) {
  // The relay's request protocol (tools/softroce's cmd_link speaks it too): the request in
  // ctl/ID.req, written whole by a rename; the answer in ctl/ID.rsp, "ok ..." or "error: ...".
  // Spoken here rather than through the script, which takes seconds to start in a guest whose
  // one vCPU is busy with the test's calls: a test times faults by when it asked for them.
  const std::string& session = hosts.session;
  if (access(absl::StrCat(session, "/link.dead").c_str(), F_OK) == 0) {
    return absl::UnavailableError(
        absl::StrCat("link ", request, ": tools/softroce-link died (see ", session, "/link.log)"));
  }
  static std::atomic<int> sequence{0};
  const std::string base = absl::StrCat(session, "/ctl/", absl::ToUnixNanos(absl::Now()), "-",
                                        Env("ZRPC_SOFTROCE_GUEST"), getpid(), "-", sequence++);
  {
    std::FILE* f = std::fopen((base + ".tmp").c_str(), "w");
    if (f == nullptr) return absl::InternalError(absl::StrCat("cannot write ", base, ".tmp"));
    const bool written = std::fputs((request + "\n").c_str(), f) >= 0;
    if (std::fclose(f) != 0 || !written) {
      return absl::InternalError(absl::StrCat("cannot write ", base, ".tmp"));
    }
  }
  if (std::rename((base + ".tmp").c_str(), (base + ".req").c_str()) != 0) {
    return absl::InternalError(absl::StrCat("cannot rename ", base, ".tmp"));
  }
  // A minute: `revive` boots a guest.
  const absl::Time give_up = absl::Now() + absl::Seconds(60);
  while (absl::Now() < give_up) {
    std::FILE* f = std::fopen((base + ".rsp").c_str(), "r");
    if (f == nullptr) {
      absl::SleepFor(absl::Milliseconds(5));
      continue;
    }
    std::string answer;
    char buffer[4096];
    for (size_t n; (n = std::fread(buffer, 1, sizeof(buffer), f)) > 0;) answer.append(buffer, n);
    std::fclose(f);
    std::remove((base + ".rsp").c_str());
    while (!answer.empty() && answer.back() == '\n') answer.pop_back();
    if (!absl::StartsWith(answer, "ok")) {
      return absl::InternalError(absl::StrCat("link ", request, ": ", answer));
    }
    return answer.size() > 3 ? answer.substr(3) : "";
  }
  std::remove((base + ".req").c_str());
  return absl::DeadlineExceededError(
      absl::StrCat("link ", request, ": no answer from tools/softroce-link within 60 s"));
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
  // A bound on how long it may hold guest b, whatever happens to this process.
  argv.insert(argv.begin(), {hosts.tool, "exec", "--timeout", "900", "--guest", "b", "--"});
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
  // The harness's exec cancels the job in b on SIGTERM and ends at once; b sends the job's
  // process group SIGTERM within 50 ms (SIGKILL 5 s later), and takes its next job after that.
  kill(pid_, SIGTERM);
  int status = 0;
  waitpid(pid_, &status, 0);
  pid_ = 0;
}

std::string Runfile(const std::string& label_path) {
  return absl::StrCat(Env("TEST_SRCDIR"), "/", Env("TEST_WORKSPACE"), "/", label_path);
}

}  // namespace zrpc::testing
