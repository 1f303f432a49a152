// C++ spellings of .proto names, matching protobuf's own C++ generator: a name that is a C++
// keyword gets a trailing underscore; a package a.b.c becomes namespaces a, b, c.
#ifndef ZRPC_CODEGEN_CPP_NAMES_H_
#define ZRPC_CODEGEN_CPP_NAMES_H_

#include <string>
#include <vector>

namespace zrpc::codegen {

bool IsCppKeyword(const std::string& name);

// `name`, or `name` + "_" when it is a C++ keyword.
std::string CppIdentifier(const std::string& name);

// "a.b.c" -> {"a", "b", "c"}, each through CppIdentifier; "" -> {}.
std::vector<std::string> PackageNamespaces(const std::string& package);

}  // namespace zrpc::codegen

#endif  // ZRPC_CODEGEN_CPP_NAMES_H_
