// PendingCall as a release build (NDEBUG) compiles it: a second Finish is a no-op there, where a
// debug build asserts. This file alone is built with -DNDEBUG (see BUILD.bazel).
#ifndef NDEBUG
#error "build this test with -DNDEBUG"
#endif

#include <google/protobuf/empty.pb.h>

#include <catch2/catch.hpp>
#include <memory>
#include <string>

#include "rpc/generated_api.h"
#include "tests/codegen/loopback_channel.h"

namespace {

using Empty = google::protobuf::Empty;
using zrpc::testing::LoopbackCall;

const zrpc::MethodInfo kMethod = {"test.Release/Twice", 0, false, false, false, false, false};

}  // namespace

TEST_CASE("in a release build, a second Finish does nothing and the first status stands",
          "[codegen][async]") {
  LoopbackCall call("");
  zrpc::PendingCall<Empty, Empty> pending(&call, kMethod, Empty());
  pending.Finish(absl::OkStatus());
  pending.Finish(absl::InternalError("second"));
  CHECK(call.finish_calls == 1);
  CHECK(call.status().ok());
  CHECK(call.uses_after_finish == 0);
  // Past Finish, a request payload is gone with the call: empty, without touching it.
  CHECK(pending.TakeRequestBulk().empty());
  CHECK(call.uses_after_finish == 0);
}

TEST_CASE("in a release build, a dropped PendingCall still finishes its call once",
          "[codegen][async]") {
  LoopbackCall call("");
  {
    zrpc::PendingCall<Empty, Empty> pending(&call, kMethod, Empty());
    zrpc::PendingCall<Empty, Empty> moved(std::move(pending));
  }
  CHECK(call.finish_calls == 1);
  CHECK(call.status().code() == absl::StatusCode::kInternal);
  CHECK(call.status().message() ==
        "test.Release/Twice: handler dropped the call without finishing it");
}
