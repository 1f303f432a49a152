// C++ spellings of .proto names. A service or method name that is a C++ keyword, or a macro the
// standard headers define (EOF, errno, assert, ...), gets a trailing underscore (protobuf's rule
// for fields); a package a.b.c becomes namespaces a, b, c, spelled as protobuf's C++ generator
// spells them, i.e. unchanged.
#ifndef ZRPC_CODEGEN_CPP_NAMES_H_
#define ZRPC_CODEGEN_CPP_NAMES_H_

#include <string>
#include <vector>

namespace zrpc::codegen {

bool IsCppKeyword(const std::string& name);

// A macro of the C/C++ standard headers (or predefined in GNU mode): as an identifier it would
// be expanded.
bool IsStandardMacro(const std::string& name);

// `name`, or `name` + "_" when it is a keyword or a standard macro (above).
std::string CppIdentifier(const std::string& name);

// Why generated C++ for `package` cannot work, or "" when it can: a part that is a keyword or an
// object-like standard macro (EOF; `assert` or GNU's `linux` are fine as namespaces); the
// namespace zrpc or one of the runtime's names right below it; a package inside std or absl.
std::string ReservedPackageReason(const std::string& package);

// A global name generated code relies on (::zrpc, ::absl, ::std, ::google, the <cstdint> and
// <cstddef> types): a type declared without a package may not take it.
bool IsReservedGlobalName(const std::string& name);

// "a.b.c" -> {"a", "b", "c"}; "" -> {}.
std::vector<std::string> PackageNamespaces(const std::string& package);

}  // namespace zrpc::codegen

#endif  // ZRPC_CODEGEN_CPP_NAMES_H_
