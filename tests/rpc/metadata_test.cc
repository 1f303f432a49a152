// Per-call metadata end to end (rpc/metadata.h; rpc/WIRE.md, "Metadata"): the client's metadata
// reaches the handler in order (repeated keys, binary values), the handler's trailing metadata
// and an error's status payloads come back, on unary calls and each kind of stream, beside
// messages larger than a slot, at the size limit and one past it; a call without metadata leaves
// both sides empty; a peer that sends a malformed block loses its own connection and no other.
//
// Built twice: over fakeverbs on the host (ZRPC_OVER_FAKEVERBS) and on the harness's device (tag
// "rdma").
#include <catch2/catch.hpp>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/cord.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "proto/examples/numbers.zrpc.h"
#include "rpc/channel.h"
#include "rpc/connection/rpc_header.h"
#include "rpc/server.h"
#include "tests/eventually.h"
#include "tests/rpc/raw_client.h"
#include "tests/rpc/runtime_fixture.h"
#include "tests/rpc/test_device.h"

namespace {

using zrpc::CallOptions;
using zrpc::Metadata;
using zrpc::examples::CountRequest;
using zrpc::examples::Number;
using zrpc::examples::Numbers;
using zrpc::examples::Total;
using zrpc::testing::kLong;

constexpr const char* kPayloadUrl = "type.googleapis.com/zrpc.test.Detail";

// Echoes every entry of the client's metadata back as trailing metadata, under "echo-" + key,
// then adds "peer" (the caller's address) and "entries" (how many it got). A client entry
// "fail" makes the call fail NOT_FOUND with its value as the message, with a status payload and
// the same trailers.
class EchoingNumbers : public Numbers::Service {
 public:
  absl::Status Square(zrpc::ServerContext& context, const Number& request, Number* reply) override {
    reply->set_value(request.value() * request.value());
    reply->set_pad(request.pad());  // large requests come back as large responses
    return Answer(context);
  }
  absl::Status Count(zrpc::ServerContext& context, const CountRequest& request,
                     zrpc::ServerWriter<Number>* writer) override {
    Number number;
    for (uint64_t i = 0; i < request.count(); ++i) {
      number.set_value(request.start() + i);
      if (!writer->Write(number)) return absl::CancelledError("write failed");
    }
    return Answer(context);
  }
  absl::Status Sum(zrpc::ServerContext& context, zrpc::ServerReader<Number>* reader,
                   Total* total) override {
    Number number;
    while (reader->Read(&number)) {
      total->set_sum(total->sum() + number.value());
      total->set_count(total->count() + 1);
    }
    return Answer(context);
  }
  absl::Status Double(zrpc::ServerContext& context,
                      zrpc::ServerReaderWriter<Number, Number>* stream) override {
    Number number;
    while (stream->Read(&number)) {
      number.set_value(number.value() * 2);
      if (!stream->Write(number)) return absl::CancelledError("write failed");
    }
    return Answer(context);
  }

 private:
  static absl::Status Answer(zrpc::ServerContext& context) {
    const Metadata& in = context.client_metadata();
    for (const Metadata::Entry& entry : in.entries()) {
      absl::Status added = context.AddTrailingMetadata("echo-" + entry.key, entry.value);
      if (!added.ok()) return added;  // the test's own limit cases
    }
    if (!context.peer().empty()) {
      static_cast<void>(context.AddTrailingMetadata("peer", context.peer()));
    }
    static_cast<void>(context.AddTrailingMetadata("entries", absl::StrCat(in.size())));
    if (const std::string* fail = in.Find("fail")) {
      absl::Status error = absl::NotFoundError(*fail);
      error.SetPayload(kPayloadUrl, absl::Cord(std::string("\x08\x2a", 2)));
      return error;
    }
    return absl::OkStatus();
  }
};

Metadata Sample() {
  Metadata m;
  REQUIRE(m.Add("tenant", "blue").ok());
  REQUIRE(m.Add("traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01").ok());
  REQUIRE(m.Add("tenant", "green").ok());
  REQUIRE(m.Add("key-bin", std::string("\0\x01\xff\n", 4)).ok());
  return m;
}

// The trailers EchoingNumbers sends for `sent`, less "peer" (checked apart).
void CheckEchoed(const Metadata& sent, const Metadata& trailers) {
  Metadata expected;
  for (const Metadata::Entry& entry : sent.entries()) {
    REQUIRE(expected.Add("echo-" + entry.key, entry.value).ok());
  }
  REQUIRE(expected.Add("entries", absl::StrCat(sent.size())).ok());
  Metadata got;
  for (const Metadata::Entry& entry : trailers.entries()) {
    if (entry.key != "peer") REQUIRE(got.Add(entry.key, entry.value).ok());
  }
  CHECK(got == expected);
  const std::string* peer = trailers.Find("peer");
  REQUIRE(peer != nullptr);
  CHECK(peer->find(':') != std::string::npos);  // "ip:port", the client's side of it
}

CallOptions With(const Metadata& metadata, Metadata* trailers) {
  CallOptions options = CallOptions::Timeout(kLong);
  options.metadata = metadata;
  options.trailing_metadata = trailers;
  return options;
}

}  // namespace

TEST_CASE("a unary call carries metadata to the handler and trailing metadata back", "[metadata]") {
  ZRPC_TEST_DEVICE(config);
  EchoingNumbers service;
  zrpc::testing::Served served(config, {&service});
  Numbers::Stub stub(served.channel.get());
  Number request, reply;
  request.set_value(7);
  const Metadata sent = Sample();
  Metadata trailers;
  REQUIRE(stub.Square(request, &reply, With(sent, &trailers)).ok());
  CHECK(reply.value() == 49);
  CheckEchoed(sent, trailers);

  // The same CallOptions again: trailing metadata is replaced, not appended to.
  const CallOptions again = With(sent, &trailers);
  REQUIRE(stub.Square(request, &reply, again).ok());
  CheckEchoed(sent, trailers);

  // Without metadata: the handler sees none, and only its own trailers come back.
  REQUIRE(stub.Square(request, &reply, With(Metadata(), &trailers)).ok());
  CheckEchoed(Metadata(), trailers);
  // Without a place for trailers: the call is unaffected.
  REQUIRE(stub.Square(request, &reply, With(sent, nullptr)).ok());
  CHECK(served.server->stats().protocol_violations == 0);
  CHECK(served.channel->stats().protocol_violations == 0);
}

TEST_CASE("an error carries trailing metadata and its status payloads", "[metadata]") {
  ZRPC_TEST_DEVICE(config);
  EchoingNumbers service;
  zrpc::testing::Served served(config, {&service});
  Numbers::Stub stub(served.channel.get());
  Metadata sent;
  REQUIRE(sent.Add("fail", "no such number").ok());
  Metadata trailers;
  Number request, reply;
  const absl::Status status = stub.Square(request, &reply, With(sent, &trailers));
  CHECK(status.code() == absl::StatusCode::kNotFound);
  CHECK(status.message() == "no such number");
  const auto detail = status.GetPayload(kPayloadUrl);
  REQUIRE(detail.has_value());
  CHECK(std::string(*detail) == std::string("\x08\x2a", 2));
  CheckEchoed(sent, trailers);
}

TEST_CASE("each kind of stream carries metadata at its opening and trailing metadata at its end",
          "[metadata]") {
  ZRPC_TEST_DEVICE(config);
  EchoingNumbers service;
  zrpc::testing::Served served(config, {&service});
  Numbers::Stub stub(served.channel.get());
  const Metadata sent = Sample();

  SECTION("server streaming") {
    Metadata trailers;
    CountRequest request;
    request.set_start(1);
    request.set_count(5);
    zrpc::ClientReader<Number> reader = stub.Count(request, With(sent, &trailers));
    Number number;
    int read = 0;
    while (reader.Read(&number)) ++read;
    REQUIRE(reader.Finish().ok());
    CHECK(read == 5);
    CheckEchoed(sent, trailers);
  }
  SECTION("client streaming") {
    Metadata trailers;
    Total total;
    zrpc::ClientWriter<Number> writer = stub.Sum(&total, With(sent, &trailers));
    Number number;
    for (int i = 1; i <= 4; ++i) {
      number.set_value(i);
      REQUIRE(writer.Write(number));
    }
    REQUIRE(writer.Finish().ok());
    CHECK(total.sum() == 10);
    CheckEchoed(sent, trailers);
  }
  SECTION("bidirectional, and failing") {
    Metadata with_fail = sent;
    REQUIRE(with_fail.Add("fail", "stream refused").ok());
    Metadata trailers;
    zrpc::ClientReaderWriter<Number, Number> stream = stub.Double(With(with_fail, &trailers));
    Number number;
    number.set_value(21);
    REQUIRE(stream.Write(number));
    REQUIRE(stream.Read(&number));
    CHECK(number.value() == 42);
    REQUIRE(stream.WritesDone());
    const absl::Status status = stream.Finish();
    CHECK(status.code() == absl::StatusCode::kNotFound);
    CHECK(status.GetPayload(kPayloadUrl).has_value());
    CheckEchoed(with_fail, trailers);
  }
}

TEST_CASE("metadata at its size limit travels beside messages larger than a slot", "[metadata]") {
  ZRPC_TEST_DEVICE(config);
  EchoingNumbers service;
  zrpc::testing::Served served(config, {&service});
  Numbers::Stub stub(served.channel.get());
  // The limit exactly, in two entries; the echo adds 5 bytes a key, so the trailers' own
  // limit is met by dropping nothing: the handler's Add refuses, and the call says so.
  Metadata full;
  REQUIRE(full.Add("a", std::string(1000, 'a')).ok());
  const size_t rest = Metadata::kMaxSize - full.encoded_size() - Metadata::kEntryOverhead - 1;
  REQUIRE(full.Add("b", std::string(rest, 'b')).ok());
  REQUIRE(full.encoded_size() == Metadata::kMaxSize);
  Metadata trailers;
  Number request, reply;
  request.set_value(3);
  request.set_pad(std::string(64 << 10, 'p'));  // past a slot: the body goes in a payload
  const absl::Status over = stub.Square(request, &reply, With(full, &trailers));
  CHECK(over.code() == absl::StatusCode::kResourceExhausted);  // the echo's trailers overflow
  CHECK(over.message().find("3072") != absl::string_view::npos);

  // Within the limit both ways: a large request and a large response, with metadata each way.
  Metadata half;
  REQUIRE(half.Add("a", std::string(1400, 'a')).ok());
  REQUIRE(stub.Square(request, &reply, With(half, &trailers)).ok());
  CHECK(reply.value() == 9);
  CHECK(reply.pad() == request.pad());
  CheckEchoed(half, trailers);
  // One past the limit never leaves the client: Add refuses it.
  Metadata past = full;
  CHECK(past.Add("c", "").code() == absl::StatusCode::kResourceExhausted);
  CHECK(past == full);
}

TEST_CASE("metadata that does not fit a small slot fails the call, naming the slot size",
          "[metadata]") {
  ZRPC_TEST_DEVICE(config);
  EchoingNumbers service;
  zrpc::ServerOptions server_options;
  server_options.slots.slot_size = 1024;
  zrpc::ChannelOptions channel_options;
  channel_options.slots.slot_size = 1024;
  zrpc::testing::Served served(config, {&service}, server_options, channel_options);
  Numbers::Stub stub(served.channel.get());
  Number request, reply;
  // What fits goes.
  Metadata small;
  REQUIRE(small.Add("a", std::string(500, 'a')).ok());
  Metadata trailers;
  REQUIRE(stub.Square(request, &reply, With(small, &trailers)).ok());
  CheckEchoed(small, trailers);
  // What does not fails before it is sent, and leaves no trailers of the call before.
  Metadata big;
  REQUIRE(big.Add("a", std::string(2000, 'a')).ok());
  const absl::Status status = stub.Square(request, &reply, With(big, &trailers));
  CHECK(status.code() == absl::StatusCode::kResourceExhausted);
  CHECK(status.message().find("slot_size") != absl::string_view::npos);
  CHECK(trailers.empty());
}

TEST_CASE("a peer sending a malformed metadata block loses its own connection, and no other",
          "[metadata]") {
  ZRPC_TEST_DEVICE(config);
  EchoingNumbers service;
  zrpc::testing::Served served(config, {&service});
  Numbers::Stub stub(served.channel.get());
  const uint32_t numbers = zrpc::ServiceId(Numbers::service_info().full_name);
  // Each body is a metadata block the server must refuse, then a valid Number.
  const std::vector<std::string> blocks = {
      std::string("\x06\x00\x00\x00\x00\x01\x09\x00k", 9),       // an entry cut short
      std::string("\x06\x00\x00\x00\x00\x01\x01\x00K\x01", 10),  // an uppercase key
      std::string("\x06\x00\x00\x00\x01\x01\x01\x00kv", 10),     // a status payload
      std::string("\x00\x10\x00\x00", 4),                        // 4,096 bytes claimed
  };
  uint64_t violations = 0;
  for (const std::string& block : blocks) {
    INFO(absl::CHexEscape(block));
    zrpc_test::RawClient raw;
    zrpc::testing::TransportPeer peer(config);
    auto connection = peer.Connect(config.addr, served.server->port(), &raw);
    REQUIRE(connection.ok());
    zrpc::RpcHeader header = zrpc::RpcHeader::Request(numbers, zrpc_test::kSquareIndex, 9, 0);
    header.flags |= zrpc::kRpcFlagMetadata;
    Number number;
    number.set_value(2);
    REQUIRE(zrpc_test::SendRaw(**connection, header, block + number.SerializeAsString()).ok());
    CHECK(raw.closed.WaitForNotificationWithTimeout(absl::Seconds(30)));
    CHECK(raw.Count(zrpc::RpcKind::kResponse) == 0);
    ++violations;
    CHECK(zrpc::testing::Eventually(
        [&] { return served.server->stats().protocol_violations == violations; }));
    // The well-behaved channel beside it is served throughout.
    Number request, reply;
    request.set_value(5);
    Metadata trailers;
    REQUIRE(stub.Square(request, &reply, With(Sample(), &trailers)).ok());
    CheckEchoed(Sample(), trailers);
  }
}
