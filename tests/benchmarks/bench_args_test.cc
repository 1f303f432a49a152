// zrpc_bench's command line: what it accepts, and that every mistake is refused by name.
#include "benchmarks/bench_args.h"

#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "absl/strings/match.h"

namespace {

using zrpc::bench::BenchArgs;
using zrpc::bench::ParseBenchArgs;
using zrpc::bench::Workload;

absl::StatusOr<BenchArgs> Parse(std::vector<std::string> args) { return ParseBenchArgs(args); }

void Refused(std::vector<std::string> args, const std::string& says) {
  absl::StatusOr<BenchArgs> parsed = Parse(args);
  INFO(parsed.status());
  REQUIRE_FALSE(parsed.ok());
  CHECK(parsed.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(absl::StrContains(parsed.status().message(), says));
}

TEST_CASE("zrpc_bench arguments: servers and clients, lists, defaults") {
  auto server = Parse({"server", "--listen", "10.0.0.1:7471", "--pollers", "2", "--event"});
  REQUIRE(server.ok());
  CHECK(server->server);
  CHECK(server->listen == "10.0.0.1:7471");
  CHECK(server->pollers == 2);
  CHECK(server->event);
  CHECK(server->arena == 0);              // as large as --max-bulk: every payload written
  CHECK_FALSE(server->spin.has_value());  // the options' default
  auto spinning = Parse({"server", "--event", "--spin=1ms"});
  REQUIRE(spinning.ok());
  CHECK(spinning->spin == absl::Milliseconds(1));
  auto no_spin = Parse({"client", "--connect", "h:1", "--spin", "0", "--event"});
  REQUIRE(no_spin.ok());
  CHECK(no_spin->spin == absl::ZeroDuration());
  auto at_limit = Parse({"client", "--connect", "h:1", "--event", "--spin", "1s"});
  REQUIRE(at_limit.ok());
  CHECK(at_limit->spin == absl::Seconds(1));
  auto small_arena = Parse({"server", "--arena", "4096"});
  REQUIRE(small_arena.ok());
  CHECK(small_arena->arena == 4096);

  auto client = Parse({"client", "--connect", "10.0.0.1:7471", "--workload", "put", "--size",
                       "4096,1048576", "--in-flight", "1,16", "--threads", "1", "--calls", "500",
                       "--warmup", "0", "--round", "2", "--json", "/tmp/x.jsonl"});
  INFO(client.status());
  REQUIRE(client.ok());
  CHECK_FALSE(client->server);
  CHECK(client->workload == Workload::kPut);
  CHECK(client->sizes == std::vector<uint64_t>{4096, 1048576});
  CHECK(client->in_flight == std::vector<int>{1, 16});
  CHECK(client->connections == std::vector<int>{1});
  CHECK(client->calls == 500);
  CHECK(client->warmup == 0);
  CHECK(client->round == 2);
  CHECK(client->json == "/tmp/x.jsonl");
  CHECK_FALSE(client->registered);
  auto registered = Parse({"client", "--connect", "h:1", "--workload", "put", "--registered"});
  REQUIRE(registered.ok());
  CHECK(registered->registered);
  // The default configuration users get: blocking callers, handlers on the server's pool.
  CHECK_FALSE(client->blocking);
  auto blocking =
      Parse({"client", "--connect", "h:1", "--blocking", "--threads", "2", "--in-flight", "2"});
  REQUIRE(blocking.ok());
  CHECK(blocking->blocking);
  auto pool = Parse({"server", "--pool-handlers", "--event"});
  REQUIRE(pool.ok());
  CHECK(pool->pool_handlers);
  CHECK_FALSE(Parse({"server"})->pool_handlers);

  auto sweep = Parse({"client", "--connect", "h:1", "--sweep"});
  REQUIRE(sweep.ok());
  CHECK(sweep->sizes.size() == 4);
  CHECK(sweep->in_flight.size() == 4);
  CHECK(sweep->connections.size() == 2);
  CHECK(sweep->max_bytes_in_flight == 0);  // echo: every combination
  auto bulk_sweep = Parse({"client", "--connect", "h:1", "--workload", "put", "--sweep"});
  REQUIRE(bulk_sweep.ok());
  CHECK(bulk_sweep->sizes.back() == (16u << 20));
  CHECK(bulk_sweep->max_bytes_in_flight == zrpc::bench::kSweepBulkBytes);

  auto timed = Parse({"client", "--connect", "h:1", "--duration", "2.5"});
  REQUIRE(timed.ok());
  CHECK(timed->duration == absl::Milliseconds(2500));

  auto stream = Parse({"client", "--connect", "h:1", "--workload", "stream", "--size", "256K",
                       "--in-flight", "4096"});
  INFO(stream.status());
  REQUIRE(stream.ok());
  CHECK(stream->workload == Workload::kStream);
  CHECK(std::string(zrpc::bench::WorkloadName(stream->workload)) == "stream");
}

TEST_CASE("zrpc_bench arguments: every mistake is refused by name") {
  Refused({}, "mode");
  Refused({"serve"}, "mode");
  Refused({"client"}, "--connect is required");
  Refused({"client", "--connect"}, "--connect needs a value");
  Refused({"client", "--connect", "h:1", "--size", "12x"}, "--size: \"12x\"");
  Refused({"client", "--connect", "h:1", "--size", "1,,2"}, "--size");
  Refused({"client", "--connect", "h:1", "--in-flight", "0"}, "--in-flight");
  Refused({"client", "--connect", "h:1", "--threads", "4", "--in-flight", "2"},
          "less than --threads");
  Refused({"client", "--connect", "h:1", "--workload", "scan"}, "not echo, put, get or stream");
  // A stream's limits: one stream and one window, messages within the client's arena.
  Refused({"client", "--connect", "h:1", "--workload", "stream", "--in-flight", "1,2"},
          "one --in-flight");
  Refused({"client", "--connect", "h:1", "--workload", "stream", "--size", "262145"},
          "at most 256 KiB");
  Refused({"client", "--connect", "h:1", "--workload", "stream", "--connections", "2"},
          "one stream on one connection");
  Refused({"client", "--connect", "h:1", "--workload", "stream", "--sweep"},
          "one stream on one connection");
  Refused({"client", "--connect", "h:1", "--workload", "get", "--registered"},
          "only put sends a payload");
  Refused({"client", "--connect", "h:1", "--registered"}, "only put sends a payload");
  Refused({"server", "--registered"}, "--registered");
  Refused({"client", "--connect", "h:1", "--blocking", "--workload", "put"},
          "--blocking: echo only");
  Refused({"client", "--connect", "h:1", "--blocking", "--in-flight", "2"}, "one call in flight");
  Refused({"client", "--connect", "h:1", "--blocking", "--sweep"}, "no --sweep");
  Refused({"client", "--pool-handlers", "--connect", "h:1"}, "--pool-handlers is a server flag");
  Refused({"server", "--blocking"}, "--blocking is a client flag");
  Refused({"client", "--connect", "h:1", "--calls", "5", "--duration", "1"}, "exclude");
  Refused({"client", "--connect", "h:1", "--duration", "-1"}, "--duration");
  Refused({"client", "--connect", "h:1", "--size", "2097152"}, "use put or get");
  Refused({"client", "--connect", "h:1", "--listen", "x:1"}, "server flag");
  Refused({"server", "--connect", "x:1"}, "client flag");
  Refused({"server", "--frobnicate"}, "unknown option --frobnicate");
  Refused({"server", "--event=yes"}, "--event takes no value");
  Refused({"server", "--spin", "50us"}, "--spin: a busy poller never sleeps; it needs --event");
  Refused({"server", "--event", "--spin", "50"}, "--spin: \"50\" is not a duration");
  Refused({"server", "--event", "--spin", "-1us"}, "--spin: \"-1us\"");
  Refused({"client", "--connect", "h:1", "--event", "--spin", "1001ms"}, "--spin: \"1001ms\"");
  Refused({"client", "--connect", "h:1", "--size", "64", "--size", "128"}, "--size given twice");
  Refused({"client", "extra", "--connect", "h:1"}, "unexpected argument 'extra'");
  Refused({"client", "--connect", "h:1", "--size", "64Q"}, "--size: \"64Q\" is not a byte count");
  Refused({"client", "--connect", "h:1", "--size", "2G"}, "--size: \"2G\"");  // past 1 GiB
  Refused({"server", "--max-bulk=0"}, "--max-bulk");
  Refused({"server", "--pollers", "65"}, "--pollers");
  Refused({"server", "--arena", "100"}, "not a multiple of 64");
  Refused({"server", "--arena", "0"}, "--arena");
  Refused({"client", "--connect", "h:1", "--arena", "4096"}, "server flag");
  Refused({"client", "--connect", "h:1", "--threads", "1,2"}, "takes one number");
}

TEST_CASE("zrpc_bench arguments: --name=VALUE, size suffixes and --help, as the examples take") {
  auto client = Parse({"client", "--connect=h:1", "--workload=put", "--size=64K,1M,1G",
                       "--in-flight=1,8", "--registered"});
  INFO(client.status());
  REQUIRE(client.ok());
  CHECK(client->connect == "h:1");
  CHECK(client->sizes == std::vector<uint64_t>{64 << 10, 1 << 20, 1 << 30});
  CHECK(client->in_flight == std::vector<int>{1, 8});
  CHECK(client->registered);
  auto server = Parse({"server", "--max-bulk", "16M", "--arena=64K"});
  REQUIRE(server.ok());
  CHECK(server->max_bulk == (16u << 20));
  CHECK(server->arena == (64u << 10));
  for (const std::vector<std::string>& help :
       {std::vector<std::string>{"--help"}, {"client", "-h"}, {"server", "--help", "--bogus"}}) {
    auto parsed = Parse(help);
    REQUIRE(parsed.ok());  // --help before any mistake is read wins: the usage, exit 0
    CHECK(parsed->help);
  }
}

TEST_CASE("an echo payload's largest size leaves room for every header") {
  CHECK(zrpc::bench::MaxEchoPayload(4096) == 4050);
  CHECK(zrpc::bench::MaxEchoPayload(8192) == 8146);
  CHECK(zrpc::bench::MaxEchoPayload(10) == 0);
}

}  // namespace
