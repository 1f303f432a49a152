// A program built against an installed zrpc (tests/installed/README.md): serves Echo and calls it
// over the RDMA device, with the public API and default options only. The device comes from the
// environment (ZRPC_RDMA_DEVICE and the rest, as tools/softroce sets them). Prints what it did;
// exits 0 when every call returned what it should, 1 otherwise.
#include <cstdio>
#include <string>

#include "echo.zrpc.h"
#include "rpc/zrpc.h"

namespace {

class EchoImpl : public installed::Echo::Service {
 public:
  absl::Status Say(zrpc::ServerContext&, const installed::Text& request,
                   installed::Text* reply) override {
    reply->set_text(request.text());
    return absl::OkStatus();
  }
  absl::Status Reflect(zrpc::ServerContext&, const installed::Text&,
                       zrpc::IncomingBulk request_bulk, installed::Text* reply,
                       zrpc::OutgoingBulk* reply_bulk) override {
    reply->set_text(std::to_string(request_bulk.size()));
    *reply_bulk = zrpc::OutgoingBulk::Copy(std::string(request_bulk.view()));
    return absl::OkStatus();
  }
};

int Fail(const char* what, const absl::Status& status) {
  std::fprintf(stderr, "echo_check: %s: %s\n", what, status.ToString().c_str());
  return 1;
}

}  // namespace

int main() {
  EchoImpl impl;
  auto server = zrpc::Server::Create(zrpc::ServerOptions{});
  absl::Status s = server.ok() ? (*server)->AddService(&impl) : server.status();
  if (s.ok()) s = (*server)->Start();
  if (!s.ok()) return Fail("serving", s);
  const std::string target = (*server)->address() + ":" + std::to_string((*server)->port());
  auto channel = zrpc::CreateChannel(target, zrpc::ChannelOptions{});
  if (!channel.ok()) return Fail("channel", channel.status());
  installed::Echo::Stub stub(channel->get());

  installed::Text request, reply;
  request.set_text("installed");
  s = stub.Say(request, &reply, zrpc::CallOptions::Timeout(absl::Seconds(10)));
  if (!s.ok()) return Fail("Say", s);
  if (reply.text() != "installed") return Fail("Say", absl::DataLossError(reply.text()));

  const std::string payload(1 << 20, 'z');  // beyond the arena: pulled by the server
  zrpc::IncomingBulk back;
  s = stub.Reflect(request, zrpc::OutgoingBulk::Copy(payload), &reply, &back,
                   zrpc::CallOptions::Timeout(absl::Seconds(30)));
  if (!s.ok()) return Fail("Reflect", s);
  if (reply.text() != std::to_string(payload.size()) || back.view() != payload) {
    return Fail("Reflect", absl::DataLossError("the payload came back changed"));
  }
  back = zrpc::IncomingBulk();
  std::printf("echo_check: Say and a 1 MiB Reflect over %s, served at %s\n",
              std::getenv("ZRPC_RDMA_DEVICE") ? std::getenv("ZRPC_RDMA_DEVICE") : "the device",
              target.c_str());
  channel->reset();
  (*server)->Shutdown(absl::Seconds(1));
  return 0;
}
