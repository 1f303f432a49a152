// Generated stubs and service base classes, run end to end through an in-process channel.
#include <catch2/catch.hpp>
#include <string>

#include "proto/examples/greeter.zrpc.h"
#include "tests/codegen/deep/mirror.zrpc.h"
#include "tests/codegen/deep/router.zrpc.h"
#include "tests/codegen/loopback_channel.h"
#include "tests/codegen/tricky/tricky.zrpc.h"

namespace {

using zrpc::testing::LoopbackCall;
using zrpc::testing::LoopbackChannel;
using zrpc::examples::Greeter;
using zrpc::examples::HelloReply;
using zrpc::examples::HelloRequest;

class GreeterImpl : public Greeter::Service {
 public:
  absl::Status SayHello(zrpc::ServerContext&, const HelloRequest& request,
                        HelloReply* response) override {
    if (request.name().empty()) return absl::InvalidArgumentError("name is empty");
    response->set_message("Hello, " + request.name());
    return absl::OkStatus();
  }
};

}  // namespace

TEST_CASE("a stub call reaches the overridden handler and returns its response", "[codegen]") {
  GreeterImpl impl;
  LoopbackChannel channel(&impl);
  Greeter::Stub stub(&channel);
  HelloRequest request;
  request.set_name("zrpc");
  HelloReply reply;
  absl::Status status = stub.SayHello(request, &reply);
  REQUIRE(status.ok());
  CHECK(reply.message() == "Hello, zrpc");
  CHECK(channel.last_method == "zrpc.examples.Greeter/SayHello");
}

TEST_CASE("the request is serialized straight into the slot, at its exact size", "[codegen]") {
  GreeterImpl impl;
  LoopbackChannel channel(&impl);
  Greeter::Stub stub(&channel);
  HelloRequest request;
  request.set_name(std::string(1000, 'x'));
  HelloReply reply;
  REQUIRE(stub.SayHello(request, &reply).ok());
  // The slot was poisoned; it now holds exactly the serialization, no byte more or less.
  CHECK(channel.last_request == request.SerializeAsString());
}

TEST_CASE("handler errors and unimplemented rpcs come back as statuses", "[codegen]") {
  GreeterImpl impl;
  LoopbackChannel channel(&impl);
  Greeter::Stub stub(&channel);
  HelloReply reply;
  absl::Status invalid = stub.SayHello(HelloRequest(), &reply);
  CHECK(invalid.code() == absl::StatusCode::kInvalidArgument);
  CHECK(invalid.message() == "name is empty");

  google::protobuf::Empty empty;
  absl::Status unimplemented = stub.Ping(empty, &empty);
  CHECK(unimplemented.code() == absl::StatusCode::kUnimplemented);
  CHECK(std::string(unimplemented.message()).find("zrpc.examples.Greeter/Ping") !=
        std::string::npos);
}

TEST_CASE("the async form calls done exactly once", "[codegen]") {
  GreeterImpl impl;
  LoopbackChannel channel(&impl);
  Greeter::Stub stub(&channel);
  HelloRequest request;
  request.set_name("async");
  HelloReply reply;
  int done_calls = 0;
  absl::Status result = absl::UnknownError("not called");
  stub.AsyncSayHello(request, &reply, zrpc::CallOptions::Timeout(absl::Seconds(5)),
                     [&](absl::Status s) {
                       ++done_calls;
                       result = s;
                     });
  CHECK(done_calls == 1);
  CHECK(result.ok());
  CHECK(reply.message() == "Hello, async");
}

TEST_CASE("a slot that cannot be had fails the call without sending it", "[codegen]") {
  GreeterImpl impl;
  LoopbackChannel channel(&impl);
  channel.acquire_error = absl::ResourceExhaustedError("no send slot");
  Greeter::Stub stub(&channel);
  HelloRequest request;
  request.set_name("x");
  HelloReply reply;
  CHECK(stub.SayHello(request, &reply).code() == absl::StatusCode::kResourceExhausted);
  CHECK(channel.calls == 0);
}

TEST_CASE("the method table has full names in .proto order", "[codegen]") {
  const zrpc::ServiceInfo& info = Greeter::service_info();
  CHECK(std::string(info.full_name) == "zrpc.examples.Greeter");
  REQUIRE(info.method_count == 2);
  CHECK(std::string(info.methods[0].full_name) == "zrpc.examples.Greeter/SayHello");
  CHECK(info.methods[0].index == 0);
  CHECK(std::string(info.methods[1].full_name) == "zrpc.examples.Greeter/Ping");
  CHECK(info.methods[1].index == 1);
  GreeterImpl impl;
  CHECK(&impl.service_info() == &info);
}

TEST_CASE("a request that does not parse, or an unknown index, is refused", "[codegen]") {
  GreeterImpl impl;
  LoopbackCall garbage(std::string("\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01", 11));
  impl.Dispatch(0, &garbage);
  CHECK(garbage.finish_calls == 1);
  CHECK(garbage.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(garbage.status().message()).find("zrpc.examples.HelloRequest") !=
        std::string::npos);

  LoopbackCall unknown("");
  impl.Dispatch(7, &unknown);
  CHECK(unknown.finish_calls == 1);
  CHECK(unknown.status().code() == absl::StatusCode::kUnimplemented);
}

namespace {

namespace tricky = zrpc::test::tricky;
using zrpc::test::common::Nothing;
using zrpc::test::common::Payload;

// Overrides every renamed handler; each tags its response so the test sees who answered.
class TrickyImpl : public tricky::Service_::Service {
 public:
  absl::Status delete_(zrpc::ServerContext&, const tricky::Empty&, tricky::Empty*) override {
    return absl::OkStatus();
  }
  absl::Status Stub_(zrpc::ServerContext&, const Payload& in, Payload* out) override {
    out->set_data("Stub:" + in.data());
    return absl::OkStatus();
  }
  absl::Status Dispatch_(zrpc::ServerContext&, const google::protobuf::Empty&,
                         Nothing*) override {
    return absl::OkStatus();
  }
  absl::Status Echo(zrpc::ServerContext&, const Payload& in, Payload* out) override {
    out->set_data("Echo:" + in.data());
    return absl::OkStatus();
  }
  absl::Status AsyncEcho(zrpc::ServerContext&, const Payload& in, Payload* out) override {
    out->set_data("AsyncEcho:" + in.data());
    return absl::OkStatus();
  }
};

}  // namespace

TEST_CASE("rpcs named like keywords or generated members get a trailing underscore",
          "[codegen][names]") {
  TrickyImpl impl;
  LoopbackChannel channel(&impl);
  tricky::Service_::Stub stub(&channel);
  tricky::Empty empty;
  CHECK(stub.delete_(empty, &empty).ok());
  CHECK(channel.last_method == "zrpc.test.tricky.Service/delete");
  Payload in, out;
  in.set_data("x");
  REQUIRE(stub.Stub_(in, &out).ok());
  CHECK(out.data() == "Stub:x");
  google::protobuf::Empty wkt;
  Nothing nothing;
  CHECK(stub.Dispatch_(wkt, &nothing).ok());
  CHECK(stub.service_info_(empty, &empty).code() == absl::StatusCode::kUnimplemented);
}

TEST_CASE("rpc AsyncEcho keeps its name; Echo's async twin becomes AsyncEcho_",
          "[codegen][names]") {
  TrickyImpl impl;
  LoopbackChannel channel(&impl);
  tricky::Service_::Stub stub(&channel);
  Payload in, out;
  in.set_data("y");
  REQUIRE(stub.AsyncEcho(in, &out).ok());  // the blocking form of rpc AsyncEcho
  CHECK(out.data() == "AsyncEcho:y");
  absl::Status status = absl::UnknownError("not called");
  stub.AsyncEcho_(in, &out, {}, [&](absl::Status s) { status = s; });  // async form of Echo
  CHECK(status.ok());
  CHECK(out.data() == "Echo:y");
}

TEST_CASE("a service with no methods and one named like a keyword still work",
          "[codegen][names]") {
  CHECK(tricky::Idle::service_info().method_count == 0);
  CHECK(std::string(tricky::namespace_::service_info().full_name) == "zrpc.test.tricky.namespace");
  tricky::Idle::Service idle;
  LoopbackCall call("");
  idle.Dispatch(0, &call);
  CHECK(call.status().code() == absl::StatusCode::kUnimplemented);
}

namespace {
class RouterImpl : public zrpc::test::deep::Router::Service {
 public:
  absl::Status Route(zrpc::ServerContext&, const zrpc::test::deep::middle::Path& path,
                     zrpc::test::deep::base::Point* last) override {
    if (path.points().empty()) return absl::InvalidArgumentError("empty path");
    *last = path.points(path.points_size() - 1);
    return absl::OkStatus();
  }
};
}  // namespace

TEST_CASE("a service over types imported two levels down, across packages, works", "[codegen]") {
  RouterImpl impl;
  LoopbackChannel channel(&impl);
  zrpc::test::deep::Router::Stub stub(&channel);
  zrpc::test::deep::middle::Path path;
  path.mutable_at()->set_seconds(1700000000);
  for (int i = 1; i <= 3; ++i) {
    auto* p = path.add_points();
    p->set_x(i);
    p->set_y(-i);
  }
  zrpc::test::deep::base::Point last;
  REQUIRE(stub.Route(path, &last).ok());
  CHECK(last.x() == 3);
  CHECK(last.y() == -3);
  CHECK(channel.last_method == "zrpc.test.deep.Router/Route");
  // The second file of the same target generated its own service.
  zrpc::test::deep::Mirror::Service mirror;
  CHECK(mirror.service_info().method_count == 1);
}
