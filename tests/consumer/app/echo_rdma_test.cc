// A server and a channel built in a workspace of the user's own (zrpc is @zrpc), over the RDMA
// device, with nothing but the public API and default options: the device comes from the
// environment (tools/softroce sets ZRPC_RDMA_*), the server listens on any free port.
#include <catch2/catch.hpp>
#include <memory>
#include <string>
#include <thread>

#include "absl/time/clock.h"
#include "app/echo.zrpc.h"
#include "rpc/channel.h"
#include "rpc/server.h"
#include "tests/rdma_device.h"

namespace {

using zrpc::examples::HelloReply;
using zrpc::examples::HelloRequest;

class EchoImpl : public consumer::Echo::Service {
 public:
  absl::Status Hello(zrpc::ServerContext&, const HelloRequest& request,
                     HelloReply* reply) override {
    if (request.name() == "slow") absl::SleepFor(absl::Milliseconds(500));
    reply->set_message("hello " + request.name());
    return absl::OkStatus();
  }
  // Reflect in the async form, answered from a thread of its own: one service mixes both.
  void AsyncReflect(std::unique_ptr<zrpc::PendingCall<HelloRequest, HelloReply>> call) override {
    worker_ = std::thread([call = std::move(call)]() mutable {
      zrpc::IncomingBulk in = call->TakeRequestBulk();
      call->response()->set_message(std::to_string(in.size()));
      *call->response_bulk() = zrpc::OutgoingBulk::Copy(std::string(in.view()));
      in.Reset();
      call->Finish(absl::OkStatus());
    });
  }
  ~EchoImpl() override {
    if (worker_.joinable()) worker_.join();
  }

 private:
  std::thread worker_;  // one Reflect at a time in this test
};

}  // namespace

TEST_CASE("a workspace using @zrpc serves and calls over the RDMA device", "[consumer][rdma]") {
  ZRPC_REQUIRE_RDMA_DEVICE(device);  // only to skip loudly where there is none
  (void)device;
  EchoImpl impl;
  auto server = zrpc::Server::Create(zrpc::ServerOptions{});
  INFO(server.status());
  REQUIRE(server.ok());
  REQUIRE((*server)->AddService(&impl).ok());
  REQUIRE((*server)->Start().ok());

  auto channel = zrpc::CreateChannel((*server)->address() + ":" + std::to_string((*server)->port()),
                                     zrpc::ChannelOptions{});
  INFO(channel.status());
  REQUIRE(channel.ok());
  consumer::Echo::Stub stub(channel->get());

  HelloRequest request;
  request.set_name("consumer");
  HelloReply reply;
  absl::Status s = stub.Hello(request, &reply);
  INFO(s);
  REQUIRE(s.ok());
  CHECK(reply.message() == "hello consumer");

  const std::string payload(64 * 1024, 'z');
  zrpc::IncomingBulk back;
  s = stub.Reflect(request, zrpc::OutgoingBulk::Copy(payload), &reply, &back);
  INFO(s);
  REQUIRE(s.ok());
  CHECK(reply.message() == std::to_string(payload.size()));
  CHECK(back.view() == payload);
  back = zrpc::IncomingBulk();

  request.set_name("slow");
  s = stub.Hello(request, &reply, zrpc::CallOptions::Timeout(absl::Milliseconds(100)));
  CHECK(s.code() == absl::StatusCode::kDeadlineExceeded);

  channel->reset();
  (*server)->Shutdown(absl::Seconds(2));
}
