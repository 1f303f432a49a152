// Generated code from a workspace that uses zrpc as the external repository @zrpc.
#include <catch2/catch.hpp>
#include <string>

#include "app/echo.zrpc.h"
#include "tests/codegen/loopback_channel.h"

namespace {

class EchoImpl : public consumer::Echo::Service {
 public:
  absl::Status Hello(zrpc::ServerContext&, const zrpc::examples::HelloRequest& request,
                     zrpc::examples::HelloReply* reply) override {
    reply->set_message("hello " + request.name());
    return absl::OkStatus();
  }
  absl::Status Reflect(zrpc::ServerContext&, const zrpc::examples::HelloRequest&,
                       zrpc::IncomingBulk request_bulk, zrpc::examples::HelloReply* reply,
                       zrpc::OutgoingBulk* response_bulk) override {
    reply->set_message(std::to_string(request_bulk.size()));
    *response_bulk = zrpc::OutgoingBulk::Copy(std::string(request_bulk.view()));
    return absl::OkStatus();
  }
};

}  // namespace

TEST_CASE("a service generated in a workspace that uses zrpc as @zrpc works end to end",
          "[consumer]") {
  EchoImpl impl;
  zrpc::testing::LoopbackChannel channel(&impl);
  consumer::Echo::Stub stub(&channel);
  zrpc::examples::HelloRequest request;
  request.set_name("consumer");
  zrpc::examples::HelloReply reply;
  REQUIRE(stub.Hello(request, &reply).ok());
  CHECK(reply.message() == "hello consumer");

  zrpc::IncomingBulk back;
  REQUIRE(stub.Reflect(request, zrpc::OutgoingBulk::Copy("round trip"), &reply, &back).ok());
  CHECK(reply.message() == "10");
  CHECK(back.view() == "round trip");
}
