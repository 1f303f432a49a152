// C++ spellings of .proto names. A service or method name that is a C++ keyword, or a macro the
// standard headers define (EOF, errno, assert, ...), gets a trailing underscore (protobuf's rule
// for fields); a package a.b.c becomes namespaces a, b, c, spelled as protobuf's C++ generator
// spells them, i.e. unchanged. ProtobufCppNames says which names protobuf's own C++ takes.
#ifndef ZRPC_CODEGEN_CPP_NAMES_H_
#define ZRPC_CODEGEN_CPP_NAMES_H_

#include <google/protobuf/descriptor.h>

#include <set>
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

// Every name protobuf's C++ generator (3.21, as Debian 12 ships it) declares for `file` in the
// file's package namespace (for a package-less file, the global namespace), under the file's
// options: generated code in that namespace must not declare any of them again.
// - Per message, nested ones flattened (Outer_Inner; a map field's entry is Outer_MEntry_DoNotUse):
//   the class, FooDefaultTypeInternal and _Foo_default_instance_.
// - Per enum E (Outer_E when nested): E, its values (top-level: as named, nested: Outer_E_V),
//   E_IsValid, E_Name, E_Parse, the bounds (E_MIN, E_MAX, E_ARRAYSIZE; nested: Outer_E_E_MIN, ...)
//   and, except under optimize_for = LITE_RUNTIME, E_descriptor.
// - Per top-level extension: its identifier and kFooFieldNumber.
// - With option cc_generic_services (ignored under LITE_RUNTIME, where protoc refuses it beside a
//   service): per service Foo, protobuf's google::protobuf::Service Foo and its Foo_Stub.
// - In a package-less file: the file's TableStruct_* and, except under LITE_RUNTIME,
//   descriptor_table_* globals.
std::set<std::string> ProtobufCppNames(const google::protobuf::FileDescriptor* file);

// "a.b.c" -> {"a", "b", "c"}; "" -> {}.
std::vector<std::string> PackageNamespaces(const std::string& package);

}  // namespace zrpc::codegen

#endif  // ZRPC_CODEGEN_CPP_NAMES_H_
