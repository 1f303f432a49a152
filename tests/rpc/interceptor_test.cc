// Server interceptors (rpc/interceptor.h) end to end: OnCallStart in order before the handler,
// OnCallEnd in reverse after the answer, on unary calls and streams; an interceptor that fails a
// call answers it with its trailing metadata, the handler never running and the rest of the
// chain never asked; TraceInterceptor (rpc/trace_interceptor.h) joins the caller's W3C trace,
// starts one when there is none or it is malformed, and logs each call with its ids.
//
// Built twice: over fakeverbs on the host (ZRPC_OVER_FAKEVERBS) and on the harness's device (tag
// "rdma").
#include "rpc/interceptor.h"

#include <catch2/catch.hpp>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
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

// Journals each handler that runs; Square answers the trace it sees as trailing metadata
// ("trace": "<trace id>/<parent id>/<span id>", or "none").
class JournaledNumbers : public Numbers::Service {
 public:
  explicit JournaledNumbers(Journal* journal) : journal_(journal) {}
  absl::Status Square(zrpc::ServerContext& context, const Number& request, Number* reply) override {
    journal_->Add("handler Square");
    reply->set_value(request.value() * request.value());
    const zrpc::TraceContext* trace = context.trace();
    return context.AddTrailingMetadata(
        "trace", trace == nullptr ? "none"
                                  : absl::StrCat(trace->trace_id_hex(), "/", trace->parent_id_hex(),
                                                 "/", trace->span_id_hex()));
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
