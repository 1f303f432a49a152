// rpc/'s public headers, as an application meets them: each compiles on its own (g++, the
// project's flags), and none brings a verbs or librdmacm header (<infiniband/...>, <rdma/...>)
// into the code that includes it: the options users set come from verbs-free headers
// (rpc/options.h, transport/options.h). The list of headers is rpc/'s top level as the build sees
// it (//rpc:public_headers, a glob), so a header added there is checked without editing this.
#include <algorithm>
#include <catch2/catch.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "tests/codegen/tool_run.h"

namespace {

using zrpc::testing::ReadFile;
using zrpc::testing::Run;
using zrpc::testing::Runfile;
using zrpc::testing::TmpDir;

// rpc/*.h, one "rpc/x.h" a line, as the genrule beside this test wrote them.
std::vector<std::string> PublicHeaders() {
  std::vector<std::string> headers;
  std::istringstream in(ReadFile(Runfile("tests/rpc/public_headers.txt")));
  for (std::string line; std::getline(in, line);) {
    if (!line.empty()) headers.push_back(line);
  }
  return headers;
}

// A translation unit that includes `header` and nothing else.
std::string UnitFor(const std::string& header) {
  std::string name = header;
  for (char& c : name) {
    if (c == '/' || c == '.') c = '_';
  }
  const std::string path = TmpDir() + "/" + name + ".cc";
  std::string output;
  REQUIRE(Run("printf '#include \"%s\"\\n' '" + header + "' > " + path, &output) == 0);
  return path;
}

const std::string& Compiler() {
  static const std::string gxx = "g++ -std=c++17 -Wall -Wextra -Werror -I" + Runfile("") + " ";
  return gxx;
}

}  // namespace

TEST_CASE("rpc/'s top level is the public API: the headers an application includes",
          "[public_headers]") {
  const std::vector<std::string> headers = PublicHeaders();
  for (const char* expected : {"rpc/channel.h", "rpc/server.h", "rpc/options.h", "rpc/zrpc.h",
                               "rpc/generated_api.h", "rpc/streaming.h", "rpc/bulk.h"}) {
    INFO(expected);
    CHECK(std::find(headers.begin(), headers.end(), expected) != headers.end());
  }
  for (const std::string& header : headers) {
    INFO(header << " is at rpc/'s top level: only public headers go there");
    CHECK(header.find('/', 4) == std::string::npos);
  }
}

TEST_CASE("each public header compiles on its own", "[public_headers]") {
  for (const std::string& header : PublicHeaders()) {
    std::string output;
    const int status = Run(Compiler() + "-fsyntax-only " + UnitFor(header), &output);
    INFO(header << ":\n" << output);
    CHECK(status == 0);
  }
}

TEST_CASE("no public header includes a verbs or librdmacm header", "[public_headers]") {
  for (const std::string& header : PublicHeaders()) {
    // -H lists every header the preprocessor opens, one a line, on stderr.
    std::string output;
    const int status = Run(Compiler() + "-E -H -o /dev/null " + UnitFor(header), &output);
    REQUIRE(status == 0);
    std::istringstream lines(output);
    int opened = 0;
    for (std::string line; std::getline(lines, line);) {
      if (line.empty() || line[0] != '.') continue;
      ++opened;
      INFO(header << " brings in " << line);
      CHECK(line.find("/infiniband/") == std::string::npos);
      CHECK(line.find("/rdma/") == std::string::npos);
    }
    INFO(header);
    CHECK(opened > 0);  // -H did list something: the check above saw the includes
  }
  // The figure behind it: macros an application inherits from the umbrella header, beside
  // protobuf's own message header (each such macro is a name an rpc in a .proto cannot take).
  std::string zrpc_macros, protobuf_macros;
  REQUIRE(Run(Compiler() + "-E -dM " + UnitFor("rpc/zrpc.h") + " | wc -l", &zrpc_macros) == 0);
  REQUIRE(Run(Compiler() + "-E -dM " + UnitFor("google/protobuf/message_lite.h") + " | wc -l",
              &protobuf_macros) == 0);
  WARN("macros defined after #include \"rpc/zrpc.h\": "
       << std::stol(zrpc_macros)
       << "; after <google/protobuf/message_lite.h>: " << std::stol(protobuf_macros));
}
