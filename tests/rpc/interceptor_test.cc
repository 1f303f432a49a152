// Server interceptors (rpc/interceptor.h) end to end: OnCallStart in order before the handler,
// OnCallEnd in reverse after the answer, on unary calls and streams; an interceptor that fails a
// call answers it with its trailing metadata, the handler never running and the rest of the
// chain never asked. A channel's interceptors: metadata added as a call starts, their end seen
// before the caller hears (blocking, asynchronous, stream), a refusal failing the call with
// nothing sent. TraceInterceptor (rpc/trace_interceptor.h) joins the caller's W3C trace, starts
// one when there is none or it is malformed, logs each call with its ids, starts a trace on a
// channel that the server joins, and Propagate passes a handler's trace on.
//
// Built twice: over fakeverbs on the host (ZRPC_OVER_FAKEVERBS) and on the harness's device (tag
// "rdma").
#include "rpc/interceptor.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "proto/examples/numbers.zrpc.h"
#include "rpc/channel.h"
#include "rpc/server.h"
#include "rpc/trace_interceptor.h"
#include "tests/eventually.h"
#include "tests/log_capture.h"
#include "tests/rpc/runtime_fixture.h"
#include "tests/rpc/test_device.h"

namespace {

using zrpc::CallOptions;
using zrpc::Metadata;
using zrpc::examples::CountRequest;
using zrpc::examples::Number;
using zrpc::examples::Numbers;
using zrpc::testing::kLong;

constexpr const char* kTraceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

// What happened, in order, across the interceptors and the handler.
class Journal {
 public:
  void Add(std::string event) {
    absl::MutexLock lock(&mu_);
    events_.push_back(std::move(event));
  }
  std::vector<std::string> events() const {
    absl::MutexLock lock(&mu_);
    return events_;
  }
  size_t size() const {
    absl::MutexLock lock(&mu_);
    return events_.size();
  }

 private:
  mutable absl::Mutex mu_;
  std::vector<std::string> events_;
};

// Journals its start and end; adds "seen-by: <name>" to the trailers; fails the call
// PERMISSION_DENIED when the client sent "deny-<name>".
class Recording : public zrpc::ServerInterceptor {
 public:
  Recording(std::string name, Journal* journal) : name_(std::move(name)), journal_(journal) {}
  absl::Status OnCallStart(zrpc::ServerContext& context, const zrpc::MethodInfo& method) override {
    journal_->Add(absl::StrCat(name_, ".start ", method.full_name));
    static_cast<void>(context.AddTrailingMetadata("seen-by", name_));
    if (context.client_metadata().Find("deny-" + name_) != nullptr) {
      return absl::PermissionDeniedError(absl::StrCat("denied by ", name_));
    }
    return absl::OkStatus();
  }
  void OnCallEnd(zrpc::ServerContext&, const zrpc::MethodInfo& method,
                 const absl::Status& status) override {
    journal_->Add(absl::StrCat(name_, ".end ", method.full_name, " ",
                               absl::StatusCodeToString(status.code())));
  }

 private:
  const std::string name_;
  Journal* const journal_;
};

// A channel's: journals its start and end (with the trailers' count); adds "added-by: <name>"
// to the call's metadata; fails the call UNAUTHENTICATED when the metadata has "deny-<name>".
class ClientRecording : public zrpc::ClientInterceptor {
 public:
  ClientRecording(std::string name, Journal* journal) : name_(std::move(name)), journal_(journal) {}
  absl::Status OnCallStart(const zrpc::MethodInfo& method, Metadata& metadata) override {
    journal_->Add(absl::StrCat(name_, ".start ", method.full_name));
    if (metadata.Find("deny-" + name_) != nullptr) {
      return absl::UnauthenticatedError(absl::StrCat("no token from ", name_));
    }
    return metadata.Add("added-by", name_);
  }
  void OnCallEnd(const zrpc::MethodInfo& method, const absl::Status& status,
                 const Metadata& trailing) override {
    journal_->Add(absl::StrCat(name_, ".end ", method.full_name, " ",
                               absl::StatusCodeToString(status.code()),
                               " trailers=", trailing.size()));
  }

 private:
  const std::string name_;
  Journal* const journal_;
};

// Journals each handler that runs; Square answers the trace it sees as trailing metadata
// ("trace": "<trace id>/<parent id>/<span id>", or "none").
class JournaledNumbers : public Numbers::Service {
 public:
  explicit JournaledNumbers(Journal* journal) : journal_(journal) {}
  absl::Status Square(zrpc::ServerContext& context, const Number& request, Number* reply) override {
    journal_->Add("handler Square");
    reply->set_value(request.value() * request.value());
    // What the client's interceptors added, back as one trailer.
    std::string added;
    for (absl::string_view by : context.client_metadata().FindAll("added-by")) {
      absl::StrAppend(&added, added.empty() ? "" : ",", by);
    }
    if (!added.empty()) static_cast<void>(context.AddTrailingMetadata("added", added));
    const zrpc::TraceContext* trace = context.trace();
    return context.AddTrailingMetadata(
        "trace", trace == nullptr ? "none"
                                  : absl::StrCat(trace->trace_id_hex(), "/", trace->parent_id_hex(),
                                                 "/", trace->span_id_hex()));
  }
  absl::Status Double(zrpc::ServerContext&,
                      zrpc::ServerReaderWriter<Number, Number>* stream) override {
    Number number;
    while (stream->Read(&number)) {
      journal_->Add(absl::StrCat("handler got ", number.value()));
      number.set_value(number.value() * 2);
      if (!stream->Write(number)) return absl::CancelledError("write failed");
    }
    return absl::OkStatus();
  }
  absl::Status Sum(zrpc::ServerContext& context, zrpc::ServerReader<Number>* reader,
                   zrpc::examples::Total* total) override {
    Number number;
    while (reader->Read(&number)) total->set_sum(total->sum() + number.value());
    // A half-close is the client's "that is all": cancelled, the input is not whole.
    journal_->Add(context.IsCancelled() ? "handler Sum cancelled"
                                        : absl::StrCat("handler Sum total ", total->sum()));
    return absl::OkStatus();
  }
  absl::Status Count(zrpc::ServerContext&, const CountRequest& request,
                     zrpc::ServerWriter<Number>* writer) override {
    journal_->Add("handler Count");
    Number number;
    for (uint64_t i = 0; i < request.count(); ++i) {
      number.set_value(request.start() + i);
      if (!writer->Write(number)) return absl::CancelledError("write failed");
    }
    return absl::OkStatus();
  }

 private:
  Journal* const journal_;
};

const char* Way(zrpc::StreamDirection direction) {
  return direction == zrpc::StreamDirection::kSent ? "sent" : "recv";
}

// Journals each stream message "<name> sent|recv <value>"; refuses the one of value `refuse`
// going the way `refused` (FAILED_PRECONDITION, "<name> refused <value>").
template <typename Base>
class MessageWatch : public Base {
 public:
  MessageWatch(std::string name, Journal* journal, uint64_t refuse = 0,
               zrpc::StreamDirection refused = zrpc::StreamDirection::kReceived)
      : name_(std::move(name)), journal_(journal), refuse_(refuse), refused_(refused) {}
  absl::Status OnStreamMessage(zrpc::ServerContext&, const zrpc::MethodInfo& method,
                               zrpc::StreamDirection direction,
                               const google::protobuf::MessageLite& message) {
    return Watch(method, direction, message);
  }
  absl::Status OnStreamMessage(const zrpc::MethodInfo& method, zrpc::StreamDirection direction,
                               const google::protobuf::MessageLite& message) {
    return Watch(method, direction, message);
  }
  // A channel's end (a server's differs in signature: not journaled, its time is not the
  // caller's to order).
  void OnCallEnd(const zrpc::MethodInfo&, const absl::Status& status, const Metadata&) {
    journal_->Add(absl::StrCat(name_, " end ", absl::StatusCodeToString(status.code())));
  }

 private:
  absl::Status Watch(const zrpc::MethodInfo&, zrpc::StreamDirection direction,
                     const google::protobuf::MessageLite& message) {
    const uint64_t value = static_cast<const Number&>(message).value();
    journal_->Add(absl::StrCat(name_, " ", Way(direction), " ", value));
    if (value == refuse_ && direction == refused_) {
      return absl::FailedPreconditionError(absl::StrCat(name_, " refused ", value));
    }
    return absl::OkStatus();
  }
  const std::string name_;
  Journal* const journal_;
  const uint64_t refuse_;
  const zrpc::StreamDirection refused_;
};
using ServerWatch = MessageWatch<zrpc::ServerInterceptor>;
using ClientWatch = MessageWatch<zrpc::ClientInterceptor>;

zrpc::ServerOptions Intercepted(std::vector<std::shared_ptr<zrpc::ServerInterceptor>> chain) {
  zrpc::ServerOptions options;
  options.interceptors = std::move(chain);
  return options;
}

CallOptions With(const Metadata& metadata, Metadata* trailers) {
  CallOptions options = CallOptions::Timeout(kLong);
  options.metadata = metadata;
  options.trailing_metadata = trailers;
  return options;
}

// The trailing "trace" value of a Square call sent with `metadata`, through `stub`.
std::string TraceSeen(Numbers::Stub& stub, const Metadata& metadata) {
  Metadata trailers;
  Number request, reply;
  request.set_value(3);
  const absl::Status status = stub.Square(request, &reply, With(metadata, &trailers));
  INFO(status);
  REQUIRE(status.ok());
  const std::string* trace = trailers.Find("trace");
  REQUIRE(trace != nullptr);
  return *trace;
}

// A server whose chain is a Recording per name, in order, journaling with its handlers into
// `journal`, and a stub on a channel to it.
struct RecordedServer {
  RecordedServer(const zrpc::transport::DeviceConfig& config, const std::vector<std::string>& names)
      : service(&journal),
        served(config, {&service}, Chain(names, &journal)),
        stub(served.channel.get()) {}
  static zrpc::ServerOptions Chain(const std::vector<std::string>& names, Journal* journal) {
    std::vector<std::shared_ptr<zrpc::ServerInterceptor>> chain;
    for (const std::string& name : names)
      chain.push_back(std::make_shared<Recording>(name, journal));
    return Intercepted(std::move(chain));
  }
  Journal journal;
  JournaledNumbers service;
  zrpc::testing::Served served;
  Numbers::Stub stub;
};

}  // namespace

TEST_CASE("interceptors start in order before the handler and end in reverse after the answer",
          "[interceptor]") {
  ZRPC_TEST_DEVICE(config);
  RecordedServer server(config, {"a", "b"});
  Journal& journal = server.journal;
  Numbers::Stub& stub = server.stub;

  Metadata trailers;
  Number request, reply;
  request.set_value(5);
  REQUIRE(stub.Square(request, &reply, With(Metadata(), &trailers)).ok());
  CHECK(reply.value() == 25);
  CHECK(trailers.FindAll("seen-by") == std::vector<absl::string_view>{"a", "b"});
  // The ends run once the answer has gone: the caller may have it first.
  REQUIRE(zrpc::testing::Eventually([&] { return journal.size() == 5; }));
  CHECK(journal.events() == std::vector<std::string>{"a.start zrpc.examples.Numbers/Square",
                                                     "b.start zrpc.examples.Numbers/Square",
                                                     "handler Square",
                                                     "b.end zrpc.examples.Numbers/Square OK",
                                                     "a.end zrpc.examples.Numbers/Square OK"});

  // A stream: the same, around its handler's whole run.
  CountRequest count;
  count.set_start(1);
  count.set_count(3);
  zrpc::ClientReader<Number> reader = stub.Count(count, With(Metadata(), &trailers));
  Number number;
  int read = 0;
  while (reader.Read(&number)) ++read;
  REQUIRE(reader.Finish().ok());
  CHECK(read == 3);
  CHECK(trailers.FindAll("seen-by") == std::vector<absl::string_view>{"a", "b"});
  REQUIRE(zrpc::testing::Eventually([&] { return journal.size() == 10; }));
  const std::vector<std::string> events = journal.events();
  CHECK(std::vector<std::string>(events.begin() + 5, events.end()) ==
        std::vector<std::string>{"a.start zrpc.examples.Numbers/Count",
                                 "b.start zrpc.examples.Numbers/Count", "handler Count",
                                 "b.end zrpc.examples.Numbers/Count OK",
                                 "a.end zrpc.examples.Numbers/Count OK"});
}

TEST_CASE("an interceptor that fails a call answers it: no handler, the rest of the chain unasked",
          "[interceptor]") {
  ZRPC_TEST_DEVICE(config);
  RecordedServer server(config, {"a", "b", "c"});
  Journal& journal = server.journal;
  Numbers::Stub& stub = server.stub;
  Metadata deny;
  REQUIRE(deny.Add("deny-b", "").ok());

  Metadata trailers;
  Number request, reply;
  const absl::Status status = stub.Square(request, &reply, With(deny, &trailers));
  CHECK(status.code() == absl::StatusCode::kPermissionDenied);
  CHECK(status.message() == "denied by b");
  // What the interceptors added before the refusal travels with it.
  CHECK(trailers.FindAll("seen-by") == std::vector<absl::string_view>{"a", "b"});
  REQUIRE(zrpc::testing::Eventually([&] { return journal.size() == 3; }));
  absl::SleepFor(absl::Milliseconds(50));  // nothing more comes
  CHECK(journal.events() ==
        std::vector<std::string>{"a.start zrpc.examples.Numbers/Square",
                                 "b.start zrpc.examples.Numbers/Square",
                                 "a.end zrpc.examples.Numbers/Square PERMISSION_DENIED"});

  // A stream refused the same way ends with the refusal, no message read.
  zrpc::ClientReader<Number> reader = stub.Count(CountRequest(), With(deny, &trailers));
  Number number;
  CHECK_FALSE(reader.Read(&number));
  const absl::Status finished = reader.Finish();
  CHECK(finished.code() == absl::StatusCode::kPermissionDenied);
  CHECK(trailers.FindAll("seen-by") == std::vector<absl::string_view>{"a", "b"});
  // The server and its connection are fine: the next call goes through.
  REQUIRE(stub.Square(request, &reply, With(Metadata(), &trailers)).ok());
  CHECK(server.served.server->stats().protocol_violations == 0);
}

TEST_CASE("a server refuses a null interceptor at Create, naming it", "[interceptor]") {
  ZRPC_TEST_DEVICE(config);
  zrpc::ServerOptions options = Intercepted({std::make_shared<zrpc::TraceInterceptor>(), nullptr});
  options.device = config;
  auto server = zrpc::Server::Create(options);
  REQUIRE_FALSE(server.ok());
  CHECK(server.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(server.status().message() == "ServerOptions::interceptors[1] is null");
}

TEST_CASE(
    "TraceInterceptor joins the caller's trace, or starts one, under a span of the call's own",
    "[interceptor][trace]") {
  ZRPC_TEST_DEVICE(config);
  Journal journal;
  JournaledNumbers service(&journal);
  zrpc::TraceInterceptor::Options trace_options;
  trace_options.log_calls = true;
  zrpc::testing::Served served(
      config, {&service}, Intercepted({std::make_shared<zrpc::TraceInterceptor>(trace_options)}));
  Numbers::Stub stub(served.channel.get());

  Metadata joined;
  REQUIRE(joined.Add("traceparent", kTraceparent).ok());
  std::string span;
  {
    zrpc::testing::LogCapture logs(zrpc::LogLevel::kInfo);
    const std::string seen = TraceSeen(stub, joined);
    INFO(seen);
    REQUIRE(seen.size() == 32 + 1 + 16 + 1 + 16);
    CHECK(absl::StartsWith(seen, "4bf92f3577b34da6a3ce929d0e0e4736/00f067aa0ba902b7/"));
    span = seen.substr(50);
    CHECK(span != "0000000000000000");
    CHECK(span != "00f067aa0ba902b7");
    // The log line, once the call's end ran: method, the ids, who called, the status.
    const std::string expected = absl::StrCat(
        "zrpc.examples.Numbers/Square trace=4bf92f3577b34da6a3ce929d0e0e4736 span=", span,
        " parent=00f067aa0ba902b7 from ");
    CHECK(zrpc::testing::Eventually([&] {
      for (const auto& record : logs.records()) {
        if (record.component == "trace" && absl::StartsWith(record.message, expected) &&
            absl::EndsWith(record.message, ": OK")) {
          return true;
        }
      }
      return false;
    }));
  }
  // Each call is a span of its own.
  CHECK(TraceSeen(stub, joined).substr(50) != span);

  // No traceparent, two of them, or one that breaks the format: a new trace, this call its root.
  auto check_new_trace = [&](const Metadata& metadata) {
    const std::string seen = TraceSeen(stub, metadata);
    INFO(seen);
    REQUIRE(seen.size() == 66);
    CHECK(seen.substr(0, 32) != "4bf92f3577b34da6a3ce929d0e0e4736");
    CHECK(seen.substr(0, 32) != std::string(32, '0'));
    CHECK(seen.substr(33, 16) == std::string(16, '0'));
  };
  check_new_trace(Metadata());
  Metadata twice = joined;
  REQUIRE(twice.Add("traceparent", kTraceparent).ok());
  check_new_trace(twice);
  Metadata upper;
  REQUIRE(upper.Add("traceparent", "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01").ok());
  check_new_trace(upper);

  // start_traces off: a call without a traceparent has no trace.
  JournaledNumbers plain_service(&journal);
  zrpc::TraceInterceptor::Options joining_only;
  joining_only.start_traces = false;
  zrpc::testing::Served plain(
      config, {&plain_service},
      Intercepted({std::make_shared<zrpc::TraceInterceptor>(joining_only)}));
  Numbers::Stub plain_stub(plain.channel.get());
  CHECK(TraceSeen(plain_stub, Metadata()) == "none");
  CHECK(absl::StartsWith(TraceSeen(plain_stub, joined), "4bf92f3577b34da6a3ce929d0e0e4736/"));
}

namespace {

// A server without interceptors and a channel whose chain is a ClientRecording per name.
struct RecordedChannel {
  RecordedChannel(const zrpc::transport::DeviceConfig& config,
                  const std::vector<std::string>& names, zrpc::ChannelOptions options = {})
      : service(&server_journal),
        served(config, {&service}, {}, Chain(names, &journal, std::move(options))),
        stub(served.channel.get()) {}
  static zrpc::ChannelOptions Chain(const std::vector<std::string>& names, Journal* journal,
                                    zrpc::ChannelOptions options) {
    for (const std::string& name : names) {
      options.interceptors.push_back(std::make_shared<ClientRecording>(name, journal));
    }
    return options;
  }
  Journal journal;         // the channel's interceptors
  Journal server_journal;  // the handlers
  JournaledNumbers service;
  zrpc::testing::Served served;
  Numbers::Stub stub;
};

}  // namespace

TEST_CASE(
    "a channel's interceptors add metadata as a call starts and see its end before the caller",
    "[interceptor]") {
  ZRPC_TEST_DEVICE(config);
  RecordedChannel channel(config, {"x", "y"});
  Metadata trailers;
  Number request, reply;
  request.set_value(4);
  REQUIRE(channel.stub.Square(request, &reply, With(Metadata(), &trailers)).ok());
  CHECK(reply.value() == 16);
  // The server saw what both added, in order; the caller gets the trailers as ever.
  const std::string* added = trailers.Find("added");
  REQUIRE(added != nullptr);
  CHECK(*added == "x,y");
  // Both ends ran before the blocking call returned: no waiting here.
  CHECK(channel.journal.events() ==
        std::vector<std::string>{"x.start zrpc.examples.Numbers/Square",
                                 "y.start zrpc.examples.Numbers/Square",
                                 "y.end zrpc.examples.Numbers/Square OK trailers=2",
                                 "x.end zrpc.examples.Numbers/Square OK trailers=2"});

  // The asynchronous form: the ends ran before its callback.
  std::vector<std::string> seen_in_done;
  absl::Notification done;
  channel.stub.AsyncSquare(request, &reply, With(Metadata(), nullptr), [&](absl::Status status) {
    CHECK(status.ok());
    seen_in_done = channel.journal.events();
    done.Notify();
  });
  REQUIRE(done.WaitForNotificationWithTimeout(kLong));
  REQUIRE(seen_in_done.size() == 8);
  CHECK(seen_in_done[7] == "x.end zrpc.examples.Numbers/Square OK trailers=2");

  // A stream: the ends ran before its Finish returned, with its trailers.
  CountRequest count;
  count.set_start(1);
  count.set_count(2);
  zrpc::ClientReader<Number> reader = channel.stub.Count(count, With(Metadata(), &trailers));
  Number number;
  while (reader.Read(&number)) {
  }
  REQUIRE(reader.Finish().ok());
  const std::vector<std::string> events = channel.journal.events();
  REQUIRE(events.size() == 12);
  CHECK(events[10] == "y.end zrpc.examples.Numbers/Count OK trailers=0");
  CHECK(events[11] == "x.end zrpc.examples.Numbers/Count OK trailers=0");
}

TEST_CASE("a channel's interceptor that fails a call fails it before anything is sent",
          "[interceptor]") {
  ZRPC_TEST_DEVICE(config);
  zrpc::ChannelOptions options;
  options.max_message_size = 4096;
  RecordedChannel channel(config, {"x", "y", "z"}, options);
  Metadata deny;
  REQUIRE(deny.Add("deny-y", "").ok());
  Metadata trailers;
  REQUIRE(trailers.Add("stale", "from before").ok());
  Number request, reply;
  const absl::Status status = channel.stub.Square(request, &reply, With(deny, &trailers));
  CHECK(status.code() == absl::StatusCode::kUnauthenticated);
  CHECK(status.message() == "no token from y");
  CHECK(trailers.empty());  // the call's, not an earlier one's
  CHECK(channel.journal.events() ==
        std::vector<std::string>{"x.start zrpc.examples.Numbers/Square",
                                 "y.start zrpc.examples.Numbers/Square",
                                 "x.end zrpc.examples.Numbers/Square UNAUTHENTICATED trailers=0"});
  // A stream refused the same way.
  zrpc::ClientReader<Number> reader = channel.stub.Count(CountRequest(), With(deny, &trailers));
  Number number;
  CHECK_FALSE(reader.Read(&number));
  CHECK(reader.Finish().code() == absl::StatusCode::kUnauthenticated);
  // Nothing reached the server.
  CHECK(channel.server_journal.size() == 0);
  CHECK(channel.served.server->stats().calls_started == 0);

  // A call the runtime refuses after the interceptors started (too large to send): they see it.
  request.set_pad(std::string(8192, 'p'));
  CHECK(channel.stub.Square(request, &reply, With(Metadata(), nullptr)).code() ==
        absl::StatusCode::kResourceExhausted);
  const std::vector<std::string> events = channel.journal.events();
  REQUIRE(events.size() >= 3);
  CHECK(events.back() == "x.end zrpc.examples.Numbers/Square RESOURCE_EXHAUSTED trailers=0");
}

TEST_CASE("a channel refuses a null interceptor, naming it", "[interceptor]") {
  ZRPC_TEST_DEVICE(config);
  zrpc::ChannelOptions options;
  options.device = config;
  options.interceptors.push_back(nullptr);
  auto channel = zrpc::CreateChannel(zrpc::testing::TargetOf(config, 1), options);
  REQUIRE_FALSE(channel.ok());
  CHECK(channel.status().message() == "ChannelOptions::interceptors[0] is null");
}

TEST_CASE("TraceInterceptor on both sides: the channel starts a trace the server joins",
          "[interceptor][trace]") {
  ZRPC_TEST_DEVICE(config);
  Journal journal;
  JournaledNumbers service(&journal);
  auto tracing = std::make_shared<zrpc::TraceInterceptor>();
  zrpc::ChannelOptions channel_options;
  channel_options.interceptors.push_back(tracing);
  zrpc::testing::Served served(config, {&service}, Intercepted({tracing}), channel_options);
  Numbers::Stub stub(served.channel.get());
  // The server's span has the channel's as its parent (not zero: not a trace of its own).
  const std::string seen = TraceSeen(stub, Metadata());
  INFO(seen);
  REQUIRE(seen.size() == 66);
  CHECK(seen.substr(0, 32) != std::string(32, '0'));
  CHECK(seen.substr(33, 16) != std::string(16, '0'));
  // A traceparent the caller set is kept: the server joins that one.
  Metadata joined;
  REQUIRE(joined.Add("traceparent", kTraceparent).ok());
  CHECK(absl::StartsWith(TraceSeen(stub, joined),
                         "4bf92f3577b34da6a3ce929d0e0e4736/00f067aa0ba902b7/"));
}

TEST_CASE("TraceInterceptor::Propagate passes a handler's trace on to the calls it makes",
          "[interceptor][trace]") {
  zrpc::ServerContext context;
  CallOptions options;
  REQUIRE(zrpc::TraceInterceptor::Propagate(context, &options).ok());  // no trace: nothing
  CHECK(options.metadata.empty());
  std::optional<zrpc::TraceContext> trace = zrpc::TraceContext::Parse(kTraceparent);
  REQUIRE(trace.has_value());
  trace->span_id = {0xa, 0xb, 0xc, 0xd, 1, 2, 3, 4};
  context.SetTrace(*trace);
  REQUIRE(zrpc::TraceInterceptor::Propagate(context, &options).ok());
  const std::string* sent = options.metadata.Find("traceparent");
  REQUIRE(sent != nullptr);
  // The same trace, the handler's span as the next call's parent.
  CHECK(*sent == "00-4bf92f3577b34da6a3ce929d0e0e4736-0a0b0c0d01020304-01");
  // Once is enough: a second Propagate (or a traceparent set by hand) is left alone.
  REQUIRE(zrpc::TraceInterceptor::Propagate(context, &options).ok());
  CHECK(options.metadata.size() == 1);
}

// Server watches a, b and channel watches c, d on one connection, each refusing the message
// `refuse` going the way `refused` if its name is `refuser`.
struct Watched {
  Watched(const zrpc::transport::DeviceConfig& config, const std::string& refuser = "",
          uint64_t refuse = 0, zrpc::StreamDirection refused = zrpc::StreamDirection::kReceived)
      : service(&journal),
        served(config, {&service},
               Intercepted(
                   {Server("a", refuser, refuse, refused), Server("b", refuser, refuse, refused)}),
               Channel(
                   {Client("c", refuser, refuse, refused), Client("d", refuser, refuse, refused)})),
        stub(served.channel.get()) {}
  std::shared_ptr<zrpc::ServerInterceptor> Server(const std::string& name,
                                                  const std::string& refuser, uint64_t refuse,
                                                  zrpc::StreamDirection refused) {
    return std::make_shared<ServerWatch>(name, &journal, name == refuser ? refuse : 0, refused);
  }
  std::shared_ptr<zrpc::ClientInterceptor> Client(const std::string& name,
                                                  const std::string& refuser, uint64_t refuse,
                                                  zrpc::StreamDirection refused) {
    return std::make_shared<ClientWatch>(name, &journal, name == refuser ? refuse : 0, refused);
  }
  static zrpc::ChannelOptions Channel(std::vector<std::shared_ptr<zrpc::ClientInterceptor>> chain) {
    zrpc::ChannelOptions options;
    options.interceptors = std::move(chain);
    return options;
  }
  // Writes `value` on `chat` and reads the answer (0: none came).
  static uint64_t Exchange(zrpc::ClientReaderWriter<Number, Number>& chat, uint64_t value) {
    Number number;
    number.set_value(value);
    if (!chat.Write(number)) return 0;
    return chat.Read(&number) ? number.value() : 0;
  }
  Journal journal;
  JournaledNumbers service;
  zrpc::testing::Served served;
  Numbers::Stub stub;
};

TEST_CASE("interceptors see each stream message: the way in in order, the way out in reverse",
          "[interceptor][messages]") {
  ZRPC_TEST_DEVICE(config);
  Watched w(config);
  zrpc::ClientReaderWriter<Number, Number> chat = w.stub.Double(CallOptions::Timeout(kLong));
  CHECK(Watched::Exchange(chat, 1) == 2);
  CHECK(Watched::Exchange(chat, 3) == 6);
  REQUIRE(chat.WritesDone());
  CHECK(chat.Finish().ok());
  // A Write returns once its message is sent and the Read that follows waits for the answer, so
  // the order is fixed: the channel's c, d on the way out; the server's a, b on the way in, the
  // handler, b, a on the way out; the channel's d, c on the way in.
  CHECK(w.journal.events() ==
        std::vector<std::string>{"c sent 1",      "d sent 1",      "a recv 1", "b recv 1",
                                 "handler got 1", "b sent 2",      "a sent 2", "d recv 2",
                                 "c recv 2",      "c sent 3",      "d sent 3", "a recv 3",
                                 "b recv 3",      "handler got 3", "b sent 6", "a sent 6",
                                 "d recv 6",      "c recv 6",      "d end OK", "c end OK"});
}

TEST_CASE("an interceptor that refuses a stream message fails the call with its status",
          "[interceptor][messages]") {
  ZRPC_TEST_DEVICE(config);
  struct Case {
    const char* refuser;
    uint64_t refuse;
    zrpc::StreamDirection refused;
    const char* last;  // the last message seen by anyone
  };
  const Case cases[] = {
      // The server's b refuses the client's 13: the handler never sees it.
      {"b", 13, zrpc::StreamDirection::kReceived, "b recv 13"},
      // The server's a refuses the handler's 26: it is never sent.
      {"a", 26, zrpc::StreamDirection::kSent, "a sent 26"},
      // The channel's d refuses the caller's 13: it is never sent.
      {"d", 13, zrpc::StreamDirection::kSent, "d sent 13"},
      // The channel's c refuses the server's 26: the caller never sees it.
      {"c", 26, zrpc::StreamDirection::kReceived, "c recv 26"},
  };
  for (const Case& c : cases) {
    INFO(c.refuser << " refuses " << c.refuse);
    Watched w(config, c.refuser, c.refuse, c.refused);
    zrpc::ClientReaderWriter<Number, Number> chat = w.stub.Double(CallOptions::Timeout(kLong));
    CHECK(Watched::Exchange(chat, 1) == 2);
    CHECK(Watched::Exchange(chat, 13) == 0);
    const absl::Status status = chat.Finish();
    INFO(status);
    CHECK(status.code() == absl::StatusCode::kFailedPrecondition);
    CHECK(absl::StrContains(status.message(), absl::StrCat(c.refuser, " refused ", c.refuse)));
    // Nothing went past the refusal, and the channel's interceptors saw the call's end before
    // Finish returned.
    const std::vector<std::string> events = w.journal.events();
    REQUIRE(events.size() >= 3);
    CHECK(events[events.size() - 3] == c.last);
    CHECK(events[events.size() - 2] == "d end FAILED_PRECONDITION");
    CHECK(events.back() == "c end FAILED_PRECONDITION");
    CHECK(zrpc::testing::Eventually([&] { return w.served.server->stats().streams_open == 0; }));
  }
}

TEST_CASE("an asynchronous reader's messages pass the channel's interceptors as its reads complete",
          "[interceptor][messages]") {
  ZRPC_TEST_DEVICE(config);
  // c refuses the server's 3: the reader gets 1 and 2, then no more, and Finish says why.
  Watched w(config, "c", 3, zrpc::StreamDirection::kReceived);
  CountRequest request;
  request.set_start(1);
  request.set_count(5);
  zrpc::AsyncClientReader<Number> reader = w.stub.AsyncCount(request, CallOptions::Timeout(kLong));
  Number number;
  std::vector<uint64_t> read;
  absl::Notification read_all;
  std::function<void(bool)> on_read = [&](bool ok) {
    if (!ok) return read_all.Notify();
    read.push_back(number.value());
    reader.Read(&number, on_read);
  };
  reader.Read(&number, on_read);
  REQUIRE(read_all.WaitForNotificationWithTimeout(kLong));
  absl::Notification finished;
  absl::Status status;
  reader.Finish([&](absl::Status s) {
    status = s;
    finished.Notify();
  });
  REQUIRE(finished.WaitForNotificationWithTimeout(kLong));
  CHECK(read == std::vector<uint64_t>{1, 2});
  INFO(status);
  CHECK(status.code() == absl::StatusCode::kFailedPrecondition);
  CHECK(absl::StrContains(status.message(), "c refused 3"));
}

TEST_CASE("a client refusal sends no half-close: the server never takes the input for whole",
          "[interceptor][messages]") {
  ZRPC_TEST_DEVICE(config);
  // d refuses the caller's 13 after 1 went; WritesDone then sends nothing, and the server's
  // handler hears the cancel, never an end of input after 1 alone.
  Watched w(config, "d", 13, zrpc::StreamDirection::kSent);
  zrpc::examples::Total total;
  zrpc::ClientWriter<Number> writer = w.stub.Sum(&total, CallOptions::Timeout(kLong));
  Number number;
  number.set_value(1);
  REQUIRE(writer.Write(number));
  number.set_value(13);
  CHECK_FALSE(writer.Write(number));
  CHECK_FALSE(writer.WritesDone());
  const absl::Status status = writer.Finish();
  INFO(status);
  CHECK(status.code() == absl::StatusCode::kFailedPrecondition);
  CHECK(absl::StrContains(status.message(), "d refused 13"));
  CHECK(zrpc::testing::Eventually([&] { return w.served.server->stats().streams_open == 0; }));
  const std::vector<std::string> events = w.journal.events();
  CHECK(std::find(events.begin(), events.end(), "handler Sum total 1") == events.end());
  CHECK(std::find(events.begin(), events.end(), "handler Sum cancelled") != events.end());
}
