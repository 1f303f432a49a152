// protoc-gen-zrpc as protoc runs it: golden output, clear errors for unsupported input, and
// header guards that keep the headers of distinct files apart.
#include <catch2/catch.hpp>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "tests/codegen/tool_run.h"

namespace {

using zrpc::testing::ReadFile;
using zrpc::testing::Run;
using zrpc::testing::Runfile;
using zrpc::testing::TmpDir;

struct ProtocResult {
  int exit_code;
  std::string output;
};

// Runs the system protoc with the plugin on `proto` (a workspace-relative path).
ProtocResult RunProtoc(const std::string& proto, const std::string& out_flag_prefix = "") {
  std::string command =
      "/usr/bin/protoc --plugin=protoc-gen-zrpc=" + Runfile("codegen/protoc-gen-zrpc") +
      " --zrpc_out=" + out_flag_prefix + TmpDir() + " -I" + Runfile("") + " " + Runfile(proto);
  std::string output;
  int exit_code = Run(command, &output);
  return {exit_code, output};
}

bool Contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

// protoc puts the file's name before the plugin's error; the plugin must not repeat it.
int Occurrences(const std::string& haystack, const std::string& needle) {
  int count = 0;
  for (size_t at = haystack.find(needle); at != std::string::npos;
       at = haystack.find(needle, at + 1)) {
    ++count;
  }
  return count;
}

}  // namespace

TEST_CASE("generated code matches the golden files", "[codegen][golden]") {
  // The protos tools/update-goldens regenerates them from (keep the two lists the same).
  for (const char* proto :
       {"proto/examples/greeter", "proto/examples/object_store", "proto/examples/numbers",
        "tests/codegen/file_options/generic_services", "tests/codegen/order/order"}) {
    const std::string stem = std::string(proto).substr(std::string(proto).rfind('/') + 1);
    for (const std::string& file : {stem + ".zrpc.h", stem + ".zrpc.cc"}) {
      INFO(file << " differs from tests/codegen/golden/" << file
                << ".golden; if the change is intended, run tools/update-goldens");
      const std::string generated =
          ReadFile(Runfile(std::string(proto) + file.substr(stem.size())));
      const std::string golden = ReadFile(Runfile("tests/codegen/golden/" + file + ".golden"));
      REQUIRE_FALSE(generated.empty());
      CHECK(generated == golden);
    }
  }
}

TEST_CASE(
    "a server-streaming rpc whose one request is marked bulk is refused, naming file, "
    "service and method",
    "[codegen][errors]") {
  ProtocResult result = RunProtoc("tests/codegen/bad/bulk_streaming.proto");
  INFO(result.output);
  CHECK(result.exit_code != 0);
  CHECK(Contains(result.output,
                 "tests/codegen/bad/bulk_streaming.proto: service Streamer, method Watch: "
                 "(zrpc.method) request_bulk on a server-streaming rpc: its one request carries "
                 "no bulk payload"));
  CHECK(Occurrences(result.output, "bulk_streaming.proto") == 1);
}

TEST_CASE("a package named with a C++ keyword is refused with the reason", "[codegen][errors]") {
  ProtocResult result = RunProtoc("tests/codegen/bad/keyword_package.proto");
  INFO(result.output);
  CHECK(result.exit_code != 0);
  CHECK(Contains(result.output, "'class' is a C++ keyword"));
}

TEST_CASE("a package inside the runtime's namespaces is refused with the reason",
          "[codegen][errors]") {
  ProtocResult result = RunProtoc("tests/codegen/bad/runtime_package.proto");
  INFO(result.output);
  CHECK(result.exit_code != 0);
  CHECK(Contains(result.output,
                 "tests/codegen/bad/runtime_package.proto: package zrpc.Channel: "
                 "the namespace zrpc::Channel belongs to zrpc's runtime"));
  CHECK(Occurrences(result.output, "runtime_package.proto") == 1);
}

TEST_CASE("a package named with an object-like macro of the runtime's headers is refused",
          "[codegen][errors]") {
  ProtocResult result = RunProtoc("tests/codegen/bad/macro_package.proto");
  INFO(result.output);
  CHECK(result.exit_code != 0);
  CHECK(Contains(result.output,
                 "tests/codegen/bad/macro_package.proto: package app.NAN: 'NAN' is a macro of "
                 "the headers generated C++ includes"));
  CHECK(Occurrences(result.output, "macro_package.proto") == 1);
}

TEST_CASE("a package-less type named like a global the generated code needs is refused",
          "[codegen][errors]") {
  ProtocResult result = RunProtoc("tests/codegen/bad/global_name.proto");
  INFO(result.output);
  CHECK(result.exit_code != 0);
  CHECK(Contains(result.output,
                 "tests/codegen/bad/global_name.proto: 'size_t' is declared "
                 "without a package"));
  CHECK(Occurrences(result.output, "global_name.proto") == 1);
}

TEST_CASE("plugin parameters are refused", "[codegen][errors]") {
  ProtocResult result = RunProtoc("proto/examples/greeter.proto", "fast=1:");
  INFO(result.output);
  CHECK(result.exit_code != 0);
  CHECK(Contains(result.output, "protoc-gen-zrpc takes no parameters, got 'fast=1'"));
}

TEST_CASE("a valid file still generates after the refusals above", "[codegen][errors]") {
  ProtocResult result = RunProtoc("proto/examples/greeter.proto");
  INFO(result.output);
  CHECK(result.exit_code == 0);
}

namespace {

// The first line of `header` that opens with `#ifndef `, without it ("" if none).
std::string GuardOf(const std::string& header) {
  const std::string directive = "#ifndef ";
  const size_t at = header.find("\n" + directive);
  if (at == std::string::npos) return "";
  const size_t start = at + 1 + directive.size();
  return header.substr(start, header.find('\n', start) - start);
}

}  // namespace

// Before: each byte other than a letter or digit became '_', and letters were upper-cased, so
// guard/a_b.proto and guard_a/b.proto (or guard/Ab.proto and guard/ab.proto) shared a guard and a
// program including both headers silently lost the second one's services.
TEST_CASE("files whose paths differ only in '_', '/' or case get distinct header guards",
          "[codegen][guard]") {
  const std::string dir = TmpDir() + "/guards";
  std::string out;
  REQUIRE(
      Run("rm -rf " + dir + " && mkdir -p " + dir + "/guard " + dir + "/guard_a " + dir + "/gen",
          &out) == 0);
  struct File {
    std::string path;     // below `dir`
    std::string package;  // each its own, so that all four compile in one unit
  };
  const std::vector<File> files = {{"guard/a_b.proto", "guard.one"},
                                   {"guard_a/b.proto", "guard.two"},
                                   {"guard/Ab.proto", "guard.three"},
                                   {"guard/ab.proto", "guard.four"}};
  std::string protos;
  std::string unit;
  for (const File& file : files) {
    std::ofstream proto(dir + "/" + file.path);
    proto << "syntax = \"proto3\";\npackage " << file.package << ";\n"
          << "message M {}\nservice S { rpc Get(M) returns (M); }\n";
    protos += " " + file.path;
    const std::string stem = file.path.substr(0, file.path.size() - 6);
    unit += "#include \"" + stem + ".zrpc.h\"\n";
  }
  // Each service's stub, named: a header dropped by a shared guard leaves its name undeclared.
  for (const File& file : files) {
    std::string qualified = "::" + file.package;
    for (size_t dot; (dot = qualified.find('.')) != std::string::npos;) {
      qualified.replace(dot, 1, "::");
    }
    unit += "static_assert(sizeof(" + qualified + "::S::Stub) > 0);\n";
  }
  std::string protoc_output;
  const int protoc =
      Run("cd " + dir + " && /usr/bin/protoc --plugin=protoc-gen-zrpc=" +
              Runfile("codegen/protoc-gen-zrpc") + " --cpp_out=gen --zrpc_out=gen" + protos,
          &protoc_output);
  INFO(protoc_output);
  REQUIRE(protoc == 0);

  std::set<std::string> guards;
  for (const File& file : files) {
    const std::string stem = file.path.substr(0, file.path.size() - 6);
    const std::string guard = GuardOf(ReadFile(dir + "/gen/" + stem + ".zrpc.h"));
    INFO(file.path << ": " << guard);
    CHECK(guard.rfind("ZRPC_GENERATED_", 0) == 0);
    CHECK(guards.insert(guard).second);
  }
  CHECK(guards.count("ZRPC_GENERATED_guard_2fa_5fb_2eproto_ZRPC_H_") == 1);

  {
    std::ofstream file(dir + "/unit.cc");
    file << unit;
  }
  std::string compiler_output;
  const int compiled = Run("g++ -std=c++17 -fsyntax-only -Wall -Wextra -Werror -I" + dir +
                               "/gen -I" + Runfile("") + " " + dir + "/unit.cc",
                           &compiler_output);
  INFO(unit);
  INFO(compiler_output.substr(0, 4000));
  CHECK(compiled == 0);
}
