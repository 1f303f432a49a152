#!/usr/bin/env bash
# codegen/list_header_macros.sh ROOT SCRATCH: the macros that code protoc-gen-zrpc generates can
# meet, one a line as "object NAME" or "function NAME", sorted by name.
#
# Generated code comes after what it includes (NAME.pb.h, rpc/generated_api.h, rpc/streaming.h,
# <memory>, <string>, <utility>) and usually beside rpc/zrpc.h and transport/log.h, the headers
# of @zrpc: an rpc or service named like a macro any of them defines is expanded there and does
# not compile. This preprocesses one unit that includes all of them, with .pb.h files protoc
# writes for probe files that use what changes a .pb.h's includes (every well-known type, zrpc's
# options, maps, enums, oneofs, extensions, generic services, LITE_RUNTIME), and prints what is
# defined at its end. Left out: names C++ reserves for the implementation (a leading underscore
# and a capital, or a double underscore: which of those are defined changes with compiler flags,
# and no .proto name should use them), the include guards of zrpc's headers (ZRPC_..._H_: the
# generator renames every name of that form) and the probe files' own header guards.
#
# ROOT holds zrpc's rpc/, transport/ and proto/zrpc/options.proto (the workspace, or a test's
# runfiles); SCRATCH is a directory to write in. tools/update-header-macros turns the list into
# codegen/header_macros.inc; tests/codegen:reserved_names_test checks the generator renames each.
set -euo pipefail
if (($# != 2)); then
  echo "usage: $0 ROOT SCRATCH" >&2
  exit 2
fi
root=$(cd "$1" && pwd)
scratch=$2
probe=zrpc_macro_probe
mkdir -p "$scratch/$probe"

cat >"$scratch/$probe/full.proto" <<'EOF'
syntax = "proto3";
package probe.full;
import "google/protobuf/any.proto";
import "google/protobuf/api.proto";
import "google/protobuf/descriptor.proto";
import "google/protobuf/duration.proto";
import "google/protobuf/empty.proto";
import "google/protobuf/field_mask.proto";
import "google/protobuf/source_context.proto";
import "google/protobuf/struct.proto";
import "google/protobuf/timestamp.proto";
import "google/protobuf/type.proto";
import "google/protobuf/wrappers.proto";
import "proto/zrpc/options.proto";
enum Kind { KIND_UNSPECIFIED = 0; }
message M {
  map<string, M> children = 1;
  oneof choice { string text = 2; bytes data = 3; }
  optional Kind kind = 4;
  repeated google.protobuf.Any any = 5;
  google.protobuf.Duration duration = 6;
  google.protobuf.Timestamp timestamp = 7;
  google.protobuf.Struct value = 8;
  google.protobuf.Empty empty = 9;
  google.protobuf.Api api = 10;
  google.protobuf.FieldMask mask = 11;
  google.protobuf.SourceContext context = 12;
  google.protobuf.Type type = 13;
  google.protobuf.Int32Value wrapped = 14;
  google.protobuf.FileDescriptorProto file = 15;
}
service S {
  rpc Put(M) returns (M) { option (zrpc.method).request_bulk = true; }
  rpc Chat(stream M) returns (stream M);
}
EOF
cat >"$scratch/$probe/legacy.proto" <<'EOF'
syntax = "proto2";
package probe.legacy;
option cc_generic_services = true;
option optimize_for = CODE_SIZE;
message M { extensions 100 to 200; optional int32 n = 1; }
extend M { optional string note = 100; }
service S { rpc Get(M) returns (M); }
EOF
cat >"$scratch/$probe/lite.proto" <<'EOF'
syntax = "proto3";
package probe.lite;
option optimize_for = LITE_RUNTIME;
enum Kind { KIND_UNSPECIFIED = 0; }
message M { map<int32, M> children = 1; Kind kind = 2; oneof o { int64 i = 3; } }
service S { rpc Get(M) returns (M); }
EOF

cd "$scratch"
/usr/bin/protoc -I. -I"$root" --cpp_out=. "$probe/full.proto" "$probe/legacy.proto" \
  "$probe/lite.proto" "$root/proto/zrpc/options.proto"
cat >unit.cc <<EOF
#include "$probe/full.pb.h"
#include "$probe/legacy.pb.h"
#include "$probe/lite.pb.h"
#include "rpc/generated_api.h"
#include "rpc/streaming.h"
#include "rpc/zrpc.h"
#include "transport/log.h"

#include <memory>
#include <string>
#include <utility>
EOF
# -dM prints each macro as "#define NAME BODY" or "#define NAME(PARAMS) BODY".
g++ -std=c++17 -E -dM -I. -I"$root" unit.cc |
  awk '$1 == "#define" {
    name = $2
    kind = "object"
    if (index(name, "(") > 0) {
      name = substr(name, 1, index(name, "(") - 1)
      kind = "function"
    }
    if (name ~ /^_[A-Z_]/ || name ~ /__/ || name ~ /^ZRPC_.*_H_$/ || name ~ /zrpc_5fmacro_5fprobe/) next
    print kind, name
  }' |
  LC_ALL=C sort -k2,2 -u
