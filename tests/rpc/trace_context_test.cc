// TraceContext::Parse against W3C Trace Context level 1's rules for traceparent, at and one past
// each: lengths, separators, lowercase hex only, versions 00, later and ff, all-zero ids; and
// traceparent() writing back what was read.
#include "rpc/trace_context.h"

#include <catch2/catch.hpp>
#include <optional>
#include <string>

namespace {

constexpr const char* kValid = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

}  // namespace

TEST_CASE("a valid traceparent parses into its ids and flags, and writes back", "[trace]") {
  const std::optional<zrpc::TraceContext> trace = zrpc::TraceContext::Parse(kValid);
  REQUIRE(trace.has_value());
  CHECK(trace->trace_id_hex() == "4bf92f3577b34da6a3ce929d0e0e4736");
  CHECK(trace->parent_id_hex() == "00f067aa0ba902b7");
  CHECK(trace->span_id_hex() == "0000000000000000");  // the receiver chooses its own
  CHECK(trace->flags == 1);
  CHECK(trace->sampled());
  zrpc::TraceContext next = *trace;
  next.span_id = {1, 2, 3, 4, 5, 6, 7, 0xff};
  CHECK(next.traceparent() == "00-4bf92f3577b34da6a3ce929d0e0e4736-01020304050607ff-01");
  // Flags version 00 does not define are read, kept, and not sent on.
  next.flags = 0xa1;
  CHECK(next.traceparent() == "00-4bf92f3577b34da6a3ce929d0e0e4736-01020304050607ff-01");
  next.flags = 0xa0;
  CHECK(next.traceparent() == "00-4bf92f3577b34da6a3ce929d0e0e4736-01020304050607ff-00");
  CHECK_FALSE(zrpc::TraceContext::Parse(next.traceparent())->sampled());
  CHECK(
      zrpc::TraceContext::Parse("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-a1")->flags ==
      0xa1);
}

TEST_CASE("a malformed traceparent is refused", "[trace]") {
  const std::string valid = kValid;
  auto refused = [](const std::string& value) {
    INFO(value);
    CHECK_FALSE(zrpc::TraceContext::Parse(value).has_value());
  };
  refused("");
  refused(valid.substr(0, 54));                                        // one short
  refused(valid + "0");                                                // version 00: one long
  refused(valid + "-extra");                                           // version 00: exactly 55
  refused("ff" + valid.substr(2));                                     // version ff
  refused("0g" + valid.substr(2));                                     // not hex
  refused("00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01");  // uppercase
  refused("00-00000000000000000000000000000000-00f067aa0ba902b7-01");  // zero trace id
  refused("00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01");  // zero parent id
  refused("00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01");  // a separator
  refused("00-4bf92f3577b34da6a3ce929d0e0e4736_00f067aa0ba902b7-01");
  refused("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7_01");
  refused("00-4bf92f3577b34da6a3ce929d0e0e473-600f067aa0ba902b7-01");  // fields shifted
  refused("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0x");  // flags not hex
}

TEST_CASE("a later version parses its level-1 fields and ignores what follows a dash", "[trace]") {
  const std::string rest = std::string(kValid).substr(2);
  CHECK(zrpc::TraceContext::Parse("01" + rest).has_value());
  CHECK(zrpc::TraceContext::Parse("cc" + rest + "-what-comes-later").has_value());
  CHECK_FALSE(zrpc::TraceContext::Parse("cc" + rest + "x").has_value());  // not after a dash
}
