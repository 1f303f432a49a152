#include "codegen/cpp_names.h"

#include <google/protobuf/compiler/cpp/names.h>
#include <google/protobuf/descriptor.pb.h>

#include <map>
#include <set>
#include <string>

// Exported by libprotoc but declared only in cpp/helpers.h, which needs headers Debian does not
// ship. Using protobuf's own spellings keeps our names identical to those of its C++.
namespace google::protobuf::compiler::cpp {
std::string ResolveKeyword(const std::string& name);
std::string FieldConstantName(const FieldDescriptor* field);  // kFooFieldNumber
std::string FilenameIdentifier(const std::string& filename);  // a/b.proto -> a_2fb_2eproto
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
      "NULL",   "EOF",          "errno",    "stdin",        "stdout",      "stderr",
      "BUFSIZ", "FILENAME_MAX", "RAND_MAX", "EXIT_SUCCESS", "EXIT_FAILURE"};
  return kMacros;
}

// Function-like macros (expanded only before a '(') and the macros GNU mode (-std=gnu++17)
// predefines: harmless as a namespace under -std=c++17, not as a function or class name.
const std::set<std::string>& OtherMacros() {
  static const std::set<std::string> kMacros = {"assert",   "offsetof", "setjmp",  "va_arg",
                                                "va_start", "va_end",   "va_copy", "unix",
                                                "linux",    "i386"};
  return kMacros;
}

enum MacroKind { kObjectLike, kFunctionLike };

// The macros the headers around generated code define, by name (header_macros.inc says which).
const std::map<std::string, MacroKind>& HeaderMacros() {
  static const std::map<std::string, MacroKind> kMacros = [] {
    struct Entry {
      const char* name;
      MacroKind kind;
    };
    static constexpr Entry kEntries[] = {
#include "codegen/header_macros.inc"
    };
    std::map<std::string, MacroKind> macros;
    for (const Entry& entry : kEntries) macros.emplace(entry.name, entry.kind);
    return macros;
  }();
  return kMacros;
}

// The include guards of zrpc's headers, the runtime's and generated ones, as zrpc writes them:
// ZRPC_, the path, _H_. A rule rather than a list, so that the runtime's headers may come and go
// without the generator's names following them; one more '_' takes a name clear of every guard.
bool IsZrpcHeaderGuard(const std::string& name) {
  const std::string prefix = "ZRPC_";
  const std::string suffix = "_H_";
  return name.size() >= prefix.size() + suffix.size() && name.rfind(prefix, 0) == 0 &&
         name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
}

bool IsObjectLikeHeaderMacro(const std::string& name) {
  const auto it = HeaderMacros().find(name);
  return (it != HeaderMacros().end() && it->second == kObjectLike) || IsZrpcHeaderGuard(name);
}

}  // namespace

bool IsStandardMacro(const std::string& name) {
  return ObjectLikeMacros().count(name) > 0 || OtherMacros().count(name) > 0;
}

bool IsHeaderMacro(const std::string& name) {
  return HeaderMacros().count(name) > 0 || IsZrpcHeaderGuard(name);
}

std::string CppIdentifier(const std::string& name) {
  if (IsCppKeyword(name)) return name + "_";  // no keyword ends in '_'
  // A loop, as a macro's name with one more '_' could be a macro too (no listed one is today).
  std::string identifier = name;
  while (IsStandardMacro(identifier) || IsHeaderMacro(identifier)) identifier += "_";
  return identifier;
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
    // protobuf's C++ fails at `namespace NAN {` when its own headers define the macro (EPIPE),
    // zrpc's generated header when the runtime's do (NAN).
    if (IsObjectLikeHeaderMacro(part)) {
      return "'" + part +
             "' is a macro of the headers generated C++ includes (codegen/header_macros.inc), and "
             "C++ code for this package cannot compile; rename it";
    }
  }
  if (parts.empty()) return "";
  // What zrpc's headers declare directly in namespace zrpc (rpc/*.h, transport/*.h,
  // proto/zrpc/options.proto): a package zrpc.Channel would make a namespace of the same name.
  // tests/codegen:reserved_names_test reads the headers and fails naming any that is missing.
  static const std::set<std::string> kRuntimeNames = {"AcceptDataIdleIntervalMs",
                                                      "AppendPrometheusFamily",
                                                      "AsyncClientReader",
                                                      "AsyncClientReaderWriter",
                                                      "AsyncClientWriter",
                                                      "BulkDestination",
                                                      "BulkReleaser",
                                                      "CallIds",
                                                      "CallOptions",
                                                      "CallTable",
                                                      "Cancellation",
                                                      "Channel",
                                                      "ChannelOptions",
                                                      "ChannelStats",
                                                      "ClientChannel",
                                                      "ClientInterceptor",
                                                      "ClientReader",
                                                      "ClientReaderWriter",
                                                      "ClientStreamCall",
                                                      "ClientWriter",
                                                      "CreateChannel",
                                                      "DeadlineFromWire",
                                                      "DeadlineNanosFromWire",
                                                      "DecodeErrorBody",
                                                      "DecodeLayout",
                                                      "DecodeMetadataBlock",
                                                      "DecodePullDescriptor",
                                                      "DecodeRpcHeader",
                                                      "DoneCallback",
                                                      "EncodeAcceptData",
                                                      "EncodeErrorBody",
                                                      "EncodeLargeBody",
                                                      "EncodeMetadataBlock",
                                                      "EncodePullDescriptor",
                                                      "EncodeRpcHeader",
                                                      "ErrorBodySize",
                                                      "ExposedBuckets",
                                                      "FormatLogRecord",
                                                      "GetLogLevel",
                                                      "IncomingBulk",
                                                      "internal",
                                                      "kBySize",
                                                      "kMaxErrorMessage",
                                                      "kNumStatusCodes",
                                                      "kPullWindow",
                                                      "kRpcFlagBulk",
                                                      "kRpcFlagLargeBody",
                                                      "kRpcFlagMetadata",
                                                      "kRpcFlagPull",
                                                      "kRpcFlagPullResponse",
                                                      "kRpcFlagStream",
                                                      "kTruncatedMarker",
                                                      "LargeBody",
                                                      "LatencyHistogram",
                                                      "LatencySnapshot",
                                                      "LogLevel",
                                                      "LogLevelName",
                                                      "LogRecord",
                                                      "LogSink",
                                                      "MessageLayout",
                                                      "Metadata",
                                                      "MetadataBlock",
                                                      "MetadataBlockSize",
                                                      "method",
                                                      "MethodInfo",
                                                      "MethodMetrics",
                                                      "MethodMetricsSnapshot",
                                                      "MethodOptions",
                                                      "Metrics",
                                                      "MetricsHttpServer",
                                                      "MetricsSide",
                                                      "MetricsSideName",
                                                      "OutgoingBulk",
                                                      "ParseLogLevel",
                                                      "PayloadPlacement",
                                                      "PendingCall",
                                                      "PullDescriptor",
                                                      "RegisteredMemory",
                                                      "RemainingFromWire",
                                                      "RpcHeader",
                                                      "RpcKind",
                                                      "RuntimeOptions",
                                                      "SendSlot",
                                                      "Server",
                                                      "ServerAsyncReader",
                                                      "ServerAsyncReaderWriter",
                                                      "ServerAsyncStream",
                                                      "ServerAsyncWriter",
                                                      "ServerCall",
                                                      "ServerContext",
                                                      "ServerInterceptor",
                                                      "ServerOptions",
                                                      "ServerReader",
                                                      "ServerReaderWriter",
                                                      "ServerStats",
                                                      "ServerWriter",
                                                      "Service",
                                                      "ServiceId",
                                                      "ServiceInfo",
                                                      "SetLogLevel",
                                                      "SetLogSink",
                                                      "StatusCodeLabel",
                                                      "StreamCall",
                                                      "StreamCallback",
                                                      "StreamDirection",
                                                      "TakenCall",
                                                      "TimeoutToWireNanos",
                                                      "TraceContext",
                                                      "TraceInterceptor",
                                                      "transport"};
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

namespace {

using google::protobuf::Descriptor;
using google::protobuf::EnumDescriptor;
using google::protobuf::FileDescriptor;
using google::protobuf::FileOptions;

// The spellings below follow protobuf's cpp/enum.cc, message.cc, extension.cc, service.cc and
// file.cc (3.21); plugin_fuzz_test checks each name against a header protoc generated.
void AddEnumNames(const EnumDescriptor* enumeration, bool descriptors,
                  std::set<std::string>& names) {
  using google::protobuf::compiler::cpp::ClassName;
  using google::protobuf::compiler::cpp::EnumValueName;
  const std::string name = ClassName(enumeration);
  // A nested enum's values and bounds are prefixed with its class name at namespace scope (the
  // message holds the unprefixed aliases); the bounds then repeat the enum's own name.
  const std::string prefix = enumeration->containing_type() == nullptr ? "" : name + "_";
  names.insert(name);
  for (int v = 0; v < enumeration->value_count(); ++v) {
    names.insert(prefix + EnumValueName(enumeration->value(v)));
  }
  for (const char* bound : {"_MIN", "_MAX", "_ARRAYSIZE"}) {
    names.insert(prefix + enumeration->name() + bound);
  }
  for (const char* helper : {"_IsValid", "_Name", "_Parse"}) names.insert(name + helper);
  if (descriptors) names.insert(name + "_descriptor");
}

void AddMessageNames(const Descriptor* message, bool descriptors, std::set<std::string>& names) {
  const std::string name = google::protobuf::compiler::cpp::ClassName(message);
  names.insert(name);
  names.insert(name + "DefaultTypeInternal");
  names.insert("_" + name + "_default_instance_");
  for (int i = 0; i < message->nested_type_count(); ++i) {
    AddMessageNames(message->nested_type(i), descriptors, names);
  }
  for (int i = 0; i < message->enum_type_count(); ++i) {
    AddEnumNames(message->enum_type(i), descriptors, names);
  }
}

}  // namespace

std::set<std::string> ProtobufCppNames(const FileDescriptor* file) {
  namespace cpp = google::protobuf::compiler::cpp;
  const bool lite = file->options().optimize_for() == FileOptions::LITE_RUNTIME;
  std::set<std::string> names;
  for (int i = 0; i < file->message_type_count(); ++i) {
    AddMessageNames(file->message_type(i), !lite, names);
  }
  for (int i = 0; i < file->enum_type_count(); ++i) {
    AddEnumNames(file->enum_type(i), !lite, names);
  }
  for (int i = 0; i < file->extension_count(); ++i) {
    const std::string qualified = cpp::QualifiedExtensionName(file->extension(i));
    names.insert(qualified.substr(qualified.rfind(':') + 1));
    names.insert(cpp::FieldConstantName(file->extension(i)));
  }
  if (file->options().cc_generic_services() && !lite) {
    for (int i = 0; i < file->service_count(); ++i) {
      names.insert(file->service(i)->name());
      names.insert(file->service(i)->name() + "_Stub");
    }
  }
  if (file->package().empty()) {
    names.insert("TableStruct_" + cpp::FilenameIdentifier(file->name()));
    if (!lite) names.insert("descriptor_table_" + cpp::FilenameIdentifier(file->name()));
  }
  return names;
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
