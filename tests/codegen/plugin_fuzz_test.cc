// Fuzzing protoc-gen-zrpc's input: random .proto files, built the way protoc builds them, fed to
// the generator. Two properties:
//
//  1. In process, thousands of files: the generator never crashes, and either generates both
//     files or refuses with a message (protoc puts the file's name before it). It refuses
//     exactly the input it documents as unsupported (keyword packages, a bulk payload on a
//     streaming rpc's single message). Some files are also mutated byte by byte (what a
//     corrupt request from protoc could hold), to reach odd descriptors.
//  2. Through protoc and g++, a sample of the generated files: the generated C++ compiles, with
//     protobuf's .pb.h it includes, with the project's warnings as errors. Names come from a
//     pool of C++ keywords, names the generated code uses itself (Stub, Dispatch, request, std,
//     zrpc, ...) and random ones; service names are also built like the names protobuf's C++
//     declares (Outer_Inner, Foo_Stub, E_IsValid, ...), and the file options that change those
//     (cc_generic_services, optimize_for) vary, so collisions with either are what this finds.
//     Every name ProtobufCppNames lists must appear in the .pb.h protoc wrote.
//
// Deterministic: the seed is fixed (ZRPC_FUZZ_SEED overrides it, ZRPC_FUZZ_ITERATIONS the count),
// so a failure reproduces; the failing file is printed as a .proto-like descriptor dump.
#include <google/protobuf/compiler/code_generator.h>
#include <google/protobuf/descriptor.h>
#include <google/protobuf/descriptor.pb.h>
#include <google/protobuf/empty.pb.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>
#include <google/protobuf/stubs/logging.h>
#include <sys/wait.h>

#include <catch2/catch.hpp>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "codegen/cpp_names.h"
#include "codegen/zrpc_generator.h"
#include "proto/zrpc/options.pb.h"
#include "tests/codegen/tool_run.h"

namespace {

using google::protobuf::DescriptorPool;
using google::protobuf::FileDescriptor;
using google::protobuf::FileDescriptorProto;
using google::protobuf::FileDescriptorSet;
using zrpc::testing::ReadFile;
using zrpc::testing::Run;
using zrpc::testing::Runfile;

constexpr char kFileName[] = "fuzz/input.proto";
constexpr char kEmptyProto[] = "google/protobuf/empty.proto";
constexpr char kOptionsProto[] = "proto/zrpc/options.proto";

// Names that have collided, or could collide, with something in generated C++.
const std::vector<std::string> kNamePool = {
    "Foo", "Bar", "Get", "Put", "Echo", "AsyncEcho", "AsyncFoo", "Foo_", "AsyncFoo_", "Stub",
    "Service", "Service_", "Dispatch", "service_info", "channel_", "request", "response", "options",
    "done", "context", "call", "method_index", "request_bulk", "response_bulk", "class", "delete",
    "namespace", "new", "int", "default", "register", "template", "this", "operator", "auto",
    "friend", "final", "override", "std", "zrpc", "absl", "google", "internal", "kFooInfo",
    "kFooMethods", "kInfo", "kMethods", "Info", "Methods", "x1", "UPPER", "Empty", "Channel",
    "ServerCall", "ServerContext", "MethodInfo", "ServiceInfo", "CallOptions", "OutgoingBulk",
    "IncomingBulk", "DoneCallback", "Status", "string", "move", "size_t", "uint8_t", "int64_t",
    "to_string", "NULL", "nullptr", "main", "errno", "assert", "EOF", "TRUE", "unix", "linux",
    // Macros of the headers around generated code (codegen/header_macros.inc).
    "EPIPE", "NAN", "alloca", "M_PI", "FUTEX_WAIT", "ABSL_CACHELINE_SIZE", "ZRPC_RPC_SERVER_H_",
    "_Foo", "__bar", "index", "status", "AsyncService", "PendingCall", "pending",
    // protobuf's globals for a package-less fuzz/input.proto.
    "TableStruct_fuzz_2finput_2eproto", "descriptor_table_fuzz_2finput_2eproto"};

// How protobuf's C++ builds names at namespace scope from a class or enum name X (prefix, suffix):
// a service named like one of them takes a name protobuf may declare.
const std::vector<std::pair<std::string, std::string>> kProtobufPatterns = {
    {"", ""},
    {"", "_"},
    {"", "_Stub"},
    {"", "DefaultTypeInternal"},
    {"", "_IsValid"},
    {"", "_Name"},
    {"", "_Parse"},
    {"", "_descriptor"},
    {"", "_MIN"},
    {"", "_MAX"},
    {"", "_ARRAYSIZE"},
    {"", "_MEntry_DoNotUse"},
    {"k", "FieldNumber"},
    {"_", "_default_instance_"}};

// Package parts; the keywords and object-like macros (EOF, NAN) among them must be refused.
const std::vector<std::string> kPackagePool = {
    "a",       "b",   "pkg",   "v1",     "zrpc",        "examples", "Stub",
    "Service", "x1",  "class", "absl",   "internal",    "std",      "Channel",
    "google",  "EOF", "kInfo", "method", "PendingCall", "NAN"};

// Comment lines, including ones that end in a backslash (a line continuation in C++).
const std::vector<std::string> kCommentPool = {" plain words",
                                               " trailing backslash \\",
                                               "\\",
                                               " two \\\\",
                                               " ends in trigraph ??"
                                               "/",
                                               " $dollar$ signs $",
                                               " */ /* ",
                                               " \ttab and unicode \xc3\xa9",
                                               "",
                                               " // nested",
                                               " carriage\rreturn",
                                               " form\ffeed"};

// protoc reports a file the pool refuses; here refusals are expected and counted, not printed.
class QuietErrors : public DescriptorPool::ErrorCollector {
 public:
  void AddError(const std::string&, const std::string&, const google::protobuf::Message*,
                ErrorLocation, const std::string&) override {}
};

class InMemoryContext : public google::protobuf::compiler::GeneratorContext {
 public:
  google::protobuf::io::ZeroCopyOutputStream* Open(const std::string& filename) override {
    return new google::protobuf::io::StringOutputStream(&files[filename]);
  }
  std::map<std::string, std::string> files;
};

class RandomProtos {
 public:
  explicit RandomProtos(uint64_t seed) : rng_(seed) {}

  bool Chance(double p) { return std::bernoulli_distribution(p)(rng_); }
  size_t Below(size_t n) { return std::uniform_int_distribution<size_t>(0, n - 1)(rng_); }

  std::string Identifier() {
    if (Chance(0.75)) return kNamePool[Below(kNamePool.size())];
    static const char kFirst[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ_";
    static const char kRest[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ_0123456789";
    std::string name(1, kFirst[Below(sizeof(kFirst) - 1)]);
    for (size_t n = Below(9); n > 0; --n) name += kRest[Below(sizeof(kRest) - 1)];
    return name;
  }

  // An identifier not yet in `taken` (which it joins).
  std::string Fresh(std::set<std::string>& taken) {
    for (;;) {
      std::string name = Identifier();
      if (taken.insert(name).second) return name;
    }
  }

  FileDescriptorProto File() {
    using google::protobuf::FieldDescriptorProto;
    FileDescriptorProto file;
    file.set_name(kFileName);
    file.set_syntax(Chance(0.8) ? "proto3" : "proto2");
    SetFileOptions(file);
    std::string package;
    for (size_t n = Below(4); n > 0; --n) {
      package += (package.empty() ? "" : ".") + kPackagePool[Below(kPackagePool.size())];
    }
    file.set_package(package);
    const std::string prefix = package.empty() ? "." : "." + package + ".";

    std::set<std::string> top;  // one scope for messages, enums, their values, extensions, services
    std::vector<std::string> types;
    std::vector<std::string> cpp_bases;  // names protobuf's C++ builds others from
    for (size_t n = 1 + Below(4); n > 0; --n) {
      auto* message = file.add_message_type();
      message->set_name(MessageName(top));
      types.push_back(prefix + message->name());
      cpp_bases.push_back(message->name());
      std::set<std::string> inner = {message->name(), "f", "m", "MEntry"};  // the message's scope
      if (Chance(0.3)) {
        auto* nested = message->add_nested_type();
        nested->set_name(MessageName(inner));
        types.push_back(prefix + message->name() + "." + nested->name());
        cpp_bases.push_back(message->name() + "_" + nested->name());
      }
      if (Chance(0.2)) {  // Outer_E, with values Outer_E_V at namespace scope
        auto* enumeration = message->add_enum_type();
        enumeration->set_name(MessageName(inner));
        auto* value = enumeration->add_value();
        value->set_name(MessageName(inner));
        value->set_number(0);
        cpp_bases.push_back(message->name() + "_" + enumeration->name());
        cpp_bases.push_back(cpp_bases.back() + "_" + value->name());
      }
      if (Chance(0.5)) {
        AddField(*message, "f", 1, FieldDescriptorProto::TYPE_BYTES);
      }
      if (Chance(0.2)) {  // map<string, int32> m: protobuf's class Outer_MEntry_DoNotUse
        auto* entry = message->add_nested_type();
        entry->set_name("MEntry");
        entry->mutable_options()->set_map_entry(true);
        AddField(*entry, "key", 1, FieldDescriptorProto::TYPE_STRING);
        AddField(*entry, "value", 2, FieldDescriptorProto::TYPE_INT32);
        auto* map = AddField(*message, "m", 2, FieldDescriptorProto::TYPE_MESSAGE);
        map->set_type_name(prefix + message->name() + ".MEntry");
        map->set_label(FieldDescriptorProto::LABEL_REPEATED);
      }
    }
    if (Chance(0.3)) {  // enums share the package scope, values included
      auto* enumeration = file.add_enum_type();
      enumeration->set_name(MessageName(top));
      auto* value = enumeration->add_value();
      value->set_name(MessageName(top));
      value->set_number(0);
      cpp_bases.push_back(enumeration->name());
    }
    if (file.syntax() == "proto2" && Chance(0.3)) {  // a top-level extension of the first message
      file.mutable_message_type(0)->add_extension_range()->set_start(100);
      file.mutable_message_type(0)->mutable_extension_range(0)->set_end(200);
      auto* extension = file.add_extension();
      extension->set_name(MessageName(top));
      extension->set_number(100);
      extension->set_type(FieldDescriptorProto::TYPE_INT32);
      extension->set_label(FieldDescriptorProto::LABEL_OPTIONAL);
      extension->set_extendee(prefix + file.message_type(0).name());
      cpp_bases.push_back(extension->name());
    }
    if (Chance(0.3)) {
      file.add_dependency(kEmptyProto);
      types.push_back(".google.protobuf.Empty");
    }
    const bool protobuf_services =
        file.options().cc_generic_services() &&
        file.options().optimize_for() != google::protobuf::FileOptions::LITE_RUNTIME;
    auto fresh = [this](std::set<std::string>& taken) { return Fresh(taken); };
    bool bulk = false;
    for (size_t s = Below(4); s > 0; --s) {
      auto* service = file.add_service();
      service->set_name(
          Spellable(top, !protobuf_services, false, [&](std::set<std::string>& taken) {
            return Chance(0.3) ? ProtobufLikeName(taken, cpp_bases) : Fresh(taken);
          }));
      cpp_bases.push_back(service->name());
      std::set<std::string> methods;
      for (size_t m = Below(5); m > 0; --m) {
        auto* method = service->add_method();
        method->set_name(Spellable(methods, !protobuf_services, false, fresh));
        method->set_input_type(types[Below(types.size())]);
        method->set_output_type(types[Below(types.size())]);
        if (Chance(0.15)) method->set_client_streaming(true);
        if (Chance(0.15)) method->set_server_streaming(true);
        if (Chance(0.3)) {
          auto* options = method->mutable_options()->MutableExtension(zrpc::method);
          options->set_request_bulk(Chance(0.5));
          options->set_response_bulk(Chance(0.5));
          bulk = true;
        }
      }
    }
    if (bulk) file.add_dependency(kOptionsProto);
    AddComments(file);
    return file;
  }

 private:
  // The options that change what protobuf's C++ declares. protoc refuses generic services in a
  // LITE_RUNTIME file, so some of those files do not build.
  void SetFileOptions(FileDescriptorProto& file) {
    auto* options = file.mutable_options();
    if (Chance(0.4)) options->set_cc_generic_services(Chance(0.8));
    if (Chance(0.5)) {
      static const google::protobuf::FileOptions::OptimizeMode kModes[] = {
          google::protobuf::FileOptions::SPEED, google::protobuf::FileOptions::CODE_SIZE,
          google::protobuf::FileOptions::LITE_RUNTIME};
      options->set_optimize_for(kModes[Below(3)]);
    }
  }

  static google::protobuf::FieldDescriptorProto* AddField(
      google::protobuf::DescriptorProto& message, const std::string& name, int number,
      google::protobuf::FieldDescriptorProto::Type type) {
    auto* field = message.add_field();
    field->set_name(name);
    field->set_number(number);
    field->set_type(type);
    field->set_label(google::protobuf::FieldDescriptorProto::LABEL_OPTIONAL);
    return field;
  }

  // A name not yet in `top` (which it joins), built from one of `bases` the way protobuf's C++
  // builds its names, so that it may be one protobuf declares too.
  std::string ProtobufLikeName(std::set<std::string>& top, const std::vector<std::string>& bases) {
    for (;;) {
      const auto& [before, after] = kProtobufPatterns[Below(kProtobufPatterns.size())];
      std::string name = before + bases[Below(bases.size())] + after;
      if (top.insert(name).second) return name;
    }
  }

  // A name `pick` adds to `taken`. Where protobuf's C++ spells it, that code breaks on macros
  // (message EOF; message NAN, which zrpc's code names after the runtime's headers), and where it
  // spells the name unchanged (a service or rpc of a file with generic services) on keywords too,
  // so those stay out: what is tested is what zrpc generates. `zrpc_only`: only zrpc's code
  // spells the name (a service or rpc elsewhere), which renames keywords and macros itself.
  template <typename Pick>
  std::string Spellable(std::set<std::string>& taken, bool zrpc_only, bool keywords_ok, Pick pick) {
    for (;;) {
      std::string name = pick(taken);
      const bool macro = zrpc::codegen::IsStandardMacro(name) || zrpc::codegen::IsHeaderMacro(name);
      if (zrpc_only || (!macro && (keywords_ok || !zrpc::codegen::IsCppKeyword(name)))) {
        return name;
      }
      taken.erase(name);
    }
  }

  std::string MessageName(std::set<std::string>& taken) {
    return Spellable(taken, false, true, [this](std::set<std::string>& t) { return Fresh(t); });
  }

  void AddComments(FileDescriptorProto& file) {
    auto* info = file.mutable_source_code_info();
    auto comment = [&](std::vector<int> path) {
      if (!Chance(0.5)) return;
      auto* location = info->add_location();
      for (int p : path) location->add_path(p);
      for (int span : {1, 0, 1}) location->add_span(span);
      std::string text;
      for (size_t n = 1 + Below(3); n > 0; --n)
        text += kCommentPool[Below(kCommentPool.size())] + "\n";
      location->set_leading_comments(text);
    };
    for (int s = 0; s < file.service_size(); ++s) {
      comment({FileDescriptorProto::kServiceFieldNumber, s});
      for (int m = 0; m < file.service(s).method_size(); ++m) {
        comment({FileDescriptorProto::kServiceFieldNumber, s,
                 google::protobuf::ServiceDescriptorProto::kMethodFieldNumber, m});
      }
    }
  }

  std::mt19937_64 rng_;
};

uint64_t EnvOr(const char* name, uint64_t fallback) {
  const char* value = std::getenv(name);
  return value != nullptr ? std::strtoull(value, nullptr, 10) : fallback;
}

// A pool with what protoc would have loaded before the fuzzed file: its possible imports.
std::unique_ptr<DescriptorPool> PoolWithImports() {
  auto pool = std::make_unique<DescriptorPool>();
  for (const FileDescriptor* file :
       {google::protobuf::FileDescriptorProto::descriptor()->file(),
        google::protobuf::Empty::descriptor()->file(), zrpc::MethodOptions::descriptor()->file()}) {
    FileDescriptorProto proto;
    file->CopyTo(&proto);
    REQUIRE(pool->BuildFile(proto) != nullptr);
  }
  return pool;
}

// Input the generator documents as refused (codegen/cpp_names.h says why): a reserved package,
// or a package-less type that takes a global name generated code needs. The rules themselves are
// checked by the compile test below: input they let through must compile.
bool RefusedPackage(const FileDescriptorProto& file) {
  if (!zrpc::codegen::ReservedPackageReason(file.package()).empty()) return true;
  if (!file.package().empty()) return false;
  for (const auto& message : file.message_type()) {
    if (zrpc::codegen::IsReservedGlobalName(message.name())) return true;
  }
  for (const auto& service : file.service()) {
    if (zrpc::codegen::IsReservedGlobalName(service.name())) return true;
  }
  for (const auto& enumeration : file.enum_type()) {
    if (zrpc::codegen::IsReservedGlobalName(enumeration.name())) return true;
  }
  return false;
}

// A streaming rpc marked bulk on its single message: a server-streaming rpc's one request or a
// client-streaming rpc's one response carries no payload (rpc/streaming.h, "Bulk payloads");
// a stream's messages may.
bool BulkStreaming(const FileDescriptorProto& file) {
  for (const auto& service : file.service()) {
    for (const auto& method : service.method()) {
      const zrpc::MethodOptions& options = method.options().GetExtension(zrpc::method);
      const bool client = method.client_streaming();
      const bool server = method.server_streaming();
      if ((options.request_bulk() && server && !client) ||
          (options.response_bulk() && client && !server)) {
        return true;
      }
    }
  }
  return false;
}

struct Outcome {
  bool built = false;  // the pool accepted the file (protoc would have)
  bool generated = false;
  std::string error;
  std::map<std::string, std::string> files;
};

Outcome Generate(const FileDescriptorProto& proto) {
  Outcome outcome;
  std::unique_ptr<DescriptorPool> pool = PoolWithImports();
  QuietErrors quiet;
  const FileDescriptor* file = pool->BuildFileCollectingErrors(proto, &quiet);
  if (file == nullptr) return outcome;
  outcome.built = true;
  zrpc::codegen::ZrpcGenerator generator;
  InMemoryContext context;
  outcome.generated = generator.Generate(file, "", &context, &outcome.error);
  outcome.files = std::move(context.files);
  return outcome;
}

// The generated text is well formed enough to be worth compiling: balanced braces and parens
// outside comments and string literals, and every rpc's full name in the method table.
void CheckShape(const FileDescriptorProto& proto, const Outcome& outcome) {
  REQUIRE(outcome.files.size() == 2);
  const std::string& header = outcome.files.at("fuzz/input.zrpc.h");
  const std::string& source = outcome.files.at("fuzz/input.zrpc.cc");
  for (const std::string* text : {&header, &source}) {
    int braces = 0, parens = 0;
    bool comment = false, quoted = false;
    for (size_t i = 0; i < text->size(); ++i) {
      char c = (*text)[i];
      if (comment) {
        comment = c != '\n';
      } else if (quoted) {
        if (c == '\\')
          ++i;
        else if (c == '"')
          quoted = false;
      } else if (c == '/' && i + 1 < text->size() && (*text)[i + 1] == '/') {
        comment = true;
      } else if (c == '"') {
        quoted = true;
      } else {
        braces += (c == '{') - (c == '}');
        parens += (c == '(') - (c == ')');
      }
    }
    CHECK(braces == 0);
    CHECK(parens == 0);
  }
  const std::string prefix = proto.package().empty() ? "" : proto.package() + ".";
  for (const auto& service : proto.service()) {
    for (const auto& method : service.method()) {
      CHECK(source.find("\"" + prefix + service.name() + "/" + method.name() + "\"") !=
            std::string::npos);
    }
  }
}

// `word` occurs in `text` as a whole C++ identifier.
bool ContainsWord(const std::string& text, const std::string& word) {
  auto identifier_char = [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_';
  };
  for (size_t at = text.find(word); at != std::string::npos; at = text.find(word, at + 1)) {
    const size_t end = at + word.size();
    if ((at == 0 || !identifier_char(text[at - 1])) &&
        (end == text.size() || !identifier_char(text[end]))) {
      return true;
    }
  }
  return false;
}

}  // namespace

TEST_CASE("random .proto files: the generator generates, or refuses with a reason",
          "[codegen][fuzz]") {
  const uint64_t seed = EnvOr("ZRPC_FUZZ_SEED", 20261121);
  const uint64_t iterations = EnvOr("ZRPC_FUZZ_ITERATIONS", 3000);
  RandomProtos random(seed);
  google::protobuf::LogSilencer silence;  // mutated strings are often invalid UTF-8
  int built = 0, generated = 0, refused = 0, mutated_built = 0;
  for (uint64_t i = 0; i < iterations; ++i) {
    FileDescriptorProto proto = random.File();
    INFO("seed " << seed << ", iteration " << i << ":\n" << proto.DebugString());
    Outcome outcome = Generate(proto);
    if (!outcome.built) continue;
    ++built;
    const bool must_refuse = RefusedPackage(proto) || BulkStreaming(proto);
    CHECK(outcome.generated == !must_refuse);
    if (outcome.generated) {
      ++generated;
      CheckShape(proto, outcome);
    } else {
      ++refused;
      INFO(outcome.error);
      CHECK_FALSE(outcome.error.empty());
      CHECK(outcome.error.find(kFileName) == std::string::npos);  // protoc adds it
    }

    // The same file, a few bytes flipped: whatever still parses and builds must not crash it.
    std::string bytes = proto.SerializeAsString();
    for (size_t n = 1 + random.Below(4); n > 0; --n) {
      bytes[random.Below(bytes.size())] ^= static_cast<char>(1 + random.Below(255));
    }
    FileDescriptorProto mutated;
    if (mutated.ParseFromString(bytes)) {
      mutated.set_name(kFileName);
      Outcome odd = Generate(mutated);
      if (odd.built) {
        ++mutated_built;
        CHECK((odd.generated || !odd.error.empty()));
      }
    }
  }
  INFO(built << " built, " << generated << " generated, " << refused << " refused, "
             << mutated_built << " mutated files built");
  // The generator saw a real mix: most files valid, some refused, some odd ones.
  CHECK(built > static_cast<int>(iterations) / 2);
  CHECK(refused > 0);
  CHECK(generated > refused);
  CHECK(mutated_built > 0);
}

TEST_CASE("random .proto files: the generated C++ compiles with -Wall -Wextra -Werror",
          "[codegen][fuzz][compile]") {
  const uint64_t seed = EnvOr("ZRPC_FUZZ_SEED", 20261121) + 1;
  const uint64_t samples = EnvOr("ZRPC_FUZZ_COMPILES", 24);
  const std::string dir = zrpc::testing::TmpDir() + "/fuzz_compile";
  RandomProtos random(seed);
  uint64_t compiled = 0, protobuf_failures = 0;
  std::map<std::string, int> compiled_with;  // samples per file option that changes the names
  for (uint64_t attempt = 0; compiled < samples && attempt < 100 * samples; ++attempt) {
    FileDescriptorProto proto = random.File();
    Outcome outcome = Generate(proto);
    if (!outcome.generated || proto.service_size() == 0) continue;
    INFO("seed " << seed << ", attempt " << attempt << ":\n" << proto.DebugString());

    // What protoc would be given: the file and its imports, as a descriptor set.
    FileDescriptorSet set;
    std::unique_ptr<DescriptorPool> pool = PoolWithImports();
    for (const char* import : {"google/protobuf/descriptor.proto", kEmptyProto, kOptionsProto}) {
      pool->FindFileByName(import)->CopyTo(set.add_file());
    }
    *set.add_file() = proto;
    const FileDescriptor* built = pool->BuildFile(proto);
    REQUIRE(built != nullptr);
    std::string out;
    REQUIRE(Run("rm -rf " + dir + " && mkdir -p " + dir, &out) == 0);
    {
      std::ofstream file(dir + "/set.pb", std::ios::binary);
      REQUIRE(set.SerializeToOstream(&file));
    }
    std::string protoc_output;
    int protoc = Run("/usr/bin/protoc --descriptor_set_in=" + dir +
                         "/set.pb --plugin=protoc-gen-zrpc=" + Runfile("codegen/protoc-gen-zrpc") +
                         " --cpp_out=" + dir + " --zrpc_out=" + dir + " " + kFileName,
                     &protoc_output);
    INFO(protoc_output);
    REQUIRE(protoc == 0);

    // The names the generator keeps its classes away from are names protobuf really declared.
    const std::string pb_header = ReadFile(dir + "/fuzz/input.pb.h");
    for (const std::string& name : zrpc::codegen::ProtobufCppNames(built)) {
      INFO(name << " is not in fuzz/input.pb.h");
      CHECK(ContainsWord(pb_header, name));
    }

    const std::string gxx =
        "g++ -std=c++17 -fsyntax-only -Wall -Wextra -Werror -I" + dir + " -I" + Runfile("") + " ";
    std::string compiler_output;
    if (Run(gxx + dir + "/fuzz/input.zrpc.cc", &compiler_output) != 0) {
      // Only zrpc's part counts: if protobuf's own header fails alone, the input is outside
      // what protobuf supports.
      std::string pb_output;
      REQUIRE(Run("echo '#include \"fuzz/input.pb.h\"' > " + dir + "/pb.cc", &pb_output) == 0);
      if (Run(gxx + dir + "/pb.cc", &pb_output) != 0) {
        ++protobuf_failures;
        continue;
      }
      INFO(outcome.files["fuzz/input.zrpc.h"]);
      INFO(outcome.files["fuzz/input.zrpc.cc"]);
      INFO(compiler_output);
      FAIL_CHECK("the generated code does not compile");
    }
    ++compiled;
    const google::protobuf::FileOptions& options = built->options();
    if (options.cc_generic_services()) ++compiled_with["cc_generic_services"];
    ++compiled_with[google::protobuf::FileOptions::OptimizeMode_Name(options.optimize_for())];
  }
  INFO(protobuf_failures << " samples skipped: protobuf's own header did not compile");
  CHECK(compiled == samples);
  CHECK(protobuf_failures <= samples);
  for (const char* option : {"cc_generic_services", "SPEED", "CODE_SIZE", "LITE_RUNTIME"}) {
    INFO("samples compiled with " << option << ": " << compiled_with[option]);
    CHECK(compiled_with[option] > 0);
  }
}
