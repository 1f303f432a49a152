// protoc-gen-zrpc's code generator: for each .proto it writes NAME.zrpc.h and NAME.zrpc.cc with,
// per service, a client stub and two server base classes over rpc/generated_api.h (and
// rpc/streaming.h in a file with a streaming rpc). Rpcs of every kind are generated: unary,
// server streaming, client streaming and bidirectional, each with a blocking and an asynchronous
// stub method. The blocking base class, Service, has handlers that answer by returning a Status
// (a streaming one on a thread of its own) and, for each unary rpc, an Async<Method> twin that
// takes its call as a ::zrpc::PendingCall; the asynchronous one, AsyncService, has only handlers
// that own their call (a PendingCall, or for a streaming rpc a ::zrpc::ServerAsyncWriter, Reader
// or ReaderWriter) and finish it later, from any thread. Every type is named with the rpc's
// request type first, then its response type (rpc/streaming.h).
//
// Naming (tests/codegen/tricky, tests/codegen/file_options and plugin_fuzz_test hold the cases):
// - The service class lives in the C++ namespace protobuf uses for the file's package, named as in
//   the .proto, plus "_" when that is a C++ keyword, a macro (standard ones such as EOF and errno,
//   and those of the headers around generated code, such as EPIPE, NAN and alloca: IsHeaderMacro in
//   cpp_names.h), one of the class's own members (Stub, Service, AsyncService, service_info,
//   kMethods, kInfo) or a name protobuf's C++ for the file declares in that namespace
//   (ProtobufCppNames in cpp_names.h). In a file with `option cc_generic_services = true` (files
//   written for brpc, sofa-pbrpc and other stacks on protobuf's generic services) that is every
//   service's own name: protobuf declares its google::protobuf::Service Foo and Foo_Stub, so zrpc's
//   class is Foo_, with Foo_::Stub, Foo_::Service and Foo_::AsyncService. Elsewhere it is rare
//   (service Outer_Inner beside message Outer { message Inner }). A renamed service takes more
//   underscores until it clashes with none of those names, no service's .proto name and no other
//   service's class, so what protobuf generates under any file option (generic services,
//   optimize_for = SPEED, CODE_SIZE, LITE_RUNTIME) never collides with it. Each renamed class says
//   so in a comment.
// - Inside it, `Stub` (client), `Service` (blocking server base) and `AsyncService` (asynchronous
//   server base). An rpc keeps its name unless that is a keyword, a macro (as above: rpc EPIPE is
//   served by EPIPE_ and called as EPIPE_ and AsyncEPIPE_) or a name the generated classes use
//   themselves (Stub, Service, AsyncService, Dispatch, service_info, channel_,
//   serves_streams_async, handlers_async), or two generated members would collide (rpc `Foo` makes
//   `AsyncFoo`); then it gets a trailing underscore, as protobuf does for fields. The method table
//   keeps the .proto names. Handlers of Service and AsyncService share the rpc's name.
// - Generated code names everything it uses fully qualified (::zrpc, ::absl, ::std, the service's
//   own tables), so no .proto name can hide it.
// - The header's include guard is ZRPC_GENERATED_, the .proto's path escaped one to one (letters
//   and digits kept, any other byte as _ and two hex digits), then _ZRPC_H_: distinct files,
//   distinct guards, so any two headers may be included together.
//
// Refused with an error, which protoc prints after the file's name, naming the service and method
// where there is one: a server-streaming rpc marked (zrpc.method).request_bulk or a
// client-streaming one marked response_bulk (the option marks a stream's messages, and that
// single message is none of them); packages with a keyword or an object-like macro as a part (EOF,
// NAN: protobuf's C++ for them, or zrpc's after the headers that define the macro, does not
// compile); the package zrpc, zrpc.X for a name X the runtime declares in namespace zrpc
// (zrpc.Channel, zrpc.internal, ...), and std, absl and packages inside them; package-less types
// named like globals generated code needs (zrpc, std, size_t, ...); plugin parameters (there are
// none).
#ifndef ZRPC_CODEGEN_ZRPC_GENERATOR_H_
#define ZRPC_CODEGEN_ZRPC_GENERATOR_H_

#include <google/protobuf/compiler/code_generator.h>

#include <string>

namespace zrpc::codegen {

class ZrpcGenerator : public google::protobuf::compiler::CodeGenerator {
 public:
  bool Generate(const google::protobuf::FileDescriptor* file, const std::string& parameter,
                google::protobuf::compiler::GeneratorContext* context,
                std::string* error) const override;
  uint64_t GetSupportedFeatures() const override { return FEATURE_PROTO3_OPTIONAL; }
};

}  // namespace zrpc::codegen

#endif  // ZRPC_CODEGEN_ZRPC_GENERATOR_H_
