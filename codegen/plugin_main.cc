// protoc-gen-zrpc: protoc --plugin=protoc-gen-zrpc=PATH --zrpc_out=DIR x.proto
#include <google/protobuf/compiler/plugin.h>

#include "codegen/zrpc_generator.h"

int main(int argc, char* argv[]) {
  zrpc::codegen::ZrpcGenerator generator;
  return google::protobuf::compiler::PluginMain(argc, argv, &generator);
}
