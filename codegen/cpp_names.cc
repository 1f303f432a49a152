#include "codegen/cpp_names.h"

#include <string>

// Exported by libprotoc but declared only in cpp/helpers.h, which needs headers Debian does not
// ship. Using protobuf's own keyword list keeps our namespaces identical to the messages'.
namespace google::protobuf::compiler::cpp {
std::string ResolveKeyword(const std::string& name);
}  // namespace google::protobuf::compiler::cpp

namespace zrpc::codegen {

bool IsCppKeyword(const std::string& name) {
  return google::protobuf::compiler::cpp::ResolveKeyword(name) != name;
}

std::string CppIdentifier(const std::string& name) {
  return IsCppKeyword(name) ? name + "_" : name;
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
