// Running protoc, g++ and friends from a codegen test: runfile paths, the scratch directory, a
// command's exit code with its output, and reading what the tools wrote.
#ifndef ZRPC_TESTS_CODEGEN_TOOL_RUN_H_
#define ZRPC_TESTS_CODEGEN_TOOL_RUN_H_

#include <sys/wait.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>

namespace zrpc::testing {

// A file of this workspace as the test sees it (Bazel's runfiles tree).
inline std::string Runfile(const std::string& path) {
  const char* root = std::getenv("TEST_SRCDIR");
  return std::string(root != nullptr ? root : ".") + "/zrpc/" + path;
}

// The test's own scratch directory.
inline std::string TmpDir() {
  const char* tmp = std::getenv("TEST_TMPDIR");
  return tmp != nullptr ? tmp : "/tmp";
}

// Runs `command` through the shell; appends its stdout and stderr to `*output` and returns its
// exit code (-1 if it did not exit normally).
inline int Run(const std::string& command, std::string* output) {
  FILE* pipe = popen((command + " 2>&1").c_str(), "r");
  REQUIRE(pipe != nullptr);
  char buffer[4096];
  while (size_t n = fread(buffer, 1, sizeof(buffer), pipe)) output->append(buffer, n);
  int status = pclose(pipe);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// The whole of the file at `path` ("" if it cannot be read).
inline std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

}  // namespace zrpc::testing

#endif  // ZRPC_TESTS_CODEGEN_TOOL_RUN_H_
