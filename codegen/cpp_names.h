// C++ spellings of .proto names. A service or method name that is a C++ keyword gets a trailing
// underscore (protobuf's rule for fields); a package a.b.c becomes namespaces a, b, c, spelled
// as protobuf's C++ generator spells them, i.e. unchanged.
#ifndef ZRPC_CODEGEN_CPP_NAMES_H_
#define ZRPC_CODEGEN_CPP_NAMES_H_

#include <string>
#include <vector>

namespace zrpc::codegen {

bool IsCppKeyword(const std::string& name);

// `name`, or `name` + "_" when it is a C++ keyword.
std::string CppIdentifier(const std::string& name);

// "a.b.c" -> {"a", "b", "c"}; "" -> {}.
std::vector<std::string> PackageNamespaces(const std::string& package);

}  // namespace zrpc::codegen

#endif  // ZRPC_CODEGEN_CPP_NAMES_H_
