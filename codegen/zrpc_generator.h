// protoc-gen-zrpc's code generator: for each .proto it writes NAME.zrpc.h and NAME.zrpc.cc with,
// per service, a client stub and a server base class over rpc/generated_api.h.
//
// Naming: the service class lives in the C++ namespace protobuf uses for the file's package,
// named as in the .proto (plus "_" if a keyword, Stub or Service). Inside it, `Stub` (client) and `Service` (server base). An rpc keeps its name unless that
// name is a C++ keyword or one the generated classes use themselves (Stub, Service, Dispatch,
// service_info, channel_), or two generated members would collide (rpc `Foo` makes
// `AsyncFoo`); then it gets a trailing underscore, as protobuf does for fields. The method
// table keeps the .proto names.
//
// Refused with an error naming the file, service and method: streaming rpcs (not supported
// yet), packages with a C++ keyword as a part (protobuf's own C++ output for them does not
// compile) and plugin parameters (there are none).
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
