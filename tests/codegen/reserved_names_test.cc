// The plugin's list of names zrpc's runtime declares in namespace zrpc (cpp_names.cc) against
// what the headers really declare: a package zrpc.X becomes namespace zrpc::X, which collides
// with a class, function or namespace X of the runtime. The list drifted once (Cancellation,
// Server and others were added to the headers and not to it): this test reads every header of
// rpc/ and transport/, finds what each declares directly in namespace zrpc, and checks the plugin
// refuses each name as a package part. The same for macros: the plugin's list of the macros the
// headers around generated code define (codegen/header_macros.inc), which it renames rpcs and
// services away from, against what codegen/list_header_macros.sh finds the headers define.
#include <catch2/catch.hpp>
#include <cctype>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "codegen/cpp_names.h"
#include "tests/codegen/tool_run.h"

namespace {

using zrpc::testing::ReadFile;
using zrpc::testing::Runfile;

// `text` without comments, string and character literals, and preprocessor lines (each replaced
// by a space, so tokens stay apart).
std::string StripNoise(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  bool line_start = true;
  for (size_t i = 0; i < text.size();) {
    const char c = text[i];
    if (line_start && c == '#') {  // a directive, with its continuation lines
      while (i < text.size() && !(text[i] == '\n' && text[i - 1] != '\\')) ++i;
      out += ' ';
      continue;
    }
    if (c == '/' && i + 1 < text.size() && text[i + 1] == '/') {
      while (i < text.size() && text[i] != '\n') ++i;
      out += ' ';
      continue;
    }
    if (c == '/' && i + 1 < text.size() && text[i + 1] == '*') {
      const size_t end = text.find("*/", i + 2);
      i = end == std::string::npos ? text.size() : end + 2;
      out += ' ';
      continue;
    }
    if (c == 'R' && i + 1 < text.size() && text[i + 1] == '"') {  // R"delim( ... )delim"
      const size_t open = text.find('(', i + 2);
      const std::string close = ")" + text.substr(i + 2, open - i - 2) + "\"";
      const size_t end = text.find(close, open);
      i = end == std::string::npos ? text.size() : end + close.size();
      out += ' ';
      continue;
    }
    if (c == '"' || (c == '\'' && !(i > 0 && std::isxdigit(static_cast<unsigned char>(
                                                 text[i - 1]))))) {  // not a digit separator
      for (++i; i < text.size() && text[i] != c; ++i) {
        if (text[i] == '\\') ++i;
      }
      ++i;
      out += ' ';
      continue;
    }
    if (c == '\n')
      line_start = true;
    else if (!std::isspace(static_cast<unsigned char>(c)))
      line_start = false;
    out += c;
    ++i;
  }
  return out;
}

std::vector<std::string> Tokens(const std::string& code) {
  std::vector<std::string> tokens;
  for (size_t i = 0; i < code.size();) {
    const unsigned char c = code[i];
    if (std::isspace(c)) {
      ++i;
    } else if (std::isalnum(c) || c == '_') {
      size_t j = i;
      while (j < code.size() &&
             (std::isalnum(static_cast<unsigned char>(code[j])) || code[j] == '_')) {
        ++j;
      }
      tokens.push_back(code.substr(i, j - i));
      i = j;
    } else if (c == ':' && i + 1 < code.size() && code[i + 1] == ':') {
      tokens.push_back("::");
      i += 2;
    } else {
      tokens.push_back(std::string(1, static_cast<char>(c)));
      ++i;
    }
  }
  return tokens;
}

// Compiles `dir`/unit.cc beside the generated code in `dir`/gen and the runtime's headers; the
// compiler's exit code, its output appended to `*output`.
int CompileUnit(const std::string& dir, std::string* output) {
  return zrpc::testing::Run("g++ -std=c++17 -fsyntax-only -Wall -Wextra -Werror -I" + dir +
                                "/gen -I" + Runfile("") + " " + dir + "/unit.cc",
                            output);
}

bool IsIdentifier(const std::string& t) {
  return !t.empty() && (std::isalpha(static_cast<unsigned char>(t[0])) || t[0] == '_');
}

// The names a header declares directly in namespace zrpc: classes, structs, enums, aliases,
// functions, variables and nested namespaces. Declarations inside classes, functions and other
// namespaces are skipped by tracking braces; `namespace zrpc::x {` declares x.
std::set<std::string> DeclaredInZrpc(const std::string& header) {
  const std::vector<std::string> t = Tokens(StripNoise(header));
  std::set<std::string> names;
  // One entry per open brace: whether it opened namespace zrpc itself.
  std::vector<bool> braces;
  auto in_zrpc = [&] { return !braces.empty() && braces.back(); };
  // Whether the current statement at zrpc scope has already given its name (the first
  // identifier before '(' or '=' or ';' or '{' of a declaration; later ones are parameters).
  bool named = false;
  int angle = 0;  // template argument depth in the current statement
  for (size_t i = 0; i < t.size(); ++i) {
    const std::string& tok = t[i];
    if (tok == "namespace") {
      // namespace a::b::c {  -- opens the innermost; records it when the scope is zrpc.
      std::vector<std::string> path;
      size_t j = i + 1;
      while (j < t.size() && t[j] != "{" && t[j] != "=") {
        if (IsIdentifier(t[j])) path.push_back(t[j]);
        ++j;
      }
      if (j < t.size() && t[j] == "{") {
        if (in_zrpc() && !path.empty()) names.insert(path[0]);
        if (braces.empty() || !braces.back()) {
          // From the global scope: zrpc::x records x and opens x (not zrpc).
          if (!path.empty() && path[0] == "zrpc" && path.size() > 1 && braces.empty()) {
            names.insert(path[1]);
          }
        }
        braces.push_back(braces.empty() && path.size() == 1 && path[0] == "zrpc");
        i = j;
        named = false;
        continue;
      }
    }
    if (tok == "{") {
      braces.push_back(false);
      continue;
    }
    if (tok == "}") {
      if (!braces.empty()) braces.pop_back();
      if (in_zrpc()) named = false;
      continue;
    }
    if (!in_zrpc()) continue;
    if (tok == ";") {
      named = false;
      angle = 0;
      continue;
    }
    if (tok == "<") ++angle;
    if (tok == ">" && angle > 0) --angle;
    if (named || angle > 0) continue;
    if (tok == "template") continue;
    if ((tok == "class" || tok == "struct" || tok == "union" || tok == "enum") &&
        i + 1 < t.size()) {
      size_t j = i + 1;
      if (t[j] == "class" || t[j] == "struct") ++j;  // enum class
      while (j < t.size() && (t[j] == "final" || t[j] == "ABSL_MUST_USE_RESULT")) ++j;
      if (j < t.size() && IsIdentifier(t[j])) names.insert(t[j]);
      named = true;
      continue;
    }
    if (tok == "using" && i + 2 < t.size() && IsIdentifier(t[i + 1]) && t[i + 2] == "=") {
      names.insert(t[i + 1]);
      named = true;
      continue;
    }
    if (tok == "operator") {
      named = true;
      continue;
    }
    // A function or variable: the identifier right before '(' (function), or before '=', '{'
    // or ';' (variable), not preceded by '::' (a qualified name declared elsewhere).
    if (i + 1 < t.size() && IsIdentifier(tok) &&
        (t[i + 1] == "(" || t[i + 1] == "=" || t[i + 1] == ";" || t[i + 1] == "[") &&
        !(i > 0 && t[i - 1] == "::") && tok.rfind("ABSL_", 0) != 0) {
      names.insert(tok);
      named = true;
    }
  }
  return names;
}

TEST_CASE("the scanner finds what a header declares directly in namespace zrpc") {
  const std::string header = R"(
    #include "x.h"
    #define MACRO(a) \
      int NotAName(a)
    namespace zrpc {
    // class Commented;
    class Alpha final : public Base { void Member(); int field_ = 1; };
    struct Beta;
    enum class Gamma : int { kA };
    template <typename T, int N = 3> class Delta;
    using Epsilon = std::function<void(int)>;
    absl::Status Zeta(const Alpha& a, int b = 2);
    inline constexpr int kEta = 4;
    std::ostream& operator<<(std::ostream& os, const Alpha& a);
    void Alpha::Member() {}
    const char* kTheta = "namespace Fake { class Iota; }";
    namespace internal { class Hidden; }
    }  // namespace zrpc
    namespace zrpc::transport { class Kappa; }
    namespace other { class Lambda; }
  )";
  CHECK(DeclaredInZrpc(header) == std::set<std::string>{"Alpha", "Beta", "Gamma", "Delta",
                                                        "Epsilon", "Zeta", "kEta", "kTheta",
                                                        "internal", "transport"});
}

// Every name the runtime's headers declare directly in namespace zrpc.
std::set<std::string> RuntimeNames() {
  const std::string list = ReadFile(Runfile("tests/codegen/runtime_headers.txt"));
  REQUIRE_FALSE(list.empty());
  std::set<std::string> all;
  int headers = 0;
  size_t start = 0;
  while (start < list.size()) {
    size_t end = list.find('\n', start);
    if (end == std::string::npos) end = list.size();
    const std::string path = list.substr(start, end - start);
    start = end + 1;
    if (path.empty()) continue;
    const std::string text = ReadFile(Runfile(path));
    INFO(path);
    REQUIRE_FALSE(text.empty());
    ++headers;
    for (const std::string& name : DeclaredInZrpc(text)) all.insert(name);
  }
  CHECK(headers >= 10);
  return all;
}

TEST_CASE("every name the runtime declares in namespace zrpc is refused as a package part") {
  const std::set<std::string> all = RuntimeNames();
  // Names every version of the runtime has declared: the scan must find them.
  for (const char* known : {"Channel", "Service", "ServerCall", "Server", "Cancellation",
                            "OutgoingBulk", "internal", "transport"}) {
    INFO(known);
    CHECK(all.count(known) == 1);
  }
  std::vector<std::string> missing;
  for (const std::string& name : all) {
    if (zrpc::codegen::ReservedPackageReason("zrpc." + name).empty()) missing.push_back(name);
  }
  INFO(
      "declared in namespace zrpc by the runtime, but accepted as package zrpc.<name>: add "
      "them to kRuntimeNames in codegen/cpp_names.cc");
  for (const std::string& name : missing) UNSCOPED_INFO(name);
  CHECK(missing.empty());
}

// The other side of the refusal: a package named after any of those names, anywhere but
// directly inside zrpc (where it is refused), is the application's own and must not collide with
// the runtime. Before: `package Server;` compiled alone, and the issue that added this test also
// found packages the generated code's own names broke. Every such package, at the top and
// inside another package, in one translation unit with every generated file, the runtime's
// public headers, unary and streaming rpcs.
TEST_CASE(
    "packages named after every public zrpc name generate code that compiles beside the "
    "runtime") {
  const std::set<std::string> names = RuntimeNames();
  const std::string dir = zrpc::testing::TmpDir() + "/packages";
  std::string out;
  REQUIRE(zrpc::testing::Run("rm -rf " + dir + " && mkdir -p " + dir + "/gen", &out) == 0);
  std::vector<std::string> protos;
  std::string unit =
      "#include \"rpc/channel.h\"\n#include \"rpc/server.h\"\n#include \"rpc/streaming.h\"\n";
  int index = 0;
  for (const std::string& name : names) {
    for (const std::string& package : {name, "app.zrpc." + name}) {
      const std::string file = "p" + std::to_string(index++) + ".proto";
      std::ofstream proto(dir + "/" + file);
      proto << "syntax = \"proto3\";\npackage " << package << ";\n"
            << "message Msg { int32 value = 1; }\n"
            << "service Svc {\n"
            << "  rpc Call(Msg) returns (Msg);\n"
            << "  rpc Watch(Msg) returns (stream Msg);\n"
            << "  rpc Send(stream Msg) returns (Msg);\n"
            << "  rpc Chat(stream Msg) returns (stream Msg);\n"
            << "}\n";
      protos.push_back(file);
      const std::string stem = file.substr(0, file.size() - 6);
      unit += "#include \"" + stem + ".zrpc.cc\"\n";
    }
  }
  std::string command = "cd " + dir + " && /usr/bin/protoc --plugin=protoc-gen-zrpc=" +
                        Runfile("codegen/protoc-gen-zrpc") + " --cpp_out=gen --zrpc_out=gen";
  for (const std::string& proto : protos) command += " " + proto;
  std::string protoc_output;
  const int protoc = zrpc::testing::Run(command, &protoc_output);
  INFO(protoc_output);
  REQUIRE(protoc == 0);
  {
    std::ofstream file(dir + "/unit.cc");
    file << unit;
  }
  std::string compiler_output;
  const int compiled = CompileUnit(dir, &compiler_output);
  INFO(compiler_output.substr(0, 4000));
  CHECK(compiled == 0);
  CHECK(protos.size() == 2 * names.size());
}

}  // namespace

namespace {

struct HeaderMacro {
  std::string name;
  bool object_like;
};

// The macros codegen/list_header_macros.sh finds in the headers around generated code, now.
std::vector<HeaderMacro> MacrosNow() {
  const std::string scratch = zrpc::testing::TmpDir() + "/macros";
  std::string out;
  REQUIRE(zrpc::testing::Run("rm -rf " + scratch + " && mkdir -p " + scratch, &out) == 0);
  std::string listed;
  const int status = zrpc::testing::Run(
      Runfile("codegen/list_header_macros.sh") + " " + Runfile("") + " " + scratch, &listed);
  INFO(listed.substr(0, 4000));
  REQUIRE(status == 0);
  std::vector<HeaderMacro> macros;
  size_t start = 0;
  while (start < listed.size()) {
    size_t end = listed.find('\n', start);
    if (end == std::string::npos) end = listed.size();
    const std::string line = listed.substr(start, end - start);
    start = end + 1;
    const size_t space = line.find(' ');
    INFO(line);
    REQUIRE(space != std::string::npos);
    const std::string kind = line.substr(0, space);
    REQUIRE((kind == "object" || kind == "function"));
    macros.push_back({line.substr(space + 1), kind == "object"});
  }
  return macros;
}

}  // namespace

// An rpc or service named like a macro the headers around generated code define was expanded in
// that code, which then did not compile (rpc EPIPE, NAN, alloca). The generator renames them from
// a list (codegen/header_macros.inc); this checks the list against what the headers define today.
TEST_CASE(
    "every macro the headers around generated code define is renamed, and refused as a "
    "package name when object-like") {
  const std::vector<HeaderMacro> macros = MacrosNow();
  CHECK(macros.size() > 500);
  std::set<std::string> object_like, function_like;
  for (const HeaderMacro& macro : macros) {
    (macro.object_like ? object_like : function_like).insert(macro.name);
  }
  // Some from each source: glibc through protobuf (EPIPE, alloca), <cmath> through the runtime's
  // Abseil (NAN), Linux's headers through the runtime (FUTEX_WAIT), Abseil, protobuf, zrpc.
  for (const char* name : {"EPIPE", "NAN", "INFINITY", "errno", "EOF", "FUTEX_WAIT", "SYS_futex",
                           "ABSL_CACHELINE_SIZE", "GOOGLE_PROTOBUF_VERSION"}) {
    INFO(name);
    CHECK(object_like.count(name) == 1);
  }
  for (const char* name : {"alloca", "assert", "offsetof", "timeradd", "ABSL_PREDICT_TRUE",
                           "GOOGLE_CHECK", "ZRPC_LOG"}) {
    INFO(name);
    CHECK(function_like.count(name) == 1);
  }
  std::vector<std::string> missing;
  for (const HeaderMacro& macro : macros) {
    const bool renamed = zrpc::codegen::CppIdentifier(macro.name) != macro.name;
    const bool refused = zrpc::codegen::ReservedPackageReason("app." + macro.name) != "";
    if (!renamed || (macro.object_like && !refused)) missing.push_back(macro.name);
  }
  INFO(
      "defined by the headers around generated code, but not renamed as an rpc or service name "
      "(or, object-like, not refused as a package name): run tools/update-header-macros");
  for (const std::string& name : missing) UNSCOPED_INFO(name);
  CHECK(missing.empty());
  // zrpc's own include guards go by their form, not the list.
  for (const char* guard : {"ZRPC_RPC_SERVER_H_", "ZRPC_RPC_IMPL_NOT_YET_WRITTEN_H_",
                            "ZRPC_GENERATED_a_2fb_2eproto_ZRPC_H_"}) {
    INFO(guard);
    CHECK(zrpc::codegen::CppIdentifier(guard) == std::string(guard) + "_");
    CHECK(zrpc::codegen::ReservedPackageReason(guard) != "");
  }
  CHECK(zrpc::codegen::CppIdentifier("ZRPC_Ping") == "ZRPC_Ping");
}

// The renaming at work: rpcs named after EPIPE, NAN, alloca and a sample of the other macros
// found (in each of the four kinds, in turn) and services named after some, compiled with
// -Werror after rpc/zrpc.h, where each macro is defined. A handler and stub calls use the
// renamed names.
TEST_CASE(
    "rpcs and services named like those macros generate code that compiles beside the "
    "runtime") {
  const std::vector<HeaderMacro> macros = MacrosNow();
  const std::string dir = zrpc::testing::TmpDir() + "/macro_names";
  std::string out;
  REQUIRE(zrpc::testing::Run("rm -rf " + dir + " && mkdir -p " + dir + "/gen", &out) == 0);
  {
    std::ofstream proto(dir + "/rpcs.proto");
    proto << "syntax = \"proto3\";\npackage app.macros;\nmessage Msg { int32 value = 1; }\n"
          << "service Svc {\n";
    // EPIPE, NAN and alloca unary (the code below calls and serves them), then every fifth
    // macro of the list, of each kind in turn. (All of them compile too, in four times the time;
    // the test above checks each is renamed.)
    const std::set<std::string> unary = {"EPIPE", "NAN", "alloca"};
    static const char* const kShapes[] = {"(Msg) returns (Msg)", "(Msg) returns (stream Msg)",
                                          "(stream Msg) returns (Msg)",
                                          "(stream Msg) returns (stream Msg)"};
    for (const std::string& name : unary) proto << "  rpc " << name << kShapes[0] << ";\n";
    for (size_t i = 0; i < macros.size(); i += 5) {
      if (unary.count(macros[i].name) > 0) continue;
      proto << "  rpc " << macros[i].name << kShapes[(i / 5) % 4] << ";\n";
    }
    proto << "}\n";
    for (const char* service : {"EPIPE", "NAN", "alloca", "errno", "M_PI", "FUTEX_WAIT",
                                "GOOGLE_PROTOBUF_VERSION", "ZRPC_LOG", "ZRPC_RPC_SERVER_H_"}) {
      proto << "service " << service << " { rpc EPIPE(Msg) returns (Msg); }\n";
    }
  }
  {
    // A function-like macro is no harm as a namespace: such a package is accepted.
    std::ofstream proto(dir + "/function_like.proto");
    proto << "syntax = \"proto3\";\npackage app.alloca.timeradd;\n"
          << "message Msg {}\nservice Svc { rpc alloca(Msg) returns (Msg); }\n";
  }
  std::string protoc_output;
  const int protoc = zrpc::testing::Run(
      "cd " + dir +
          " && /usr/bin/protoc --plugin=protoc-gen-zrpc=" + Runfile("codegen/protoc-gen-zrpc") +
          " --cpp_out=gen --zrpc_out=gen rpcs.proto " + "function_like.proto",
      &protoc_output);
  INFO(protoc_output.substr(0, 4000));
  REQUIRE(protoc == 0);
  {
    std::ofstream unit(dir + "/unit.cc");
    unit << "#include \"rpc/zrpc.h\"\n#include \"transport/log.h\"\n"
         << "#include \"rpcs.zrpc.cc\"\n#include \"function_like.zrpc.cc\"\n"
         << R"(
namespace {
class Impl : public app::macros::Svc::Service {
 public:
  // rpc EPIPE's blocking handler, renamed.
  absl::Status EPIPE_(zrpc::ServerContext&, const app::macros::Msg&, app::macros::Msg*) override {
    return absl::OkStatus();
  }
};
}  // namespace

void Use(zrpc::Channel* channel) {
  Impl impl;
  app::macros::Svc::Stub stub(channel);
  app::macros::Msg msg;
  (void)stub.EPIPE_(msg, &msg);
  stub.AsyncEPIPE_(msg, &msg, zrpc::CallOptions(), [](absl::Status) {});
  (void)&app::macros::Svc::Service::NAN_;
  (void)&app::macros::Svc::Stub::alloca_;
  app::macros::NAN_::Stub nan(channel);
  app::macros::alloca_::Stub alloca_stub(channel);
  app::macros::ZRPC_RPC_SERVER_H__::Stub guard(channel);
  app::alloca::timeradd::Svc::Stub function_like(channel);
  (void)nan.EPIPE_(msg, &msg);
}
)";
  }
  std::string compiler_output;
  const int compiled = CompileUnit(dir, &compiler_output);
  INFO(compiler_output.substr(0, 4000));
  CHECK(compiled == 0);
}
