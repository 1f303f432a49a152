#include "codegen/zrpc_generator.h"

#include <google/protobuf/compiler/cpp/names.h>
#include <google/protobuf/descriptor.h>
#include <google/protobuf/descriptor.pb.h>
#include <google/protobuf/io/printer.h>
#include <google/protobuf/io/zero_copy_stream.h>

#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "codegen/cpp_names.h"
#include "proto/zrpc/options.pb.h"

namespace zrpc::codegen {
namespace {

using google::protobuf::FileDescriptor;
using google::protobuf::MethodDescriptor;
using google::protobuf::ServiceDescriptor;
using google::protobuf::SourceLocation;
using google::protobuf::compiler::GeneratorContext;
using google::protobuf::io::Printer;
using Vars = std::map<std::string, std::string>;

std::string StripProto(const std::string& path) {
  const std::string ext = ".proto";
  if (path.size() >= ext.size() && path.compare(path.size() - ext.size(), ext.size(), ext) == 0) {
    return path.substr(0, path.size() - ext.size());
  }
  return path;
}

// The include guard of the header generated for the .proto at `proto_path`: distinct paths give
// distinct guards, so a program may include the headers of any two files. ASCII letters and
// digits stay as they are (case too: a/B.proto and a/b.proto are two files) and every other byte,
// '_' included, becomes '_' and its two hex digits, as protobuf escapes the paths in its own
// guards (a/b_c.proto: a_2fb_5fc_2eproto). The fixed width makes the escaping one to one: writing
// '_' for each, as this once did, gave guard/a_b.proto and guard_a/b.proto a single guard, and the
// header included second vanished.
std::string HeaderGuard(const std::string& proto_path) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string guard = "ZRPC_GENERATED_";
  for (const char c : proto_path) {
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')) {
      guard += c;
    } else {
      const unsigned char byte = static_cast<unsigned char>(c);
      guard += '_';
      guard += kHex[byte >> 4];
      guard += kHex[byte & 0xf];
    }
  }
  return guard + "_ZRPC_H_";
}

// One line of a .proto comment as the text of a C++ // comment. A line that ends in a backslash
// (or the trigraph ??/, which GCC still warns about) would continue the comment onto the next
// line of code, so it gets a terminating '.'; a carriage return inside it becomes a space.
std::string CommentLine(std::string line) {
  // GCC ends a line at a lone \r (and \v, \f are no better): the rest would become code.
  for (char& c : line) {
    if (c == '\r' || c == '\v' || c == '\f') c = ' ';
  }
  while (!line.empty() && (line.back() == ' ' || line.back() == '\t')) {
    line.pop_back();
  }
  if (!line.empty() && (line.back() == '\\' ||
                        (line.size() >= 3 && line.compare(line.size() - 3, 3, "?\?/") == 0))) {
    line += '.';
  }
  if (line.empty()) return "//";
  return "//" + (line[0] == ' ' ? line : " " + line);
}

// The .proto's comments above `descriptor`, as C++ comment lines indented by `indent`.
template <typename Descriptor>
std::string Comments(const Descriptor* descriptor, const std::string& indent) {
  SourceLocation location;
  if (!descriptor->GetSourceLocation(&location)) return "";
  std::string text = location.leading_comments;
  std::string out;
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    out += indent + CommentLine(text.substr(start, end - start)) + "\n";
    start = end + 1;
  }
  return out;
}

// The .proto names of the file's top-level messages, enums and services: in a package-less
// file, these are global C++ names.
std::vector<std::string> TopLevelTypeNames(const FileDescriptor* file) {
  std::vector<std::string> names;
  for (int i = 0; i < file->message_type_count(); ++i) {
    names.push_back(file->message_type(i)->name());
  }
  for (int i = 0; i < file->enum_type_count(); ++i) names.push_back(file->enum_type(i)->name());
  for (int i = 0; i < file->service_count(); ++i) names.push_back(file->service(i)->name());
  return names;
}

// The C++ class names of the file's services, in file order. Each keeps its .proto name unless
// that is reserved (cpp_names.h), the name of one of the class's members (a member may not
// share its class's name: service_info would be a constructor), or a name protobuf's C++ for
// the file declares in the same namespace (ProtobufCppNames: with cc_generic_services that is
// every service's own name; otherwise a name like Outer_Inner or FooDefaultTypeInternal).
// A renamed service takes underscores until it collides with none of those, no service's .proto
// name and no earlier service's class (service Service and service Service_ must not both
// become Service_).
std::vector<std::string> ServiceClassNames(const FileDescriptor* file) {
  const std::set<std::string> protobuf_names = ProtobufCppNames(file);
  std::set<std::string> taken = protobuf_names;
  for (int i = 0; i < file->service_count(); ++i) taken.insert(file->service(i)->name());
  std::vector<std::string> classes;
  for (int i = 0; i < file->service_count(); ++i) {
    const std::string& original = file->service(i)->name();
    std::string name = CppIdentifier(original);
    for (const char* member :
         {"Stub", "Service", "AsyncService", "service_info", "kMethods", "kInfo"}) {
      if (name == member) name += "_";
    }
    if (name != original || protobuf_names.count(name) > 0) {
      while (!taken.insert(name).second) name = CppIdentifier(name + "_");
    }
    classes.push_back(name);
  }
  return classes;
}

struct MethodNames {
  const MethodDescriptor* method;
  std::string name;        // C++ name of the blocking stub method and of the handler
  std::string async_name;  // C++ name of the asynchronous stub method
};

// Picks C++ names for a service's methods: keywords, macros (cpp_names.h) and names the
// generated classes use get a trailing underscore, and so does any name that would collide with
// one already taken.
std::vector<MethodNames> NameMethods(const ServiceDescriptor* service) {
  std::set<std::string> taken = {
      "Stub",         "Service",  "AsyncService",         "Dispatch",
      "service_info", "channel_", "serves_streams_async", "handlers_async"};
  auto claim = [&taken](std::string name) {
    name = CppIdentifier(name);
    while (!taken.insert(name).second) name = CppIdentifier(name + "_");
    return name;
  };
  std::vector<MethodNames> names;
  // Blocking names first, so a method called AsyncFoo keeps its name over Foo's async twin.
  for (int i = 0; i < service->method_count(); ++i) {
    names.push_back({service->method(i), claim(service->method(i)->name()), ""});
  }
  for (MethodNames& n : names) n.async_name = claim("Async" + n.name);
  return names;
}

// The parts of the signatures that differ for bulk methods (rpc/bulk.h). Non-bulk methods pass
// an empty OutgoingBulk and a null IncomingBulk* to the same runtime calls.
void AddBulkVars(const ::zrpc::MethodOptions& options, Vars& vars) {
  const bool in = options.request_bulk();
  const bool out = options.response_bulk();
  vars["request_bulk"] = in ? "true" : "false";
  vars["response_bulk"] = out ? "true" : "false";
  // Stub parameters and what the stub passes on.
  vars["stub_in"] = in ? "\n        ::zrpc::OutgoingBulk request_bulk," : "";
  vars["stub_out"] = out ? "\n        ::zrpc::IncomingBulk* response_bulk," : "";
  vars["def_stub_in"] = in ? "\n    ::zrpc::OutgoingBulk request_bulk," : "";
  vars["def_stub_out"] = out ? "\n    ::zrpc::IncomingBulk* response_bulk," : "";
  vars["pass_stub_in"] = in ? "::std::move(request_bulk)" : "::zrpc::OutgoingBulk()";
  vars["pass_stub_out"] = out ? "response_bulk" : "nullptr";
  // Handler parameters, named in the declaration; the dispatch lambda names only those it uses.
  vars["handler_in"] = in ? "\n        ::zrpc::IncomingBulk request_bulk," : "";
  vars["handler_out"] = out ? ",\n        ::zrpc::OutgoingBulk* response_bulk" : "";
  vars["default_in"] = in ? " ::zrpc::IncomingBulk request_bulk," : "";
  vars["pass_default_in"] = in ? ", ::std::move(request_bulk)" : "";
  vars["default_out"] = out ? ", ::zrpc::OutgoingBulk*" : "";
  vars["lambda_in"] = in ? " request_bulk" : "";
  vars["lambda_out"] = out ? " response_bulk" : "";
  vars["pass_handler_in"] = in ? " ::std::move(request_bulk)," : "";
  vars["pass_handler_out"] = out ? ", response_bulk" : "";
  std::string stub_doc;
  std::string handler_doc;
  std::string async_doc;
  if (in) {
    stub_doc += "    // `request_bulk` goes beside the request by RDMA WRITE; see rpc/bulk.h.\n";
    handler_doc += "    // `request_bulk` is read in place; release it promptly (rpc/bulk.h).\n";
    async_doc +=
        "    // `call->TakeRequestBulk()` gives the request's bulk payload, read in place; "
        "release\n"
        "    // it promptly (rpc/bulk.h).\n";
  }
  if (out) {
    stub_doc += "    // `*response_bulk` receives the response's bulk payload, read in place.\n";
    handler_doc +=
        "    // Put the response's bulk payload in `*response_bulk`; memory that may die before\n"
        "    // the server needs a release callback (rpc/bulk.h).\n";
    async_doc +=
        "    // Put the response's bulk payload in `*call->response_bulk()`; memory that may die\n"
        "    // before the server needs a release callback (rpc/bulk.h).\n";
  }
  vars["stub_bulk_doc"] = stub_doc;
  vars["handler_bulk_doc"] = handler_doc;
  vars["async_bulk_doc"] = async_doc;
}

// Everything the templates need about one service, computed once per file.
struct ServiceCode {
  Vars vars;                  // Service, Qualified, full_name, count, comments
  std::vector<Vars> methods;  // index i is rpc i: the service's vars plus the method's own
};

// `qualified_namespace` is "::a::b" for package a.b ("" without a package): the service class
// is named fully qualified inside its own members, so that no rpc or type name can hide it.
ServiceCode DescribeService(const ServiceDescriptor* service, const std::string& service_class,
                            const std::string& qualified_namespace) {
  using google::protobuf::compiler::cpp::QualifiedClassName;
  ServiceCode code;
  std::string comments = Comments(service, "");
  if (service_class != service->name()) {
    comments += "// zrpc's class for service " + service->name() +
                ": C++ or protobuf's C++ already uses that name\n"
                "// (codegen/zrpc_generator.h, \"Naming\").\n";
  }
  code.vars = {{"Service", service_class},
               {"Qualified", qualified_namespace + "::" + service_class},
               {"full_name", service->full_name()},
               {"count", std::to_string(service->method_count())},
               {"comments", comments}};
  for (const MethodNames& names : NameMethods(service)) {
    const MethodDescriptor* method = names.method;
    Vars vars = code.vars;
    vars["Method"] = names.name;
    vars["AsyncMethod"] = names.async_name;
    vars["Request"] = QualifiedClassName(method->input_type());
    vars["Response"] = QualifiedClassName(method->output_type());
    vars["full_name"] = service->full_name() + "/" + method->name();
    vars["index"] = std::to_string(method->index());
    vars["comments"] = Comments(method, "    ");
    vars["client_streaming"] = method->client_streaming() ? "true" : "false";
    vars["server_streaming"] = method->server_streaming() ? "true" : "false";
    vars["kind"] = method->client_streaming() ? (method->server_streaming() ? "bidi" : "client")
                                              : (method->server_streaming() ? "server" : "unary");
    AddBulkVars(method->options().GetExtension(::zrpc::method), vars);
    const google::protobuf::MethodOptions::IdempotencyLevel level =
        method->options().idempotency_level();
    vars["idempotent"] = level == google::protobuf::MethodOptions::IDEMPOTENT ||
                                 level == google::protobuf::MethodOptions::NO_SIDE_EFFECTS
                             ? "true"
                             : "false";
    code.methods.push_back(std::move(vars));
  }
  return code;
}

// Refuses what generated code cannot support. protoc prints the error after the file's name, so
// the message starts with the service (and method) or the package.
bool CheckSupported(const FileDescriptor* file, std::string* error) {
  const std::string reason = ReservedPackageReason(file->package());
  if (!reason.empty()) {
    *error = "package " + file->package() + ": " + reason;
    return false;
  }
  if (file->package().empty()) {
    auto refuse = [&](const std::string& name) {
      *error = "'" + name + "' is declared without a package, so its C++ name would be ::" + name +
               ", which generated code needs for itself; add a package";
      return false;
    };
    for (const std::string& name : TopLevelTypeNames(file)) {
      if (IsReservedGlobalName(name)) return refuse(name);
    }
  }
  for (int s = 0; s < file->service_count(); ++s) {
    const ServiceDescriptor* service = file->service(s);
    for (int m = 0; m < service->method_count(); ++m) {
      const MethodDescriptor* method = service->method(m);
      const ::zrpc::MethodOptions& options = method->options().GetExtension(::zrpc::method);
      // On a stream the option marks each message that way (rpc/streaming.h, "Bulk payloads");
      // a server-streaming call's one request and a client-streaming call's one response carry
      // none.
      const bool streams = method->client_streaming() || method->server_streaming();
      const char* single = nullptr;
      if (streams && options.request_bulk() && !method->client_streaming()) {
        single =
            "request_bulk on a server-streaming rpc: its one request carries no bulk "
            "payload (its responses may: response_bulk)";
      } else if (streams && options.response_bulk() && !method->server_streaming()) {
        single =
            "response_bulk on a client-streaming rpc: its one response carries no bulk "
            "payload (its requests may: request_bulk)";
      }
      if (single != nullptr) {
        *error = "service " + service->name() + ", method " + method->name() + ": (zrpc.method) " +
                 single + " (rpc/streaming.h, \"Bulk payloads\")";
        return false;
      }
    }
  }
  return true;
}

// The ServerAsync* class an AsyncService's streaming handler owns, for a method of `kind`.
const char* AsyncStreamClass(const std::string& kind) {
  return kind == "server"   ? "::zrpc::ServerAsyncWriter<$Request$, $Response$>"
         : kind == "client" ? "::zrpc::ServerAsyncReader<$Request$, $Response$>"
                            : "::zrpc::ServerAsyncReaderWriter<$Request$, $Response$>";
}

bool HasStreaming(const std::vector<Vars>& methods) {
  for (const Vars& vars : methods) {
    if (vars.at("kind") != "unary") return true;
  }
  return false;
}

// A server base class nested in the service class: `head` (its comment and first line), what
// Service and AsyncService share, then `handler` printed with each rpc's vars. `async`: the
// streaming handlers are asynchronous too (AsyncService).
void PrintServerClass(Printer& p, const std::vector<Vars>& methods, const char* head,
                      const char* handler, bool async) {
  p.Print(head);
  p.Print(
      "   public:\n"
      "    const ::zrpc::ServiceInfo& service_info() const final;\n"
      "    void Dispatch(int method_index, ::zrpc::ServerCall* call) final;\n");
  if (async) p.Print("    bool handlers_async() const final { return true; }\n");
  if (async && HasStreaming(methods)) {
    p.Print("    bool serves_streams_async() const final { return true; }\n");
  }
  for (const Vars& vars : methods) {
    const std::string& kind = vars.at("kind");
    if (kind == "unary") {
      p.Print(vars, handler);
    } else if (async) {
      p.Print(vars,
              "\n"
              "$comments$"
              "    // Streaming, asynchronous: owns the stream and returns at once; Read and\n"
              "    // Write report through callbacks, Finish ends the call (rpc/streaming.h).\n"
              "    virtual void $Method$(\n"
              "        ::std::unique_ptr<");
      p.Print(vars, AsyncStreamClass(kind));
      p.Print("> call);\n");
    } else {
      p.Print(vars,
              "\n"
              "$comments$"
              "    // Streaming: runs on a thread of its own and returns the call's status\n"
              "    // (rpc/streaming.h; AsyncService's form needs no thread).\n");
      p.Print(vars,
              kind == "server"
                  ? "    virtual ::absl::Status $Method$(::zrpc::ServerContext& context,\n"
                    "        const $Request$& request, ::zrpc::ServerWriter<$Response$>* writer);\n"
              : kind == "client"
                  ? "    virtual ::absl::Status $Method$(::zrpc::ServerContext& context,\n"
                    "        ::zrpc::ServerReader<$Request$>* reader, $Response$* response);\n"
                  : "    virtual ::absl::Status $Method$(::zrpc::ServerContext& context,\n"
                    "        ::zrpc::ServerReaderWriter<$Request$, $Response$>* stream);\n");
    }
  }
  p.Print("  };\n\n");
}

void PrintHeaderService(Printer& p, const ServiceCode& code) {
  const std::vector<Vars>& methods = code.methods;
  p.Print(code.vars,
          "$comments$"
          "class $Service$ final {\n"
          " public:\n"
          "  // Name and method table (the order of the rpcs in the .proto).\n"
          "  static const ::zrpc::ServiceInfo& service_info();\n"
          "\n"
          "  // Client stub: calls the service over `channel`, which must outlive it.\n"
          "  class Stub final {\n"
          "   public:\n"
          "    explicit Stub(::zrpc::Channel* channel) : channel_(channel) {}\n");
  for (const Vars& vars : methods) {
    const std::string& kind = vars.at("kind");
    if (kind == "server") {
      p.Print(vars,
              "\n"
              "$comments$"
              "    // Server streaming: Read the responses, then Finish (rpc/streaming.h).\n"
              "    ::zrpc::ClientReader<$Response$> $Method$(const $Request$& request,\n"
              "        const ::zrpc::CallOptions& options = ::zrpc::CallOptions());\n"
              "    // Asynchronous $Method$: Read and Finish report through callbacks.\n"
              "    ::zrpc::AsyncClientReader<$Response$> $AsyncMethod$(const $Request$& request,\n"
              "        const ::zrpc::CallOptions& options = ::zrpc::CallOptions());\n");
      continue;
    }
    if (kind == "client") {
      p.Print(
          vars,
          "\n"
          "$comments$"
          "    // Client streaming: Write the requests, WritesDone, then Finish, after which\n"
          "    // `*response` (alive until then) holds the answer (rpc/streaming.h).\n"
          "    ::zrpc::ClientWriter<$Request$> $Method$($Response$* response,\n"
          "        const ::zrpc::CallOptions& options = ::zrpc::CallOptions());\n"
          "    // Asynchronous $Method$: Write and Finish report through callbacks; `*response`\n"
          "    // (alive until Finish's runs) holds the answer then.\n"
          "    ::zrpc::AsyncClientWriter<$Request$> $AsyncMethod$($Response$* response,\n"
          "        const ::zrpc::CallOptions& options = ::zrpc::CallOptions());\n");
      continue;
    }
    if (kind == "bidi") {
      p.Print(
          vars,
          "\n"
          "$comments$"
          "    // Bidirectional streaming: Write and Read (one thread each at most), WritesDone,\n"
          "    // then Finish (rpc/streaming.h).\n"
          "    ::zrpc::ClientReaderWriter<$Request$, $Response$> $Method$(\n"
          "        const ::zrpc::CallOptions& options = ::zrpc::CallOptions());\n"
          "    // Asynchronous $Method$: Write, Read and Finish report through callbacks.\n"
          "    ::zrpc::AsyncClientReaderWriter<$Request$, $Response$> $AsyncMethod$(\n"
          "        const ::zrpc::CallOptions& options = ::zrpc::CallOptions());\n");
      continue;
    }
    p.Print(vars,
            "\n"
            "$comments$"
            "$stub_bulk_doc$"
            "    ::absl::Status $Method$(const $Request$& request,$stub_in$ $Response$* response,"
            "$stub_out$\n"
            "        const ::zrpc::CallOptions& options = ::zrpc::CallOptions());\n"
            "    // Asynchronous $Method$: `done` runs once the call ends; the outputs must stay\n"
            "    // alive until then.\n"
            "    void $AsyncMethod$(const $Request$& request,$stub_in$ $Response$* response,"
            "$stub_out$\n"
            "        const ::zrpc::CallOptions& options, ::zrpc::DoneCallback done);\n");
  }
  p.Print(
      "\n"
      "   private:\n"
      "    ::zrpc::Channel* channel_;\n"
      "  };\n"
      "\n");
  PrintServerClass(
      p, methods,
      "  // Server base class: for each method the server implements, override one of its two\n"
      "  // handlers: the blocking one, which answers by returning, or the async one\n"
      "  // (Async<Method>), which owns the call, a ::zrpc::PendingCall with the request and the\n"
      "  // response to fill in, and finishes it when the answer is ready, also after returning\n"
      "  // and from another thread (one dropped unfinished fails with INTERNAL). Methods may mix\n"
      "  // the two forms freely; those with neither answer UNIMPLEMENTED. Handlers may run on\n"
      "  // several threads at once.\n"
      "  class Service : public ::zrpc::Service {\n",
      "\n"
      "$comments$"
      "$handler_bulk_doc$"
      "    virtual ::absl::Status $Method$(::zrpc::ServerContext& context,\n"
      "        const $Request$& request,$handler_in$ $Response$* response$handler_out$);\n"
      "    // $Method$, answered later (override this or the above, not both).\n"
      "$async_bulk_doc$"
      "    virtual void $AsyncMethod$(::std::unique_ptr<::zrpc::PendingCall<\n"
      "        $Request$, $Response$>> call);\n",
      /*async=*/false);
  PrintServerClass(
      p, methods,
      "  // Asynchronous server base class: every method in the async form, under the rpc's own\n"
      "  // name (Service offers both forms for unary methods). Each handler owns its call (a\n"
      "  // ::zrpc::PendingCall, or for a streaming method a ::zrpc::ServerAsyncWriter, Reader or\n"
      "  // ReaderWriter, which needs no thread of its own) and finishes it when the answer is\n"
      "  // ready, also after returning and from another thread; one dropped unfinished fails\n"
      "  // with INTERNAL. Override the handlers the server implements; the others answer\n"
      "  // UNIMPLEMENTED. Handlers may run on several threads at once. Unary handlers run on\n"
      "  // a poller thread by default and must return at once (::zrpc::Server::SetInline(\n"
      "  // method, false) moves one that blocks to the handler pool).\n"
      "  class AsyncService : public ::zrpc::Service {\n",
      "\n"
      "$comments$"
      "$async_bulk_doc$"
      "    virtual void $Method$(::std::unique_ptr<::zrpc::PendingCall<\n"
      "        $Request$, $Response$>> call);\n",
      /*async=*/true);
  p.Print(" private:\n");
  if (!methods.empty()) {
    p.Print("  static const ::zrpc::MethodInfo kMethods[];  // index i is rpc i\n");
  }
  p.Print(
      "  static const ::zrpc::ServiceInfo kInfo;\n"
      "};\n"
      "\n");
}

// The method table and service info: static members of the service class. Inside Stub and
// Service they are always named fully qualified: an rpc may be called kInfo, and a member of
// Stub or Service would hide the plain name.
void PrintSourceTables(Printer& p, const ServiceCode& code) {
  const std::vector<Vars>& methods = code.methods;
  const Vars& svars = code.vars;
  if (methods.empty()) {
    p.Print(svars,
            "const ::zrpc::ServiceInfo $Service$::kInfo = {\"$full_name$\", nullptr, 0};\n\n");
  } else {
    p.Print(svars, "const ::zrpc::MethodInfo $Service$::kMethods[] = {\n");
    for (const Vars& vars : methods) {
      p.Print(
          vars,
          "    {\"$full_name$\", $index$, $request_bulk$, $response_bulk$, $client_streaming$,\n"
          "     $server_streaming$, $idempotent$},\n");
    }
    p.Print(svars,
            "};\n"
            "const ::zrpc::ServiceInfo $Service$::kInfo = {\"$full_name$\", kMethods, "
            "$count$};\n\n");
  }
}

// `Base`::Dispatch for Base Service or AsyncService: a switch on the method index whose cases
// are `case_code` (printed with each method's vars), then the answer for an unknown index.
void PrintDispatch(Printer& p, const ServiceCode& code, const std::string& base,
                   const char* case_code) {
  Vars svars = code.vars;
  svars["Base"] = base;
  p.Print(svars,
          "void $Service$::$Base$::Dispatch(int method_index, ::zrpc::ServerCall* call) {\n"
          "  switch (method_index) {\n");
  for (const Vars& vars : code.methods) {
    const std::string& kind = vars.at("kind");
    if (kind == "unary") {
      p.Print(vars, case_code);
      continue;
    }
    if (base == "AsyncService") {
      // The handler owns its stream (rpc/streaming.h, "Asynchronous server streams").
      Vars with = vars;
      with["Handle"] = kind == "server"   ? "HandleServerStreamingLater"
                       : kind == "client" ? "HandleClientStreamingLater"
                                          : "HandleBidiStreamingLater";
      p.Print(with,
              "    case $index$:\n"
              "      ::zrpc::internal::$Handle$<$Request$, $Response$>(\n"
              "          call, $Qualified$::kMethods[$index$],\n"
              "          [this](auto stream) { this->$Method$(::std::move(stream)); });\n"
              "      return;\n");
      continue;
    }
    p.Print(
        vars,
        kind == "server"
            ? "    case $index$:\n"
              "      ::zrpc::internal::HandleServerStreaming<$Request$, $Response$>(\n"
              "          call, $Qualified$::kMethods[$index$],\n"
              "          [this](::zrpc::ServerContext& context, const $Request$& request,\n"
              "                 ::zrpc::ServerWriter<$Response$>* writer) {\n"
              "            return this->$Method$(context, request, writer);\n"
              "          });\n"
              "      return;\n"
        : kind == "client"
            ? "    case $index$:\n"
              "      ::zrpc::internal::HandleClientStreaming<$Request$, $Response$>(\n"
              "          call, $Qualified$::kMethods[$index$],\n"
              "          [this](::zrpc::ServerContext& context,\n"
              "                 ::zrpc::ServerReader<$Request$>* reader, $Response$* response) {\n"
              "            return this->$Method$(context, reader, response);\n"
              "          });\n"
              "      return;\n"
            : "    case $index$:\n"
              "      ::zrpc::internal::HandleBidiStreaming<$Request$, $Response$>(\n"
              "          call, $Qualified$::kMethods[$index$],\n"
              "          [this](::zrpc::ServerContext& context,\n"
              "                 ::zrpc::ServerReaderWriter<$Request$, $Response$>* stream) {\n"
              "            return this->$Method$(context, stream);\n"
              "          });\n"
              "      return;\n");
  }
  p.Print(svars,
          "  }\n"
          "  call->Finish(::absl::UnimplementedError(\n"
          "                   \"$full_name$ has no method with index \" +\n"
          "                   ::std::to_string(method_index)),\n"
          "               nullptr, ::zrpc::OutgoingBulk());\n"
          "}\n\n");
}

// A streaming method's stubs, and its handlers' defaults in Service (blocking) and AsyncService.
void PrintStreamingMembers(Printer& p, const Vars& vars) {
  const std::string& kind = vars.at("kind");
  // The blocking stub, then its asynchronous twin: the same open, another wrapper.
  for (const char* form : {"", "Async"}) {
    Vars with = vars;
    with["Name"] = *form == '\0' ? vars.at("Method") : vars.at("AsyncMethod");
    with["Form"] = form;
    if (kind == "server") {
      p.Print(with,
              "::zrpc::$Form$ClientReader<$Response$> $Service$::Stub::$Name$(\n"
              "    const $Request$& request, const ::zrpc::CallOptions& options) {\n"
              "  return ::zrpc::$Form$ClientReader<$Response$>(\n"
              "      ::zrpc::internal::OpenClientStream<$Response$>(\n"
              "          channel_, $Qualified$::kMethods[$index$], &request, nullptr, options));\n"
              "}\n\n");
    } else if (kind == "client") {
      p.Print(with,
              "::zrpc::$Form$ClientWriter<$Request$> $Service$::Stub::$Name$(\n"
              "    $Response$* response, const ::zrpc::CallOptions& options) {\n"
              "  return ::zrpc::$Form$ClientWriter<$Request$>(\n"
              "      ::zrpc::internal::OpenClientStream<$Response$>(\n"
              "          channel_, $Qualified$::kMethods[$index$], nullptr, response, options));\n"
              "}\n\n");
    } else {
      p.Print(with,
              "::zrpc::$Form$ClientReaderWriter<$Request$, $Response$> $Service$::Stub::$Name$(\n"
              "    const ::zrpc::CallOptions& options) {\n"
              "  return ::zrpc::$Form$ClientReaderWriter<$Request$, $Response$>(\n"
              "      ::zrpc::internal::OpenClientStream<$Response$>(\n"
              "          channel_, $Qualified$::kMethods[$index$], nullptr, nullptr, options));\n"
              "}\n\n");
    }
  }
  const char* params = kind == "server"   ? "const $Request$&, ::zrpc::ServerWriter<$Response$>*"
                       : kind == "client" ? "::zrpc::ServerReader<$Request$>*, $Response$*"
                                          : "::zrpc::ServerReaderWriter<$Request$, $Response$>*";
  p.Print(vars, "::absl::Status $Service$::Service::$Method$(::zrpc::ServerContext&,\n    ");
  p.Print(vars, params);
  p.Print(vars,
          ") {\n"
          "  return ::absl::UnimplementedError(\"$full_name$ is not implemented\");\n"
          "}\n\n");
  p.Print(vars, "void $Service$::AsyncService::$Method$(\n    ::std::unique_ptr<");
  p.Print(vars, AsyncStreamClass(kind));
  p.Print(vars,
          "> call) {\n"
          "  call->Finish(::absl::UnimplementedError(\"$full_name$ is not implemented\"));\n"
          "}\n\n");
}

void PrintSourceMembers(Printer& p, const ServiceCode& code) {
  const std::vector<Vars>& methods = code.methods;
  const Vars& svars = code.vars;
  p.Print(svars,
          "const ::zrpc::ServiceInfo& $Service$::service_info() { return $Qualified$::kInfo; }\n\n"
          "const ::zrpc::ServiceInfo& $Service$::Service::service_info() const {\n"
          "  return $Qualified$::kInfo;\n"
          "}\n\n"
          "const ::zrpc::ServiceInfo& $Service$::AsyncService::service_info() const {\n"
          "  return $Qualified$::kInfo;\n"
          "}\n\n");
  for (const Vars& vars : methods) {
    const std::string& kind = vars.at("kind");
    if (kind != "unary") {
      PrintStreamingMembers(p, vars);
      continue;
    }
    p.Print(vars,
            "::absl::Status $Service$::Stub::$Method$(const $Request$& request,$def_stub_in$\n"
            "    $Response$* response,$def_stub_out$ const ::zrpc::CallOptions& options) {\n"
            "  return ::zrpc::internal::UnaryCall(channel_, $Qualified$::kMethods[$index$],\n"
            "      request, $pass_stub_in$, response, $pass_stub_out$, options);\n"
            "}\n\n"
            "void $Service$::Stub::$AsyncMethod$(const $Request$& request,$def_stub_in$\n"
            "    $Response$* response,$def_stub_out$ const ::zrpc::CallOptions& options,\n"
            "    ::zrpc::DoneCallback done) {\n"
            "  ::zrpc::internal::AsyncUnaryCall(channel_, $Qualified$::kMethods[$index$],\n"
            "      request, $pass_stub_in$, response, $pass_stub_out$, options,\n"
            "      ::std::move(done));\n"
            "}\n\n"
            "// Not overridden: $Method$ is served by $AsyncMethod$ (rpc/generated_api.h).\n"
            "::absl::Status $Service$::Service::$Method$(::zrpc::ServerContext& context,\n"
            "    const $Request$&,$default_in$ $Response$*$default_out$) {\n"
            "  return ::zrpc::internal::AnswerLater(context, $Qualified$::kMethods[$index$]"
            "$pass_default_in$);\n"
            "}\n\n"
            "void $Service$::Service::$AsyncMethod$(::std::unique_ptr<::zrpc::PendingCall<\n"
            "    $Request$, $Response$>> call) {\n"
            "  call->Finish(::absl::UnimplementedError(\"$full_name$ is not implemented\"));\n"
            "}\n\n"
            "void $Service$::AsyncService::$Method$(::std::unique_ptr<::zrpc::PendingCall<\n"
            "    $Request$, $Response$>> call) {\n"
            "  call->Finish(::absl::UnimplementedError(\"$full_name$ is not implemented\"));\n"
            "}\n\n");
  }
  PrintDispatch(p, code, "Service",
                "    case $index$:\n"
                "      ::zrpc::internal::HandleUnary<$Request$, $Response$>(\n"
                "          call, $Qualified$::kMethods[$index$],\n"
                "          [this](::zrpc::ServerContext& context, const $Request$& request,\n"
                "                 ::zrpc::IncomingBulk$lambda_in$, $Response$* response,\n"
                "                 ::zrpc::OutgoingBulk*$lambda_out$) {\n"
                "            return this->$Method$(context, request,$pass_handler_in$ response"
                "$pass_handler_out$);\n"
                "          },\n"
                "          [this](auto pending) { this->$AsyncMethod$(::std::move(pending)); });\n"
                "      return;\n");
  // The handler takes the PendingCall whatever the method's payloads: they travel inside it.
  PrintDispatch(p, code, "AsyncService",
                "    case $index$:\n"
                "      ::zrpc::internal::HandleUnaryLater<$Request$, $Response$>(\n"
                "          call, $Qualified$::kMethods[$index$],\n"
                "          [this](auto pending) { this->$Method$(::std::move(pending)); });\n"
                "      return;\n");
}

void OpenNamespaces(Printer& p, const std::vector<std::string>& namespaces) {
  for (const std::string& ns : namespaces) p.Print({{"ns", ns}}, "namespace $ns$ {\n");
  if (!namespaces.empty()) p.Print("\n");
}

void CloseNamespaces(Printer& p, const std::vector<std::string>& namespaces) {
  for (auto it = namespaces.rbegin(); it != namespaces.rend(); ++it) {
    p.Print({{"ns", *it}}, "}  // namespace $ns$\n");
  }
}

void PrintPreamble(Printer& p, const FileDescriptor* file) {
  p.Print({{"source", file->name()}},
          "// Generated by protoc-gen-zrpc. DO NOT EDIT.\n"
          "// source: $source$\n\n");
}

}  // namespace

bool ZrpcGenerator::Generate(const FileDescriptor* file, const std::string& parameter,
                             GeneratorContext* context, std::string* error) const {
  if (!parameter.empty()) {
    *error = "protoc-gen-zrpc takes no parameters, got '" + parameter + "'";
    return false;
  }
  if (!CheckSupported(file, error)) return false;
  const std::string base = StripProto(file->name());
  const std::vector<std::string> namespaces = PackageNamespaces(file->package());
  std::string qualified_namespace;
  for (const std::string& ns : namespaces) qualified_namespace += "::" + ns;
  const std::vector<std::string> classes = ServiceClassNames(file);
  std::vector<ServiceCode> services;
  for (int s = 0; s < file->service_count(); ++s) {
    services.push_back(DescribeService(file->service(s), classes[s], qualified_namespace));
  }
  {
    std::unique_ptr<google::protobuf::io::ZeroCopyOutputStream> out(
        context->Open(base + ".zrpc.h"));
    Printer p(out.get(), '$');
    PrintPreamble(p, file);
    const std::string guard = HeaderGuard(file->name());
    bool streaming = false;
    for (int s = 0; s < file->service_count(); ++s) {
      for (int m = 0; m < file->service(s)->method_count(); ++m) {
        const MethodDescriptor* method = file->service(s)->method(m);
        streaming = streaming || method->client_streaming() || method->server_streaming();
      }
    }
    p.Print({{"guard", guard}, {"base", base}},
            "#ifndef $guard$\n"
            "#define $guard$\n\n"
            "#include \"$base$.pb.h\"\n"
            "#include \"rpc/generated_api.h\"\n");
    if (streaming) p.Print("#include \"rpc/streaming.h\"\n");
    p.Print("\n");
    OpenNamespaces(p, namespaces);
    for (const ServiceCode& code : services) PrintHeaderService(p, code);
    CloseNamespaces(p, namespaces);
    p.Print({{"guard", guard}}, "\n#endif  // $guard$\n");
  }
  {
    std::unique_ptr<google::protobuf::io::ZeroCopyOutputStream> out(
        context->Open(base + ".zrpc.cc"));
    Printer p(out.get(), '$');
    PrintPreamble(p, file);
    p.Print({{"base", base}},
            "#include \"$base$.zrpc.h\"\n\n"
            "#include <memory>\n"
            "#include <string>\n"
            "#include <utility>\n\n");
    OpenNamespaces(p, namespaces);
    for (const ServiceCode& code : services) PrintSourceTables(p, code);
    for (const ServiceCode& code : services) PrintSourceMembers(p, code);
    CloseNamespaces(p, namespaces);
  }
  return true;
}

}  // namespace zrpc::codegen
