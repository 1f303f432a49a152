// Generated stubs and service base classes, run end to end through an in-process channel.
#include <atomic>
#include <catch2/catch.hpp>
#include <cctype>
#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/synchronization/notification.h"
#include "api/kv.zrpc.h"  // from the external repository @zrpc_ext
#include "proto/examples/greeter.zrpc.h"
#include "proto/examples/object_store.zrpc.h"
#include "tests/codegen/deep/mirror.zrpc.h"
#include "tests/codegen/deep/router.zrpc.h"
#include "tests/codegen/file_options/generic_services.zrpc.h"
#include "tests/codegen/file_options/lite.zrpc.h"
#include "tests/codegen/loopback_channel.h"
#include "tests/codegen/order/order.zrpc.h"
#include "tests/codegen/tricky/tricky.zrpc.h"

namespace {

using zrpc::examples::Greeter;
using zrpc::examples::HelloReply;
using zrpc::examples::HelloRequest;
using zrpc::testing::LoopbackCall;
using zrpc::testing::LoopbackChannel;

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
class TrickyImpl : public tricky::Service__::Service {
 public:
  absl::Status delete_(zrpc::ServerContext&, const tricky::Empty&, tricky::Empty*) override {
    return absl::OkStatus();
  }
  absl::Status Stub_(zrpc::ServerContext&, const Payload& in, Payload* out) override {
    out->set_data("Stub:" + in.data());
    return absl::OkStatus();
  }
  absl::Status Dispatch_(zrpc::ServerContext&, const google::protobuf::Empty&, Nothing*) override {
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
  tricky::Service__::Stub stub(&channel);
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
  CHECK(stub.handlers_async_(empty, &empty).code() == absl::StatusCode::kUnimplemented);
  // The Service (blocking) base says its handlers may block; the AsyncService base says not.
  CHECK_FALSE(impl.handlers_async());
}

TEST_CASE("rpc AsyncEcho keeps its name; Echo's async twin becomes AsyncEcho_",
          "[codegen][names]") {
  TrickyImpl impl;
  LoopbackChannel channel(&impl);
  tricky::Service__::Stub stub(&channel);
  Payload in, out;
  in.set_data("y");
  REQUIRE(stub.AsyncEcho(in, &out).ok());  // the blocking form of rpc AsyncEcho
  CHECK(out.data() == "AsyncEcho:y");
  absl::Status status = absl::UnknownError("not called");
  stub.AsyncEcho_(in, &out, {}, [&](absl::Status s) { status = s; });  // async form of Echo
  CHECK(status.ok());
  CHECK(out.data() == "Echo:y");
}

TEST_CASE("services renamed for C++ yield to names the .proto gave", "[codegen][names]") {
  // service Service needs a C++ rename, and service Service_ already has that name.
  CHECK(std::string(tricky::Service__::service_info().full_name) == "zrpc.test.tricky.Service");
  CHECK(std::string(tricky::Service_::service_info().full_name) == "zrpc.test.tricky.Service_");
  // kInfo is a member of every service class.
  CHECK(std::string(tricky::kInfo_::service_info().full_name) == "zrpc.test.tricky.kInfo");
  // Box_Item is protobuf's class for the nested message Box.Item.
  static_assert(std::is_base_of_v<google::protobuf::Message, tricky::Box_Item>);
  CHECK(std::string(tricky::Box_Item_::service_info().full_name) == "zrpc.test.tricky.Box_Item");
}

TEST_CASE("a service with no methods and one named like a keyword still work", "[codegen][names]") {
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

namespace {

using zrpc::IncomingBulk;
using zrpc::OutgoingBulk;
using zrpc::examples::ObjectInfo;
using zrpc::examples::ObjectKey;
using zrpc::examples::ObjectStore;
using zrpc::examples::PutReply;

// Keeps Put payloads in place (holding their receive memory) until Drop.
class ObjectStoreImpl : public ObjectStore::Service {
 public:
  absl::Status Put(zrpc::ServerContext&, const ObjectKey& key, IncomingBulk request_bulk,
                   PutReply* reply) override {
    if (key.name() == "ignore") return absl::OkStatus();  // leaves the payload untaken
    if (key.name().empty()) return absl::InvalidArgumentError("empty key");
    reply->set_stored_bytes(request_bulk.size());
    objects[key.name()] = std::move(request_bulk);
    return absl::OkStatus();
  }
  absl::Status Get(zrpc::ServerContext&, const ObjectKey& key, ObjectInfo* info,
                   OutgoingBulk* response_bulk) override {
    auto it = objects.find(key.name());
    if (it == objects.end()) {
      // A payload set before failing must still be released, and never reach the client.
      *response_bulk = OutgoingBulk("partial", 7, [this] { ++partial_released; });
      return absl::NotFoundError(key.name());
    }
    info->set_size(it->second.size());
    *response_bulk = OutgoingBulk(it->second.data(), it->second.size(), [this] { ++sent; });
    return absl::OkStatus();
  }
  absl::Status Transform(zrpc::ServerContext&, const ObjectKey&, IncomingBulk request_bulk,
                         ObjectInfo* info, OutgoingBulk* response_bulk) override {
    std::string upper(request_bulk.view());
    for (char& c : upper) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    info->set_size(upper.size());
    *response_bulk = OutgoingBulk::Copy(std::move(upper));
    return absl::OkStatus();
  }

  std::map<std::string, IncomingBulk> objects;
  int sent = 0;
  int partial_released = 0;
};

ObjectKey Key(const std::string& name) {
  ObjectKey key;
  key.set_name(name);
  return key;
}

}  // namespace

TEST_CASE("the method table says which methods carry bulk payloads", "[codegen][bulk]") {
  const zrpc::ServiceInfo& info = ObjectStore::service_info();
  REQUIRE(info.method_count == 4);
  CHECK((info.methods[0].request_bulk && !info.methods[0].response_bulk));   // Put
  CHECK((!info.methods[1].request_bulk && info.methods[1].response_bulk));   // Get
  CHECK((info.methods[2].request_bulk && info.methods[2].response_bulk));    // Transform
  CHECK((!info.methods[3].request_bulk && !info.methods[3].response_bulk));  // Stat
  for (int i = 0; i < 2; ++i) {
    CHECK_FALSE(Greeter::service_info().methods[i].request_bulk);
    CHECK_FALSE(Greeter::service_info().methods[i].response_bulk);
  }
}

TEST_CASE("a request payload reaches the handler in place and is released once, when dropped",
          "[codegen][bulk]") {
  ObjectStoreImpl impl;
  LoopbackChannel channel(&impl);
  // Payloads go back before the memory they sit in (the channel's) goes, even if a check fails.
  absl::Cleanup drop = [&] { impl.objects.clear(); };
  ObjectStore::Stub stub(&channel);
  std::string object(100000, '\0');
  for (size_t i = 0; i < object.size(); ++i) object[i] = static_cast<char>(i * 7);
  int client_releases = 0;
  PutReply reply;
  REQUIRE(stub.Put(Key("a"), OutgoingBulk(object.data(), object.size(), [&] { ++client_releases; }),
                   &reply)
              .ok());
  CHECK(client_releases == 1);  // the caller's bytes are free again once the call ended
  CHECK(reply.stored_bytes() == object.size());
  // The handler kept the payload: it still sits in the server's receive memory, unreleased.
  REQUIRE(impl.objects.count("a") == 1);
  CHECK(impl.objects["a"].view() == object);
  CHECK(channel.server_memory.held() == 1);
  impl.objects.clear();
  CHECK(channel.server_memory.held() == 0);
  CHECK(channel.server_memory.releases == 1);
  CHECK(channel.server_memory.bad_releases == 0);
}

TEST_CASE("a payload the handler leaves alone, or an error, still releases it", "[codegen][bulk]") {
  ObjectStoreImpl impl;
  LoopbackChannel channel(&impl);
  ObjectStore::Stub stub(&channel);
  PutReply reply;
  CHECK(stub.Put(Key("ignore"), OutgoingBulk::Copy("xyz"), &reply).ok());
  CHECK(stub.Put(Key(""), OutgoingBulk::Copy("xyz"), &reply).code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK(channel.server_memory.held() == 0);
  CHECK(channel.server_memory.releases == 2);

  // A response payload set by a failing handler never reaches the client.
  ObjectInfo info;
  IncomingBulk got;
  CHECK(stub.Get(Key("missing"), &info, &got).code() == absl::StatusCode::kNotFound);
  CHECK(got.empty());
  CHECK(impl.partial_released == 1);
  CHECK(channel.client_memory.held() == 0);

  // A request that does not parse never reaches the handler; its payload is released at Finish.
  LoopbackCall garbage(std::string("\xff\xff\xff", 3),
                       channel.server_memory.Receive(OutgoingBulk::Copy("orphan")));
  CHECK(channel.server_memory.held() == 1);
  impl.Dispatch(0, &garbage);
  CHECK(garbage.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(channel.server_memory.held() == 0);
  CHECK(channel.server_memory.bad_releases == 0);
}

TEST_CASE("a response-bulk call without somewhere to put the payload is refused",
          "[codegen][bulk]") {
  ObjectStoreImpl impl;
  LoopbackChannel channel(&impl);
  ObjectStore::Stub stub(&channel);
  ObjectInfo info;
  bool released = false;
  bool released_before_done = false;
  absl::Status status;
  stub.AsyncTransform(Key("t"), OutgoingBulk("x", 1, [&] { released = true; }), &info, nullptr, {},
                      [&](absl::Status s) {
                        released_before_done = released;
                        status = s;
                      });
  CHECK(status.code() == absl::StatusCode::kInvalidArgument);
  CHECK(released_before_done);
  CHECK(channel.calls == 0);
}

TEST_CASE("a response payload arrives in *response_bulk and is read in place", "[codegen][bulk]") {
  ObjectStoreImpl impl;
  LoopbackChannel channel(&impl);
  absl::Cleanup drop = [&] { impl.objects.clear(); };
  ObjectStore::Stub stub(&channel);
  PutReply reply;
  REQUIRE(stub.Put(Key("k"), OutgoingBulk::Copy("stored bytes"), &reply).ok());
  ObjectInfo info;
  {
    IncomingBulk got;
    REQUIRE(stub.Get(Key("k"), &info, &got).ok());
    CHECK(info.size() == 12);
    CHECK(got.view() == "stored bytes");
    CHECK(impl.sent == 1);  // the server's release ran once its bytes had left
    CHECK(channel.client_memory.held() == 1);
  }
  CHECK(channel.client_memory.held() == 0);
  CHECK(channel.client_memory.releases == 1);
}

TEST_CASE("bulk both ways, blocking and async; a plain rpc beside them", "[codegen][bulk]") {
  ObjectStoreImpl impl;
  LoopbackChannel channel(&impl);
  ObjectStore::Stub stub(&channel);
  ObjectInfo info;
  IncomingBulk got;
  REQUIRE(stub.Transform(Key("t"), OutgoingBulk::Copy("shout"), &info, &got).ok());
  CHECK(got.view() == "SHOUT");
  int done_calls = 0;
  stub.AsyncTransform(Key("t"), OutgoingBulk::Copy("again"), &info, &got, {},
                      [&](absl::Status status) {
                        ++done_calls;
                        CHECK(status.ok());
                      });
  CHECK(done_calls == 1);
  CHECK(got.view() == "AGAIN");  // the stub released the previous payload before the call
  CHECK(channel.client_memory.releases == 1);
  got.Reset();
  got.Reset();  // idempotent
  CHECK(channel.client_memory.releases == 2);
  CHECK(channel.client_memory.bad_releases == 0);
  CHECK(stub.Stat(Key("t"), &info).code() == absl::StatusCode::kUnimplemented);
}

TEST_CASE("a call that fails before sending releases its payload before done runs",
          "[codegen][bulk]") {
  ObjectStoreImpl impl;
  LoopbackChannel channel(&impl);
  channel.acquire_error = absl::ResourceExhaustedError("no send slot");
  ObjectStore::Stub stub(&channel);
  bool released = false;
  bool released_before_done = false;
  std::string bytes = "payload";
  PutReply reply;
  stub.AsyncPut(Key("a"), OutgoingBulk(bytes.data(), bytes.size(), [&] { released = true; }),
                &reply, {}, [&](absl::Status status) {
                  released_before_done = released;
                  CHECK(status.code() == absl::StatusCode::kResourceExhausted);
                });
  CHECK(released_before_done);
  CHECK(channel.calls == 0);
}

TEST_CASE("OutgoingBulk and IncomingBulk release exactly once across moves", "[codegen][bulk]") {
  int releases = 0;
  {
    OutgoingBulk a("abc", 3, [&] { ++releases; });
    OutgoingBulk b(std::move(a));
    CHECK(a.empty());  // NOLINT(bugprone-use-after-move): moved-from is specified empty
    CHECK(b.size() == 3);
    OutgoingBulk c;
    c = std::move(b);
    CHECK(releases == 0);
  }
  CHECK(releases == 1);

  zrpc::testing::LoopbackBulkMemory memory;
  IncomingBulk in = memory.Receive(OutgoingBulk::Copy("in place"));
  IncomingBulk moved = std::move(in);
  in.Reset();  // NOLINT(bugprone-use-after-move): releasing an empty payload does nothing
  CHECK(memory.releases == 0);
  CHECK(moved.view() == "in place");
  moved = IncomingBulk();
  CHECK(memory.releases == 1);
  CHECK(memory.bad_releases == 0);
  CHECK(memory.Receive(OutgoingBulk()).empty());  // an empty payload holds no memory
  CHECK(memory.held() == 0);
}

namespace {
class KvImpl : public ext::api::Kv::Service {
 public:
  absl::Status Set(zrpc::ServerContext&, const ext::types::Key& key, IncomingBulk request_bulk,
                   google::protobuf::Empty*) override {
    values[key.name()] = std::string(request_bulk.view());
    return absl::OkStatus();
  }
  absl::Status Lookup(zrpc::ServerContext&, const ext::types::Key& key,
                      zrpc::test::common::Payload* value) override {
    auto it = values.find(key.name());
    if (it == values.end()) return absl::NotFoundError(key.name());
    value->set_data(it->second);
    value->set_checksum(it->second.size());
    return absl::OkStatus();
  }
  std::map<std::string, std::string> values;
};
}  // namespace

TEST_CASE("a service whose protos live in an external repository works end to end",
          "[codegen][external]") {
  KvImpl impl;
  LoopbackChannel channel(&impl);
  ext::api::Kv::Stub stub(&channel);
  ext::types::Key key;
  key.set_name("k");
  google::protobuf::Empty empty;
  REQUIRE(stub.Set(key, OutgoingBulk::Copy("value"), &empty).ok());
  zrpc::test::common::Payload value;
  REQUIRE(stub.Lookup(key, &value).ok());
  CHECK(value.data() == "value");
  CHECK(channel.last_method == "ext.api.Kv/Lookup");
  CHECK(ext::api::Kv::service_info().methods[0].request_bulk);
}

namespace {

namespace generic = zrpc::test::generic;

// protobuf's own service classes are still there, under the names zrpc's classes gave up.
static_assert(std::is_base_of_v<google::protobuf::Service, generic::EchoService>);
static_assert(std::is_base_of_v<generic::index, generic::index_Stub>);

class EchoImpl : public generic::EchoService_::Service {
 public:
  absl::Status Echo(zrpc::ServerContext&, const generic::EchoRequest& request,
                    generic::EchoResponse* response) override {
    response->set_message(request.message());
    return absl::OkStatus();
  }
};

// An inverted index over a few documents.
class IndexImpl : public generic::index_::Service {
 public:
  absl::Status Lookup(zrpc::ServerContext&, const generic::IndexRequest& request,
                      generic::IndexResponse* response) override {
    static const auto* const kDocuments =
        new std::map<std::string, std::vector<int64_t>>{{"rdma", {3, 7}}, {"rpc", {7}}};
    for (const std::string& term : request.terms()) {
      generic::IndexResponse::Posting* posting = response->add_postings();
      posting->set_term(term);
      auto it = kDocuments->find(term);
      if (it == kDocuments->end()) continue;
      posting->mutable_doc_ids()->Add(it->second.begin(), it->second.end());
    }
    return absl::OkStatus();
  }
};

class StatusImpl : public generic::status_::Service {
 public:
  absl::Status Get(zrpc::ServerContext&, const generic::StatusRequest&,
                   generic::StatusResponse* response) override {
    response->set_state(generic::StatusResponse::SERVING);
    response->set_uptime_seconds(86400);
    return absl::OkStatus();
  }
};

}  // namespace

TEST_CASE("services of a file with cc_generic_services serve calls beside protobuf's own",
          "[codegen][file_options]") {
  EchoImpl echo;
  LoopbackChannel echo_channel(&echo);
  generic::EchoService_::Stub echo_stub(&echo_channel);
  generic::EchoRequest request;
  request.set_message("over RDMA");
  generic::EchoResponse echoed;
  REQUIRE(echo_stub.Echo(request, &echoed).ok());
  CHECK(echoed.message() == "over RDMA");
  CHECK(echo_channel.last_method == "zrpc.test.generic.EchoService/Echo");
  // proto2: a request without its required field does not parse on the server.
  CHECK(echo_stub.Echo(generic::EchoRequest(), &echoed).code() ==
        absl::StatusCode::kInvalidArgument);

  IndexImpl index;
  LoopbackChannel index_channel(&index);
  generic::index_::Stub index_stub(&index_channel);
  generic::IndexRequest terms;
  for (const char* term : {"rdma", "rpc", "verbs"}) terms.add_terms(term);
  generic::IndexResponse postings;
  REQUIRE(index_stub.Lookup(terms, &postings).ok());
  REQUIRE(postings.postings_size() == 3);
  CHECK(postings.postings(0).term() == "rdma");
  CHECK(std::vector<int64_t>(postings.postings(0).doc_ids().begin(),
                             postings.postings(0).doc_ids().end()) == std::vector<int64_t>{3, 7});
  CHECK(postings.postings(1).doc_ids_size() == 1);
  CHECK(postings.postings(2).doc_ids_size() == 0);
  CHECK(index_channel.last_method == "zrpc.test.generic.index/Lookup");

  StatusImpl status;
  LoopbackChannel status_channel(&status);
  generic::status_::Stub status_stub(&status_channel);
  generic::StatusResponse state;
  absl::Status result = absl::UnknownError("not called");
  status_stub.AsyncGet(generic::StatusRequest(), &state, {}, [&](absl::Status s) { result = s; });
  CHECK(result.ok());
  CHECK(state.state() == generic::StatusResponse::SERVING);
  CHECK(state.uptime_seconds() == 86400);
  CHECK(std::string(generic::status_::service_info().full_name) == "zrpc.test.generic.status");
}

namespace {

namespace lite = zrpc::test::lite;

static_assert(!std::is_base_of_v<google::protobuf::Message, lite::Blob>);

class BlobStoreImpl : public lite::BlobStore::Service {
 public:
  absl::Status Put(zrpc::ServerContext&, const lite::Blob& blob, IncomingBulk request_bulk,
                   lite::Blob* stored) override {
    blobs[blob.name()] = std::string(request_bulk.view());
    stored->set_name(blob.name());
    stored->set_size(request_bulk.size());
    return absl::OkStatus();
  }
  absl::Status Stat(zrpc::ServerContext&, const lite::Blob& blob, lite::Blob* stat) override {
    auto it = blobs.find(blob.name());
    if (it == blobs.end()) return absl::NotFoundError(blob.name());
    stat->set_name(blob.name());
    stat->set_size(it->second.size());
    return absl::OkStatus();
  }
  std::map<std::string, std::string> blobs;
};

}  // namespace

TEST_CASE("services of an optimize_for = LITE_RUNTIME file work, bulk payloads included",
          "[codegen][file_options]") {
  BlobStoreImpl impl;
  LoopbackChannel channel(&impl);
  lite::BlobStore::Stub stub(&channel);
  lite::Blob blob;
  blob.set_name("b");
  lite::Blob stat;
  REQUIRE(stub.Put(blob, OutgoingBulk::Copy("lite bytes"), &stat).ok());
  CHECK(stat.size() == 10);
  CHECK(impl.blobs["b"] == "lite bytes");
  stat.Clear();
  REQUIRE(stub.Stat(blob, &stat).ok());
  CHECK(stat.name() == "b");
  CHECK(stat.size() == 10);
  blob.set_name("missing");
  CHECK(stub.Stat(blob, &stat).code() == absl::StatusCode::kNotFound);
  // A request that does not parse names its type, which a lite message knows too.
  LoopbackCall garbage(std::string("\xff\xff\xff", 3));
  impl.Dispatch(1, &garbage);
  CHECK(std::string(garbage.status().message()).find("zrpc.test.lite.Blob") != std::string::npos);
}

// The asynchronous server form: Foo::AsyncService handlers own their call as a zrpc::PendingCall
// and finish it inline, later from another thread, with an error, or not at all.

namespace {

using zrpc::PendingCall;

// Calls a handler parked for another thread to finish, as a server that waits on another service
// or on I/O parks them.
template <typename Call>
class Parked {
 public:
  void Push(std::unique_ptr<Call> call) {
    std::lock_guard<std::mutex> lock(mu_);
    calls_.push_back(std::move(call));
    cv_.notify_all();
  }
  // Waits until `count` calls are parked and takes them all, oldest first (none after 10 s).
  std::vector<std::unique_ptr<Call>> Take(size_t count) {
    std::unique_lock<std::mutex> lock(mu_);
    if (!cv_.wait_for(lock, std::chrono::seconds(10), [&] { return calls_.size() >= count; })) {
      return {};
    }
    return std::exchange(calls_, {});
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::unique_ptr<Call>> calls_;
};

using GreeterCall = PendingCall<HelloRequest, HelloReply>;

void Greet(GreeterCall& call) { call.response()->set_message("Hello, " + call.request().name()); }

// What happens to a SayHello call depends on the name it greets: "later..." is parked for the
// test to finish, "error..." fails at once, "drop..." is dropped unfinished, any other name is
// answered before the handler returns. Ping keeps its UNIMPLEMENTED default.
class AsyncGreeterImpl : public Greeter::AsyncService {
 public:
  void SayHello(std::unique_ptr<GreeterCall> call) override {
    ++handled;
    const std::string name = call->request().name();
    if (name.rfind("later", 0) == 0) {
      parked.Push(std::move(call));
    } else if (name.rfind("error", 0) == 0) {
      call->Finish(absl::FailedPreconditionError("no greeting for " + name));
    } else if (name.rfind("drop", 0) != 0) {
      Greet(*call);
      call->Finish(absl::OkStatus());
    }
  }

  std::atomic<int> handled{0};
  Parked<GreeterCall> parked;
};

HelloRequest Named(const std::string& name) {
  HelloRequest request;
  request.set_name(name);
  return request;
}

constexpr char kDroppedSayHello[] =
    "zrpc.examples.Greeter/SayHello: handler dropped the call without finishing it";

}  // namespace

TEST_CASE("an AsyncService handler that finishes inline answers like a blocking one",
          "[codegen][async]") {
  AsyncGreeterImpl impl;
  LoopbackChannel channel(&impl);
  Greeter::Stub stub(&channel);
  HelloReply reply;
  REQUIRE(stub.SayHello(Named("zrpc"), &reply).ok());
  CHECK(reply.message() == "Hello, zrpc");
  CHECK(channel.last_request == Named("zrpc").SerializeAsString());

  int done_calls = 0;
  stub.AsyncSayHello(Named("inline"), &reply, {}, [&](absl::Status status) {
    ++done_calls;
    CHECK(status.ok());
  });
  CHECK(done_calls == 1);  // finished inside Dispatch, so before AsyncSayHello returned
  CHECK(reply.message() == "Hello, inline");
  CHECK(&impl.service_info() == &Greeter::service_info());
  CHECK(channel.unfinished_calls() == 0);
  CHECK(channel.contract_violations() == 0);
}

TEST_CASE("a call parked by its handler and finished later on another thread ends there",
          "[codegen][async]") {
  AsyncGreeterImpl impl;
  LoopbackChannel channel(&impl);
  Greeter::Stub stub(&channel);

  // Asynchronous client: the handler and Dispatch have returned, the call is still open.
  HelloReply reply;
  absl::Notification done;
  absl::Status result = absl::UnknownError("done did not run");
  std::thread::id done_thread;
  stub.AsyncSayHello(Named("later, async"), &reply, {}, [&](absl::Status status) {
    result = std::move(status);
    done_thread = std::this_thread::get_id();
    done.Notify();
  });
  CHECK_FALSE(done.HasBeenNotified());
  CHECK(channel.unfinished_calls() == 1);
  std::thread finisher([&] {
    for (std::unique_ptr<GreeterCall>& call : impl.parked.Take(1)) {
      Greet(*call);
      call->Finish(absl::OkStatus());
    }
  });
  const std::thread::id finisher_id = finisher.get_id();
  REQUIRE(done.WaitForNotificationWithTimeout(absl::Seconds(10)));
  finisher.join();
  CHECK(result.ok());
  CHECK(reply.message() == "Hello, later, async");
  CHECK(done_thread == finisher_id);  // the client's call ended inside Finish, on that thread

  // Blocking client: it waits until the other thread finishes the call.
  std::thread later([&] {
    for (std::unique_ptr<GreeterCall>& call : impl.parked.Take(1)) {
      Greet(*call);
      call->Finish(absl::OkStatus());
    }
  });
  absl::Status status = stub.SayHello(Named("later, blocking"), &reply);
  later.join();
  CHECK(status.ok());
  CHECK(reply.message() == "Hello, later, blocking");
  CHECK(channel.unfinished_calls() == 0);
  CHECK(channel.contract_violations() == 0);
}

TEST_CASE("blocked clients whose calls are finished out of order each get their own answer",
          "[codegen][async]") {
  AsyncGreeterImpl impl;
  LoopbackChannel channel(&impl);
  Greeter::Stub stub(&channel);
  constexpr int kClients = 4;
  std::vector<absl::Status> statuses(kClients, absl::UnknownError("not returned"));
  std::vector<HelloReply> replies(kClients);
  std::vector<std::thread> clients;
  for (int i = 0; i < kClients; ++i) {
    clients.emplace_back(
        [&, i] { statuses[i] = stub.SayHello(Named("later #" + std::to_string(i)), &replies[i]); });
  }
  std::vector<std::unique_ptr<GreeterCall>> calls = impl.parked.Take(kClients);
  CHECK(calls.size() == static_cast<size_t>(kClients));
  for (auto it = calls.rbegin(); it != calls.rend(); ++it) {  // newest first
    Greet(**it);
    (*it)->Finish(absl::OkStatus());
  }
  for (std::thread& client : clients) client.join();
  for (int i = 0; i < kClients; ++i) {
    CHECK(statuses[i].ok());
    CHECK(replies[i].message() == "Hello, later #" + std::to_string(i));
  }
  CHECK(impl.handled == kClients);
  CHECK(channel.contract_violations() == 0);
}

TEST_CASE("an error a handler finishes with reaches the client, message included",
          "[codegen][async]") {
  AsyncGreeterImpl impl;
  LoopbackChannel channel(&impl);
  Greeter::Stub stub(&channel);
  HelloReply reply;
  absl::Status inline_error = stub.SayHello(Named("error-now"), &reply);
  CHECK(inline_error.code() == absl::StatusCode::kFailedPrecondition);
  CHECK(inline_error.message() == "no greeting for error-now");

  std::thread backend([&] {
    for (std::unique_ptr<GreeterCall>& call : impl.parked.Take(1)) {
      Greet(*call);  // a response filled in and then given up: an error sends none of it
      call->Finish(absl::UnavailableError("backend for " + call->request().name() + " is down"));
    }
  });
  reply.Clear();
  absl::Status later_error = stub.SayHello(Named("later-fail"), &reply);
  backend.join();
  CHECK(later_error.code() == absl::StatusCode::kUnavailable);
  CHECK(later_error.message() == "backend for later-fail is down");
  CHECK(reply.message().empty());
  CHECK(channel.contract_violations() == 0);
}

TEST_CASE("a call dropped without finishing fails with INTERNAL instead of hanging",
          "[codegen][async]") {
  AsyncGreeterImpl impl;
  LoopbackChannel channel(&impl);
  Greeter::Stub stub(&channel);
  HelloReply reply;
  absl::Status dropped = stub.SayHello(Named("drop"), &reply);
  CHECK(dropped.code() == absl::StatusCode::kInternal);
  CHECK(dropped.message() == kDroppedSayHello);

  // Dropped on another thread, after the handler returned: the blocked client wakes up.
  std::thread dropper([&] { impl.parked.Take(1).clear(); });
  absl::Status dropped_later = stub.SayHello(Named("later, then dropped"), &reply);
  dropper.join();
  CHECK(dropped_later.code() == absl::StatusCode::kInternal);
  CHECK(dropped_later.message() == kDroppedSayHello);
  CHECK(channel.unfinished_calls() == 0);
  CHECK(channel.contract_violations() == 0);
}

TEST_CASE("a moved PendingCall finishes once; one overwritten while pending is dropped",
          "[codegen][async]") {
  AsyncGreeterImpl impl;
  LoopbackChannel channel(&impl);
  Greeter::Stub stub(&channel);
  HelloReply first_reply, second_reply;
  absl::Status first = absl::UnknownError("not done"), second = absl::UnknownError("not done");
  stub.AsyncSayHello(Named("later 1"), &first_reply, {}, [&](absl::Status s) { first = s; });
  stub.AsyncSayHello(Named("later 2"), &second_reply, {}, [&](absl::Status s) { second = s; });
  std::vector<std::unique_ptr<GreeterCall>> calls = impl.parked.Take(2);
  REQUIRE(calls.size() == 2);
  GreeterCall moved(std::move(*calls[0]));  // calls[0] is left empty: destroying it does nothing
  calls[0].reset();
  CHECK(first.code() == absl::StatusCode::kUnknown);
  *calls[1] = std::move(moved);  // call 2 was pending: it is dropped, and call 1 lives on here
  CHECK(second.code() == absl::StatusCode::kInternal);
  Greet(*calls[1]);
  calls[1]->Finish(absl::OkStatus());
  CHECK(first.ok());
  CHECK(first_reply.message() == "Hello, later 1");
  calls.clear();
  CHECK(channel.unfinished_calls() == 0);
  CHECK(channel.contract_violations() == 0);
}

TEST_CASE("an AsyncService handler left alone answers UNIMPLEMENTED like the blocking form",
          "[codegen][async]") {
  AsyncGreeterImpl async_impl;
  LoopbackChannel async_channel(&async_impl);
  GreeterImpl blocking_impl;
  LoopbackChannel blocking_channel(&blocking_impl);
  google::protobuf::Empty empty;
  absl::Status async_status = Greeter::Stub(&async_channel).Ping(empty, &empty);
  absl::Status blocking_status = Greeter::Stub(&blocking_channel).Ping(empty, &empty);
  CHECK(async_status.code() == absl::StatusCode::kUnimplemented);
  CHECK(async_status.message() == "zrpc.examples.Greeter/Ping is not implemented");
  CHECK(async_status == blocking_status);

  LoopbackCall unknown("");
  async_impl.Dispatch(7, &unknown);
  CHECK(unknown.finish_calls == 1);
  CHECK(unknown.status().code() == absl::StatusCode::kUnimplemented);

  // A request that does not parse is refused before any handler runs, as in the blocking form.
  LoopbackCall garbage(std::string("\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01", 11));
  async_impl.Dispatch(0, &garbage);
  CHECK(garbage.finish_calls == 1);
  CHECK(garbage.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(garbage.status().message()).find("zrpc.examples.HelloRequest") !=
        std::string::npos);
  CHECK(async_impl.handled == 0);
}

namespace {

using PutCall = PendingCall<ObjectKey, PutReply>;
using ObjectCall = PendingCall<ObjectKey, ObjectInfo>;

std::string Upper(absl::string_view bytes) {
  std::string upper(bytes);
  for (char& c : upper) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return upper;
}

// ObjectStoreImpl's behaviour in the async form. Put answers inline and may keep the payload
// past the call; Get and Transform answer from worker threads. Stat is left UNIMPLEMENTED.
class AsyncObjectStoreImpl : public ObjectStore::AsyncService {
 public:
  ~AsyncObjectStoreImpl() override { JoinWorkers(); }

  void Put(std::unique_ptr<PutCall> call) override {
    const std::string name = call->request().name();
    if (name == "ignore") {  // leaves the payload untaken: Finish releases it
      call->Finish(absl::OkStatus());
      return;
    }
    IncomingBulk payload = call->TakeRequestBulk();
    call->response()->set_stored_bytes(payload.size());
    call->Finish(absl::OkStatus());
    objects[name] = std::move(payload);  // outlives the call, as a taken payload may
  }

  // A missing object fails, and "drop" is dropped, each after a payload was already set: it is
  // released, never sent.
  void Get(std::unique_ptr<ObjectCall> call) override {
    workers.emplace_back([this, call = std::move(call)]() mutable {
      const std::string& name = call->request().name();
      auto it = objects.find(name);
      if (it == objects.end()) {
        *call->response_bulk() = OutgoingBulk("partial", 7, [this] { ++partial_released; });
        if (name != "drop") call->Finish(absl::NotFoundError(name));
        return;
      }
      call->response()->set_size(it->second.size());
      *call->response_bulk() =
          OutgoingBulk(it->second.data(), it->second.size(), [this] { ++sent; });
      call->Finish(absl::OkStatus());
    });
  }

  // Takes the payload here, transforms it on a worker, releases it there before finishing.
  void Transform(std::unique_ptr<ObjectCall> call) override {
    IncomingBulk payload = call->TakeRequestBulk();
    workers.emplace_back([this, call = std::move(call), payload = std::move(payload)]() mutable {
      std::string upper = Upper(payload.view());
      payload.Reset();
      call->response()->set_size(upper.size());
      *call->response_bulk() = OutgoingBulk::Copy(std::move(upper));
      ++transformed;  // before Finish: from there on the client may already have moved on
      call->Finish(absl::OkStatus());
    });
  }

  void JoinWorkers() {
    for (std::thread& worker : workers) worker.join();
    workers.clear();
  }

  std::map<std::string, IncomingBulk> objects;  // written by Put, read by Get's workers
  std::vector<std::thread> workers;             // added to on the client's thread
  std::atomic<int> sent{0};
  std::atomic<int> partial_released{0};
  std::atomic<int> transformed{0};
};

std::string Pattern(size_t size, int salt) {
  std::string bytes(size, '\0');
  for (size_t i = 0; i < size; ++i) bytes[i] = static_cast<char>(i * 7 + salt);
  return bytes;
}

}  // namespace

TEST_CASE("async form: a request payload is taken in place and may outlive its call",
          "[codegen][async][bulk]") {
  AsyncObjectStoreImpl impl;
  LoopbackChannel channel(&impl);
  absl::Cleanup drop = [&] { impl.objects.clear(); };
  ObjectStore::Stub stub(&channel);
  const std::string object = Pattern(100000, 1);
  int client_releases = 0;
  PutReply reply;
  REQUIRE(stub.Put(Key("a"), OutgoingBulk(object.data(), object.size(), [&] { ++client_releases; }),
                   &reply)
              .ok());
  CHECK(client_releases == 1);
  CHECK(reply.stored_bytes() == object.size());
  REQUIRE(impl.objects.count("a") == 1);
  CHECK(impl.objects["a"].view() == object);  // byte for byte, after the call ended
  CHECK(channel.server_memory.held() == 1);
  impl.objects.clear();
  CHECK(channel.server_memory.held() == 0);
  CHECK(channel.server_memory.releases == 1);

  // Untaken, it is released at Finish.
  REQUIRE(stub.Put(Key("ignore"), OutgoingBulk::Copy("xyz"), &reply).ok());
  CHECK(channel.server_memory.held() == 0);
  CHECK(channel.server_memory.releases == 2);
  CHECK(channel.server_memory.bad_releases == 0);

  // A request that does not parse never reaches the handler; its payload is released at Finish.
  LoopbackCall garbage(std::string("\xff\xff\xff", 3),
                       channel.server_memory.Receive(OutgoingBulk::Copy("orphan")));
  impl.Dispatch(0, &garbage);
  CHECK(garbage.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(channel.server_memory.held() == 0);
  CHECK(channel.server_memory.bad_releases == 0);
  CHECK(channel.contract_violations() == 0);
}

TEST_CASE("async form: bulk both ways, answered from worker threads, byte-checked",
          "[codegen][async][bulk]") {
  AsyncObjectStoreImpl impl;
  LoopbackChannel channel(&impl);
  absl::Cleanup drop = [&] {
    impl.JoinWorkers();
    impl.objects.clear();
  };
  ObjectStore::Stub stub(&channel);
  const std::string object = Pattern(65536, 3);
  PutReply put;
  REQUIRE(stub.Put(Key("k"), OutgoingBulk::Copy(object), &put).ok());

  ObjectInfo info;
  {
    IncomingBulk got;
    REQUIRE(stub.Get(Key("k"), &info, &got).ok());
    CHECK(info.size() == object.size());
    CHECK(got.view() == object);
    CHECK(impl.sent == 1);  // the server's payload was released once it had left
    CHECK(channel.client_memory.held() == 1);
  }
  CHECK(channel.client_memory.held() == 0);

  std::string text(50000, 'x');
  for (size_t i = 0; i < text.size(); ++i) text[i] = "rdma zero-copy "[i % 15];
  IncomingBulk got;
  REQUIRE(stub.Transform(Key("t"), OutgoingBulk::Copy(text), &info, &got).ok());
  CHECK(info.size() == text.size());
  CHECK(got.view() == Upper(text));
  CHECK(impl.transformed == 1);
  absl::Notification done;
  absl::Status async_status;
  stub.AsyncTransform(Key("t"), OutgoingBulk::Copy("again"), &info, &got, {},
                      [&](absl::Status status) {
                        async_status = status;
                        done.Notify();
                      });
  REQUIRE(done.WaitForNotificationWithTimeout(absl::Seconds(10)));
  CHECK(async_status.ok());
  CHECK(got.view() == "AGAIN");
  got.Reset();
  impl.JoinWorkers();

  // Put's payload still held by the store, Transform's two released by the worker.
  CHECK(channel.server_memory.releases == 2);
  CHECK(channel.server_memory.held() == 1);
  impl.objects.clear();
  CHECK(channel.server_memory.held() == 0);
  CHECK(channel.server_memory.releases == 3);
  CHECK(channel.client_memory.releases == 3);  // Get's and the two Transforms'
  CHECK(channel.client_memory.held() == 0);
  CHECK(channel.server_memory.bad_releases == 0);
  CHECK(channel.client_memory.bad_releases == 0);
  CHECK(channel.unfinished_calls() == 0);
  CHECK(channel.contract_violations() == 0);
}

TEST_CASE("async form: a response payload of a failed or dropped call is released, never sent",
          "[codegen][async][bulk]") {
  AsyncObjectStoreImpl impl;
  LoopbackChannel channel(&impl);
  absl::Cleanup join = [&] { impl.JoinWorkers(); };
  ObjectStore::Stub stub(&channel);
  ObjectInfo info;
  IncomingBulk got;
  absl::Status missing = stub.Get(Key("missing"), &info, &got);
  CHECK(missing.code() == absl::StatusCode::kNotFound);
  CHECK(missing.message() == "missing");
  CHECK(got.empty());
  absl::Status dropped = stub.Get(Key("drop"), &info, &got);
  CHECK(dropped.code() == absl::StatusCode::kInternal);
  CHECK(dropped.message() ==
        "zrpc.examples.ObjectStore/Get: handler dropped the call without finishing it");
  CHECK(got.empty());
  impl.JoinWorkers();
  CHECK(impl.partial_released == 2);
  CHECK(channel.client_memory.releases == 0);
  CHECK(channel.client_memory.held() == 0);

  CHECK(stub.Stat(Key("s"), &info).code() == absl::StatusCode::kUnimplemented);
  CHECK(channel.unfinished_calls() == 0);
  CHECK(channel.contract_violations() == 0);
}

namespace {

using TrickyNote = zrpc::PendingCall<tricky::PendingCall, tricky::PendingCall>;

// Handlers named like the nested class (renamed), the runtime's template and the parameters of
// the generated code; `call` keeps its UNIMPLEMENTED default.
class TrickyAsyncImpl : public tricky::AsyncService_::AsyncService {
 public:
  void AsyncService_(std::unique_ptr<TrickyNote> call) override {
    call->response()->set_note("AsyncService:" + call->request().note());
    call->Finish(absl::OkStatus());
  }
  void PendingCall(std::unique_ptr<TrickyNote> call) override {
    call->response()->set_note("PendingCall:" + call->request().note());
    call->Finish(absl::OkStatus());
  }
  void pending(std::unique_ptr<zrpc::PendingCall<tricky::Empty, tricky::Empty>> call) override {
    call->Finish(absl::OkStatus());
  }
};

}  // namespace

TEST_CASE("rpcs and services named like AsyncService or PendingCall still work",
          "[codegen][names][async]") {
  CHECK(std::string(tricky::AsyncService_::service_info().full_name) ==
        "zrpc.test.tricky.AsyncService");
  TrickyAsyncImpl impl;
  LoopbackChannel channel(&impl);
  tricky::AsyncService_::Stub stub(&channel);
  tricky::PendingCall in, out;
  in.set_note("n");
  REQUIRE(stub.AsyncService_(in, &out).ok());
  CHECK(out.note() == "AsyncService:n");
  CHECK(channel.last_method == "zrpc.test.tricky.AsyncService/AsyncService");
  REQUIRE(stub.PendingCall(in, &out).ok());
  CHECK(out.note() == "PendingCall:n");
  tricky::Empty empty;
  CHECK(stub.pending(empty, &empty).ok());
  absl::Status call = stub.call(empty, &empty);
  CHECK(call.code() == absl::StatusCode::kUnimplemented);
  CHECK(call.message() == "zrpc.test.tricky.AsyncService/call is not implemented");

  // Every service has the async form, the renamed and the empty ones too.
  tricky::Service__::AsyncService renamed;
  LoopbackChannel renamed_channel(&renamed);
  CHECK(tricky::Service__::Stub(&renamed_channel).delete_(empty, &empty).code() ==
        absl::StatusCode::kUnimplemented);
  tricky::Idle::AsyncService idle;
  LoopbackCall nothing("");
  idle.Dispatch(0, &nothing);
  CHECK(nothing.status().code() == absl::StatusCode::kUnimplemented);
}

// One Service, each method in the form that suits it: blocking handlers answer by returning,
// Async<Method> handlers own the call (a PendingCall) and finish it later, from any thread.
namespace {

using zrpc::examples::ObjectInfo;
using zrpc::examples::ObjectKey;
using zrpc::examples::ObjectStore;

class MixedGreeter : public Greeter::Service {
 public:
  absl::Status SayHello(zrpc::ServerContext&, const HelloRequest& request,
                        HelloReply* response) override {
    response->set_message("blocking " + request.name());
    return absl::OkStatus();
  }
  // Ping answered later, from a thread of its own.
  void AsyncPing(
      std::unique_ptr<zrpc::PendingCall<google::protobuf::Empty, google::protobuf::Empty>> call)
      override {
    pings.fetch_add(1);
    std::lock_guard<std::mutex> lock(mu);
    workers.emplace_back([call = std::move(call)]() mutable { call->Finish(absl::OkStatus()); });
  }
  ~MixedGreeter() override {
    for (std::thread& t : workers) t.join();
  }
  std::atomic<int> pings{0};
  std::mutex mu;
  std::vector<std::thread> workers;
};

// The other way round, with payloads: Put (a request payload) async, Get (a response payload)
// blocking, Transform (both) async from a worker, Stat neither.
class MixedStore : public ObjectStore::Service {
 public:
  ~MixedStore() override {
    for (std::thread& t : workers) t.join();
  }
  void AsyncPut(
      std::unique_ptr<zrpc::PendingCall<ObjectKey, zrpc::examples::PutReply>> call) override {
    zrpc::IncomingBulk bulk = call->TakeRequestBulk();
    call->response()->set_stored_bytes(bulk.size());
    {
      std::lock_guard<std::mutex> lock(mu);
      objects[call->request().name()] = std::string(bulk.view());
    }
    call->Finish(absl::OkStatus());
  }
  absl::Status Get(zrpc::ServerContext&, const ObjectKey& request, ObjectInfo* response,
                   zrpc::OutgoingBulk* response_bulk) override {
    std::lock_guard<std::mutex> lock(mu);
    auto it = objects.find(request.name());
    if (it == objects.end()) return absl::NotFoundError(request.name());
    response->set_size(it->second.size());
    *response_bulk = zrpc::OutgoingBulk::Copy(it->second);
    return absl::OkStatus();
  }
  void AsyncTransform(std::unique_ptr<zrpc::PendingCall<ObjectKey, ObjectInfo>> call) override {
    std::lock_guard<std::mutex> lock(mu);
    workers.emplace_back([call = std::move(call)]() mutable {
      zrpc::IncomingBulk in = call->TakeRequestBulk();
      std::string reversed(in.view().rbegin(), in.view().rend());
      in.Reset();
      call->response()->set_size(reversed.size());
      *call->response_bulk() = zrpc::OutgoingBulk::Copy(std::move(reversed));
      call->Finish(absl::OkStatus());
    });
  }
  std::mutex mu;
  std::map<std::string, std::string> objects;
  std::vector<std::thread> workers;
};

// A blocking handler that falls back on its base class: the method answers UNIMPLEMENTED.
class BaseCallingGreeter : public Greeter::Service {
 public:
  absl::Status SayHello(zrpc::ServerContext& context, const HelloRequest& request,
                        HelloReply* response) override {
    return Greeter::Service::SayHello(context, request, response);
  }
};

}  // namespace

TEST_CASE(
    "one Service mixes forms per method: a blocking handler beside an async one finished "
    "on another thread",
    "[codegen][mixed]") {
  MixedGreeter impl;
  LoopbackChannel channel(&impl);
  Greeter::Stub stub(&channel);
  HelloRequest request;
  request.set_name("x");
  HelloReply reply;
  REQUIRE(stub.SayHello(request, &reply).ok());
  CHECK(reply.message() == "blocking x");
  google::protobuf::Empty empty;
  for (int i = 0; i < 20; ++i) REQUIRE(stub.Ping(empty, &empty).ok());
  CHECK(impl.pings.load() == 20);
  CHECK(channel.contract_violations() == 0);
}

TEST_CASE(
    "mixed forms with payloads: an async handler takes the request payload in place, a "
    "blocking one sends a response payload, an async one on a worker does both",
    "[codegen][mixed][bulk]") {
  MixedStore impl;
  LoopbackChannel channel(&impl);
  ObjectStore::Stub stub(&channel);
  const std::string object = Pattern(50000, 3);
  int client_releases = 0;
  zrpc::examples::PutReply put;
  REQUIRE(stub.Put(Key("a"), OutgoingBulk(object.data(), object.size(), [&] { ++client_releases; }),
                   &put)
              .ok());
  CHECK(put.stored_bytes() == object.size());
  CHECK(client_releases == 1);
  CHECK(channel.server_memory.held() == 0);  // the async handler released it (copied out)
  CHECK(channel.server_memory.releases == 1);

  ObjectInfo info;
  IncomingBulk back;
  REQUIRE(stub.Get(Key("a"), &info, &back).ok());
  CHECK(info.size() == object.size());
  CHECK(back.view() == object);
  back.Reset();
  CHECK(stub.Get(Key("missing"), &info, &back).code() == absl::StatusCode::kNotFound);

  REQUIRE(stub.Transform(Key("t"), OutgoingBulk::Copy("abcdef"), &info, &back).ok());
  CHECK(back.view() == "fedcba");
  back.Reset();

  // Stat: neither form overridden.
  absl::Status stat = stub.Stat(Key("a"), &info);
  CHECK(stat.code() == absl::StatusCode::kUnimplemented);
  CHECK(stat.message() == "zrpc.examples.ObjectStore/Stat is not implemented");
  CHECK(channel.server_memory.held() == 0);
  CHECK(channel.server_memory.bad_releases == 0);
  CHECK(channel.contract_violations() == 0);
}

TEST_CASE(
    "a blocking handler that calls its base class answers UNIMPLEMENTED, and so does the "
    "base class called outside a call",
    "[codegen][mixed]") {
  BaseCallingGreeter impl;
  LoopbackChannel channel(&impl);
  Greeter::Stub stub(&channel);
  HelloRequest request;
  HelloReply reply;
  absl::Status s = stub.SayHello(request, &reply);
  CHECK(s.code() == absl::StatusCode::kUnimplemented);
  CHECK(s.message() == "zrpc.examples.Greeter/SayHello is not implemented");
  zrpc::ServerContext context;
  s = impl.Greeter::Service::SayHello(context, request, &reply);
  CHECK(s.code() == absl::StatusCode::kUnimplemented);
  CHECK(s.message() == "zrpc.examples.Greeter/SayHello is not implemented");
}

namespace {

// Handlers that call base-class defaults for their own answers: the defaults answer
// UNIMPLEMENTED and never take the call over, unless the handler returns that very answer.
class FallbackGreeter : public Greeter::Service {
 public:
  absl::Status SayHello(zrpc::ServerContext& context, const HelloRequest& request,
                        HelloReply* response) override {
    if (request.name() == "own-base") {
      // Asks its own base class, then answers itself.
      absl::Status base = Greeter::Service::SayHello(context, request, response);
      response->set_message("fallback after " + std::string(absl::StatusCodeToString(base.code())));
      return absl::OkStatus();
    }
    if (request.name() == "other-method") {
      // Calls another method's default (Ping is not overridden) to reuse it.
      google::protobuf::Empty empty;
      absl::Status ping = this->Ping(context, empty, &empty);
      response->set_message("ping said " + std::string(absl::StatusCodeToString(ping.code())));
      return absl::OkStatus();
    }
    // From another thread while the call runs: nothing reaches this call.
    absl::Status other;
    std::thread([&] { other = Greeter::Service::SayHello(context, request, response); }).join();
    response->set_message("thread said " + std::string(absl::StatusCodeToString(other.code())));
    return absl::OkStatus();
  }
};

}  // namespace

TEST_CASE(
    "a handler that asks a base-class default (its own, another method's, from another "
    "thread) and answers itself keeps its answer",
    "[codegen][mixed]") {
  FallbackGreeter impl;
  LoopbackChannel channel(&impl);
  Greeter::Stub stub(&channel);
  HelloReply reply;
  for (const auto& [name, want] : std::vector<std::pair<std::string, std::string>>{
           {"own-base", "fallback after UNIMPLEMENTED"},
           {"other-method", "ping said UNIMPLEMENTED"},
           {"thread", "thread said UNIMPLEMENTED"}}) {
    INFO(name);
    HelloRequest request;
    request.set_name(name);
    absl::Status s = stub.SayHello(request, &reply);
    INFO(s);
    REQUIRE(s.ok());
    CHECK(reply.message() == want);
  }
  // Ping itself, never overridden, still answers UNIMPLEMENTED through its async default.
  google::protobuf::Empty empty;
  CHECK(stub.Ping(empty, &empty).code() == absl::StatusCode::kUnimplemented);
}

namespace {

using zrpc::test::order::Answer;
using zrpc::test::order::Question;
using zrpc::test::order::Quiz;

// zrpc's one rule for template arguments (rpc/streaming.h): the rpc's request type, then its
// response type, in every type that names both, client or server, blocking or asynchronous.
// Quiz's rpcs take a Question and answer an Answer, so a type with its arguments the wrong way
// round would fail these.
static_assert(
    std::is_same_v<decltype(&Quiz::Service::Chat),
                   absl::Status (Quiz::Service::*)(zrpc::ServerContext&,
                                                   zrpc::ServerReaderWriter<Question, Answer>*)>);
// Read and Write are overloaded (with and without a bulk payload): each form takes its type.
using QuizServerStream = zrpc::ServerReaderWriter<Question, Answer>;
static_assert(std::is_same_v<
              decltype(std::declval<QuizServerStream&>().Read(std::declval<Question*>())), bool>);
static_assert(std::is_same_v<decltype(std::declval<QuizServerStream&>().Read(
                                 std::declval<Question*>(), std::declval<zrpc::IncomingBulk*>())),
                             bool>);
static_assert(
    std::is_same_v<decltype(std::declval<QuizServerStream&>().Write(std::declval<const Answer&>())),
                   bool>);
static_assert(
    std::is_same_v<decltype(std::declval<QuizServerStream&>().Write(
                       std::declval<const Answer&>(), std::declval<zrpc::OutgoingBulk>())),
                   bool>);
static_assert(
    std::is_same_v<decltype(&Quiz::AsyncService::Chat),
                   void (Quiz::AsyncService::*)(
                       std::unique_ptr<zrpc::ServerAsyncReaderWriter<Question, Answer>>)>);
static_assert(
    std::is_same_v<decltype(&Quiz::Stub::Chat), zrpc::ClientReaderWriter<Question, Answer> (
                                                    Quiz::Stub::*)(const zrpc::CallOptions&)>);
static_assert(std::is_same_v<decltype(&Quiz::Stub::AsyncChat),
                             zrpc::AsyncClientReaderWriter<Question, Answer> (Quiz::Stub::*)(
                                 const zrpc::CallOptions&)>);
// Client streaming and server streaming: the one-type readers and writers take the type they
// handle; the asynchronous server forms take both, in the rule's order.
static_assert(std::is_same_v<decltype(&Quiz::Service::Tell),
                             absl::Status (Quiz::Service::*)(
                                 zrpc::ServerContext&, zrpc::ServerReader<Question>*, Answer*)>);
static_assert(std::is_same_v<decltype(&Quiz::AsyncService::Tell),
                             void (Quiz::AsyncService::*)(
                                 std::unique_ptr<zrpc::ServerAsyncReader<Question, Answer>>)>);
static_assert(
    std::is_same_v<decltype(&Quiz::Stub::Tell), zrpc::ClientWriter<Question> (Quiz::Stub::*)(
                                                    Answer*, const zrpc::CallOptions&)>);
static_assert(std::is_same_v<decltype(&Quiz::Service::Listen),
                             absl::Status (Quiz::Service::*)(zrpc::ServerContext&, const Question&,
                                                             zrpc::ServerWriter<Answer>*)>);
static_assert(std::is_same_v<decltype(&Quiz::AsyncService::Listen),
                             void (Quiz::AsyncService::*)(
                                 std::unique_ptr<zrpc::ServerAsyncWriter<Question, Answer>>)>);
static_assert(
    std::is_same_v<decltype(&Quiz::Stub::Listen), zrpc::ClientReader<Answer> (Quiz::Stub::*)(
                                                      const Question&, const zrpc::CallOptions&)>);
static_assert(std::is_same_v<
              decltype(&Quiz::AsyncService::Ask),
              void (Quiz::AsyncService::*)(std::unique_ptr<zrpc::PendingCall<Question, Answer>>)>);

// The server's end of a stream, scripted: Read hands out `incoming`, each parsed into the
// prototype the dispatch opened the stream with; Write keeps each message's type and bytes.
class ScriptedStream : public zrpc::StreamCall {
 public:
  ScriptedStream(const google::protobuf::MessageLite* prototype, std::vector<std::string> incoming)
      : prototype_(prototype), incoming_(std::move(incoming)) {}

  bool Write(const google::protobuf::MessageLite& message, zrpc::OutgoingBulk bulk) override {
    written.emplace_back(message.GetTypeName(), message.SerializeAsString());
    written_bulk.push_back(bulk.size());
    return true;
  }
  google::protobuf::MessageLite* Read(zrpc::IncomingBulk* bulk) override {
    if (bulk != nullptr) bulk->Reset();
    if (prototype_ == nullptr || next_ == incoming_.size()) return nullptr;
    current_.reset(prototype_->New());
    if (!current_->ParseFromString(incoming_[next_++])) return nullptr;
    return current_.get();
  }

  std::vector<std::pair<std::string, std::string>> written;  // type name, serialization
  std::vector<size_t> written_bulk;                          // each message's payload's size

 private:
  const google::protobuf::MessageLite* prototype_;
  std::vector<std::string> incoming_;
  size_t next_ = 0;
  std::unique_ptr<google::protobuf::MessageLite> current_;
};

// A call that opens a ScriptedStream: what the blocking dispatch of a streaming method needs.
class ScriptedStreamCall : public LoopbackCall {
 public:
  ScriptedStreamCall(std::string request, std::vector<std::string> incoming)
      : LoopbackCall(std::move(request)), incoming_(std::move(incoming)) {}

  zrpc::StreamCall* OpenStream(const google::protobuf::MessageLite* read_prototype) override {
    read_type = read_prototype == nullptr ? "" : read_prototype->GetTypeName();
    stream = std::make_unique<ScriptedStream>(read_prototype, incoming_);
    return stream.get();
  }

  std::string read_type;  // the type the dispatch reads, "" when it reads none
  std::unique_ptr<ScriptedStream> stream;

 private:
  std::vector<std::string> incoming_;
};

// Answers each question with its text and length: reads Questions, writes Answers.
class QuizImpl : public Quiz::Service {
 public:
  absl::Status Ask(zrpc::ServerContext&, const Question& question, Answer* answer) override {
    *answer = AnswerTo(question);
    return absl::OkStatus();
  }
  absl::Status Chat(zrpc::ServerContext&,
                    zrpc::ServerReaderWriter<Question, Answer>* stream) override {
    Question question;
    while (stream->Read(&question)) {
      if (!stream->Write(AnswerTo(question))) break;
    }
    return absl::OkStatus();
  }
  absl::Status Listen(zrpc::ServerContext&, const Question& question,
                      zrpc::ServerWriter<Answer>* writer) override {
    for (int i = 0; i < 2; ++i) {
      if (!writer->Write(AnswerTo(question))) break;
    }
    return absl::OkStatus();
  }
  absl::Status Tell(zrpc::ServerContext&, zrpc::ServerReader<Question>* reader,
                    Answer* answer) override {
    Question question;
    std::string all;
    while (reader->Read(&question)) all += question.text();
    question.set_text(all);
    *answer = AnswerTo(question);
    return absl::OkStatus();
  }

  static Answer AnswerTo(const Question& question) {
    Answer answer;
    answer.set_text("re: " + question.text());
    answer.set_length(static_cast<uint32_t>(question.text().size()));
    return answer;
  }
};

std::string Serialized(const std::string& text) {
  Question question;
  question.set_text(text);
  return question.SerializeAsString();
}

int MethodIndex(const std::string& name) {
  const zrpc::ServiceInfo& info = Quiz::service_info();
  for (int i = 0; i < info.method_count; ++i) {
    if (info.methods[i].full_name == "zrpc.test.order.Quiz/" + name) return i;
  }
  FAIL("no method " << name);
  return -1;
}

}  // namespace

TEST_CASE(
    "a blocking bidirectional handler reads the request type and writes the response type "
    "through ServerReaderWriter<Request, Response>",
    "[codegen][streaming]") {
  QuizImpl impl;
  ScriptedStreamCall call("", {Serialized("why"), Serialized("how so")});
  impl.Dispatch(MethodIndex("Chat"), &call);
  REQUIRE(call.WaitForFinish());
  CHECK(call.status().ok());
  CHECK(call.read_type == "zrpc.test.order.Question");
  REQUIRE(call.stream != nullptr);
  REQUIRE(call.stream->written.size() == 2);
  for (const auto& [type, bytes] : call.stream->written) CHECK(type == "zrpc.test.order.Answer");
  Answer answer;
  REQUIRE(answer.ParseFromString(call.stream->written[1].second));
  CHECK(answer.text() == "re: how so");
  CHECK(answer.length() == 6);
}

TEST_CASE("blocking server- and client-streaming handlers keep the request and response types",
          "[codegen][streaming]") {
  QuizImpl impl;
  ScriptedStreamCall listen(Serialized("when"), {});
  impl.Dispatch(MethodIndex("Listen"), &listen);
  REQUIRE(listen.WaitForFinish());
  CHECK(listen.status().ok());
  CHECK(listen.read_type.empty());  // the one request came with the call
  REQUIRE(listen.stream != nullptr);
  REQUIRE(listen.stream->written.size() == 2);
  CHECK(listen.stream->written[0].first == "zrpc.test.order.Answer");

  ScriptedStreamCall tell("", {Serialized("a"), Serialized("bc")});
  impl.Dispatch(MethodIndex("Tell"), &tell);
  REQUIRE(tell.WaitForFinish());
  CHECK(tell.status().ok());
  CHECK(tell.read_type == "zrpc.test.order.Question");
  Answer answer;
  REQUIRE(answer.ParseFromString(tell.response()));
  CHECK(answer.text() == "re: abc");
  CHECK(answer.length() == 3);
}

TEST_CASE("a method marked idempotent says so, and its call goes whole through the channel",
          "[codegen]") {
  const zrpc::ServiceInfo& info = Quiz::service_info();
  REQUIRE(info.method_count == 4);
  CHECK(info.methods[0].idempotent);  // Ask: idempotency_level = NO_SIDE_EFFECTS
  for (int i = 1; i < 4; ++i) CHECK_FALSE(info.methods[i].idempotent);
  // A channel that does not retry (the loopback) takes its call as any other.
  QuizImpl impl;
  LoopbackChannel channel(&impl);
  Quiz::Stub stub(&channel);
  Question question;
  question.set_text("again?");
  Answer answer;
  const absl::Status status = stub.Ask(question, &answer);
  INFO(status);
  REQUIRE(status.ok());
  CHECK(answer.SerializeAsString() == QuizImpl::AnswerTo(question).SerializeAsString());
  CHECK(channel.last_method == "zrpc.test.order.Quiz/Ask");
}
