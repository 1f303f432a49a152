// C++ spellings of .proto names. A service or method name that is a C++ keyword, a macro the
// standard headers define (EOF, errno, assert, ...) or a macro of the headers around generated
// code (EPIPE, NAN, alloca, ...: IsHeaderMacro) gets a trailing underscore (protobuf's rule for
// fields); a package a.b.c becomes namespaces a, b, c, spelled as protobuf's C++ generator spells
// them, i.e. unchanged. ProtobufCppNames says which names protobuf's own C++ takes.
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

// A macro that code generated for any .proto can meet, so that an rpc or service named so would
// be expanded: one the headers it includes (NAME.pb.h, rpc/generated_api.h, rpc/streaming.h,
// <memory>, <string>, <utility>) or @zrpc's (rpc/zrpc.h, transport/log.h) define. Those are
// listed in codegen/header_macros.inc (codegen/list_header_macros.sh finds them with the
// preprocessor, tools/update-header-macros adds them; reserved_names_test fails when the headers
// define one it lacks), bar two kinds: names C++ reserves for the implementation (_Foo, a__b),
// and the include guards of zrpc's headers, runtime and generated, which are ZRPC_..._H_ and
// count by that form. Macros of other headers an application includes are beyond its reach.
bool IsHeaderMacro(const std::string& name);

// `name`, or `name` with a trailing underscore when it is a keyword or one of the macros above
// (with more underscores while it would still name such a macro).
std::string CppIdentifier(const std::string& name);

// Why generated C++ for `package` cannot work, or "" when it can: a part that is a keyword or an
// object-like macro, standard (EOF) or of the headers around generated code (NAN, EPIPE,
// ZRPC_..._H_); function-like ones (`assert`, `alloca`) and GNU's `linux` are fine as namespaces;
// the namespace zrpc or one of the runtime's names right below it; a package inside std or absl.
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
