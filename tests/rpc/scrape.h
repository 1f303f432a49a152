// Scraping /metrics as Prometheus would, for tests: fetched with curl (a real HTTP client, run as
// a process) and checked with Prometheus' own `promtool check metrics`.
#ifndef ZRPC_TESTS_RPC_SCRAPE_H_
#define ZRPC_TESTS_RPC_SCRAPE_H_

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"

namespace zrpc::testing {

struct CommandResult {
  int exit_code = -1;
  std::string output;  // stdout and stderr
};

// Runs `command` with sh, `input` on its stdin (through a temporary file).
inline CommandResult RunCommand(const std::string& command, const std::string& input = "") {
  const char* tmpdir = std::getenv("TEST_TMPDIR");
  std::string path = absl::StrCat(tmpdir != nullptr ? tmpdir : "/tmp", "/zrpc-stdin-XXXXXX");
  const int fd = mkstemp(path.data());
  if (fd < 0) return {};
  std::FILE* f = fdopen(fd, "w");
  std::fwrite(input.data(), 1, input.size(), f);
  std::fclose(f);
  CommandResult result;
  std::FILE* p = popen(absl::StrCat(command, " <", path, " 2>&1").c_str(), "r");
  if (p != nullptr) {
    char buf[4096];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) result.output.append(buf, n);
    const int status = pclose(p);
    result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }
  unlink(path.c_str());
  return result;
}

struct HttpResponse {
  int curl_exit = -1;
  int status = 0;         // the HTTP status code
  std::string headers;    // as received, lower-cased names not guaranteed
  std::string body;
};

// `curl` with `args` (say "-X POST") against `url`: status, headers and body apart.
inline HttpResponse Curl(const std::string& url, const std::string& args = "") {
  const char* tmpdir = std::getenv("TEST_TMPDIR");
  const std::string dir = tmpdir != nullptr ? tmpdir : "/tmp";
  const std::string head = dir + "/curl-head", body = dir + "/curl-body";
  HttpResponse r;
  CommandResult run = RunCommand(absl::StrCat("curl -sS --max-time 10 ", args, " -D ", head,
                                              " -o ", body, " -w '%{http_code}' '", url, "'"));
  r.curl_exit = run.exit_code;
  r.status = std::atoi(run.output.c_str());
  std::ifstream h(head), b(body);
  r.headers.assign(std::istreambuf_iterator<char>(h), {});
  r.body.assign(std::istreambuf_iterator<char>(b), {});
  unlink(head.c_str());
  unlink(body.c_str());
  return r;
}

// promtool: ZRPC_PROMTOOL (tools/test sets it to the one tools/install-deps extracted), else one
// on PATH; nullopt when there is none.
inline std::optional<std::string> FindPromtool() {
  if (const char* env = std::getenv("ZRPC_PROMTOOL"); env != nullptr && *env != '\0') return env;
  if (RunCommand("command -v promtool").exit_code == 0) return std::string("promtool");
  return std::nullopt;
}

}  // namespace zrpc::testing

#endif  // ZRPC_TESTS_RPC_SCRAPE_H_
