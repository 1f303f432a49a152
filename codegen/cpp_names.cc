#include "codegen/cpp_names.h"

#include <set>
#include <string>

// Exported by libprotoc but declared only in cpp/helpers.h, which needs headers Debian does not
// ship. Using protobuf's own keyword list keeps our namespaces identical to the messages'.
namespace google::protobuf::compiler::cpp {
std::string ResolveKeyword(const std::string& name);
}  // namespace google::protobuf::compiler::cpp

namespace zrpc::codegen {

bool IsCppKeyword(const std::string& name) {
  return google::protobuf::compiler::cpp::ResolveKeyword(name) != name;
}

namespace {

// Object-like macros of the C library headers C++ code commonly pulls in: any use of the name
// is expanded, also as a namespace.
const std::set<std::string>& ObjectLikeMacros() {
  static const std::set<std::string> kMacros = {
      "NULL",         "EOF",          "errno",    "stdin",       "stdout", "stderr",
      "BUFSIZ",       "FILENAME_MAX", "RAND_MAX", "EXIT_SUCCESS", "EXIT_FAILURE"};
  return kMacros;
}

// Function-like macros (expanded only before a '(') and the macros GNU mode (-std=gnu++17)
// predefines: harmless as a namespace under -std=c++17, not as a function or class name.
const std::set<std::string>& OtherMacros() {
  static const std::set<std::string> kMacros = {
      "assert", "offsetof", "setjmp", "va_arg", "va_start", "va_end", "va_copy",
      "unix",   "linux",    "i386"};
  return kMacros;
}

}  // namespace

bool IsStandardMacro(const std::string& name) {
  return ObjectLikeMacros().count(name) > 0 || OtherMacros().count(name) > 0;
}


std::string CppIdentifier(const std::string& name) {
  return IsCppKeyword(name) || IsStandardMacro(name) ? name + "_" : name;
}

std::string ReservedPackageReason(const std::string& package) {
  const std::vector<std::string> parts = PackageNamespaces(package);
  for (const std::string& part : parts) {
    // protobuf's C++ generator emits `namespace class {` or `namespace EOF {`: no compiler
    // takes either.
    if (IsCppKeyword(part) || ObjectLikeMacros().count(part) > 0) {
      return "'" + part + "' is a C++ " + (IsCppKeyword(part) ? "keyword" : "standard macro") +
             ", and C++ code for this package cannot compile; rename it";
    }
  }
  if (parts.empty()) return "";
  // What zrpc's headers declare directly in namespace zrpc (rpc/*.h, proto/zrpc/options.proto).
  // A package zrpc.Channel would make a namespace of the same name; keep this list current.
  static const std::set<std::string> kRuntimeNames = {
      "internal",     "Channel",      "Service",      "ServerCall",    "ServerContext",
      "CallOptions",  "MethodInfo",   "ServiceInfo",  "SendSlot",      "DoneCallback",
      "OutgoingBulk", "IncomingBulk", "BulkReleaser", "MethodOptions", "method"};
  if (parts[0] == "zrpc" && (parts.size() == 1 || kRuntimeNames.count(parts[1]) > 0)) {
    return "the namespace " + (parts.size() == 1 ? "zrpc" : "zrpc::" + parts[1]) +
           " belongs to zrpc's runtime, and the package's types would collide with its names; "
           "use a package of your own";
  }
  if (parts[0] == "std" || parts[0] == "absl") {
    return "types inside namespace " + parts[0] +
           " would hide or collide with that library's names, which generated code uses; use "
           "a package of your own";
  }
  return "";
}

bool IsReservedGlobalName(const std::string& name) {
  static const std::set<std::string> kGlobalNames = {
      "zrpc",      "absl",     "std",      "google",   "size_t",   "ptrdiff_t",
      "nullptr_t", "int8_t",   "int16_t",  "int32_t",  "int64_t",  "uint8_t",
      "uint16_t",  "uint32_t", "uint64_t", "intptr_t", "uintptr_t"};
  return kGlobalNames.count(name) > 0;
}

std::vector<std::string> PackageNamespaces(const std::string& package) {
  std::vector<std::string> parts;
  size_t start = 0;
  while (start < package.size()) {
    size_t dot = package.find('.', start);
    if (dot == std::string::npos) dot = package.size();
    parts.push_back(package.substr(start, dot - start));
    start = dot + 1;
  }
  return parts;
}

}  // namespace zrpc::codegen
