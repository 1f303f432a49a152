// Scraping /metrics as Prometheus would, for tests: fetched with curl (a real HTTP client, run as
// a process) and checked with Prometheus' own `promtool check metrics`.
#ifndef ZRPC_TESTS_RPC_SCRAPE_H_
#define ZRPC_TESTS_RPC_SCRAPE_H_

#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "tests/codegen/tool_run.h"

namespace zrpc::testing {

struct CommandResult {
  int exit_code = -1;
  std::string output;  // stdout and stderr
};

// Runs `command` with sh (tool_run.h's Run), `input` on its stdin through a scratch file.
inline CommandResult RunCommand(const std::string& command, const std::string& input = "") {
  const std::string path = TmpDir() + "/scrape-stdin";
  std::ofstream(path, std::ios::binary) << input;
  CommandResult result;
  result.exit_code = Run(absl::StrCat(command, " <", path), &result.output);
  unlink(path.c_str());
  return result;
}

struct HttpResponse {
  int curl_exit = -1;
  int status = 0;       // the HTTP status code
  std::string headers;  // as received
  std::string body;
};

// `curl` with `args` (say "-X POST") against `url`: status, headers and body apart.
inline HttpResponse Curl(const std::string& url, const std::string& args = "") {
  const std::string head = TmpDir() + "/curl-head", body = TmpDir() + "/curl-body";
  HttpResponse r;
  CommandResult run = RunCommand(absl::StrCat("curl -sS --max-time 10 ", args, " -D ", head, " -o ",
                                              body, " -w '%{http_code}' '", url, "'"));
  r.curl_exit = run.exit_code;
  r.status = std::atoi(run.output.c_str());
  r.headers = ReadFile(head);
  r.body = ReadFile(body);
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
