// ToJsonLine and ParseJsonLines (benchmarks/report.h): round trips, escaping, and the
// malformed inputs the parser must refuse with the line number.
#include <catch2/catch.hpp>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "benchmarks/report.h"

namespace zrpc::bench {
namespace {

WorkloadResult Sample() {
  WorkloadResult r;
  r.system = "zrpc";
  r.workload = "echo";
  r.size = 18446744073709551615ULL;  // uint64 max survives
  r.in_flight = 16;
  r.threads = 2;
  r.connections = 3;
  r.round = 4;
  r.calls = 123456789;
  r.seconds = 1.0 / 3;  // needs 17 digits to round-trip
  r.p50_us = 12.25;
  r.p90_us = 0.1;
  r.p99_us = 1e-300;
  r.p999_us = 6.02e23;
  r.max_us = 100;
  r.calls_per_sec = 98765.4321;
  r.goodput_mib_per_sec = 0;
  r.client_cpu_us_per_call = 2.5;
  r.server_cpu_us_per_call = -1;
  r.cdf_us = {1, 2.5, 3.0000000000000004};
  r.note = "rxe0 \"quoted\" back\\slash\ttab\nnewline \x01 caf\xc3\xa9 \xe2\x82\xac";
  return r;
}

void CheckSame(const WorkloadResult& a, const WorkloadResult& b) {
  CHECK(a.system == b.system);
  CHECK(a.workload == b.workload);
  CHECK(a.size == b.size);
  CHECK(a.in_flight == b.in_flight);
  CHECK(a.threads == b.threads);
  CHECK(a.connections == b.connections);
  CHECK(a.round == b.round);
  CHECK(a.calls == b.calls);
  CHECK(a.seconds == b.seconds);
  CHECK(a.p50_us == b.p50_us);
  CHECK(a.p90_us == b.p90_us);
  CHECK(a.p99_us == b.p99_us);
  CHECK(a.p999_us == b.p999_us);
  CHECK(a.max_us == b.max_us);
  CHECK(a.calls_per_sec == b.calls_per_sec);
  CHECK(a.goodput_mib_per_sec == b.goodput_mib_per_sec);
  CHECK(a.client_cpu_us_per_call == b.client_cpu_us_per_call);
  CHECK(a.server_cpu_us_per_call == b.server_cpu_us_per_call);
  CHECK(a.cdf_us == b.cdf_us);
  CHECK(a.note == b.note);
}

// A valid line with `key`'s value replaced by `value` ("" removes the key).
std::string LineWith(const std::string& key, const std::string& value) {
  std::string line = ToJsonLine(Sample());
  const std::string needle = absl::StrCat("\"", key, "\":");
  const size_t start = line.find(needle);
  REQUIRE(start != std::string::npos);
  size_t end = start + needle.size();
  int depth = 0;
  bool in_string = false;
  for (; end < line.size(); ++end) {  // the end of the value
    const char c = line[end];
    if (in_string) {
      if (c == '\\') ++end;
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      ++depth;
    } else if (c == ']' || (c == '}' && depth > 0)) {
      --depth;
    } else if ((c == ',' || c == '}') && depth == 0) {
      break;
    }
  }
  if (value.empty()) {
    const bool last = line[end] == '}';
    return line.substr(0, last ? start - 1 : start) + line.substr(last ? end : end + 1);
  }
  return line.substr(0, start + needle.size()) + value + line.substr(end);
}

std::string ErrorOf(const std::string& text) {
  absl::StatusOr<std::vector<WorkloadResult>> parsed = ParseJsonLines(text);
  REQUIRE_FALSE(parsed.ok());
  CHECK(parsed.status().code() == absl::StatusCode::kInvalidArgument);
  return std::string(parsed.status().message());
}

TEST_CASE("a result survives a round trip exactly", "[report][json]") {
  const std::string line = ToJsonLine(Sample());
  CHECK(line.back() == '\n');
  CHECK(line.find('\n') == line.size() - 1);  // one line: the note's newline is escaped
  absl::StatusOr<std::vector<WorkloadResult>> parsed = ParseJsonLines(line + line);
  REQUIRE(parsed.ok());
  REQUIRE(parsed->size() == 2);
  CheckSame((*parsed)[0], Sample());
  CheckSame((*parsed)[1], Sample());
}

TEST_CASE("the writer escapes strings per RFC 8259", "[report][json]") {
  const std::string line = ToJsonLine(Sample());
  CHECK(line.find(R"("note":"rxe0 \"quoted\" back\\slash\ttab\nnewline \u0001 caf)") !=
        std::string::npos);
  CHECK(line.find("\"system\":\"zrpc\",\"workload\":\"echo\",\"size\":18446744073709551615,") ==
        1);
  CHECK(line.find("\"seconds\":0.3333333333333333,") != std::string::npos);
  WorkloadResult bad = Sample();
  bad.note = "a\xff" "b\xc3";  // not UTF-8: each bad byte becomes U+FFFD
  absl::StatusOr<std::vector<WorkloadResult>> parsed = ParseJsonLines(ToJsonLine(bad));
  REQUIRE(parsed.ok());
  CHECK((*parsed)[0].note == "a\xef\xbf\xbd" "b\xef\xbf\xbd");
}

TEST_CASE("NaN and infinities are written as null and read back as NaN", "[report][json]") {
  WorkloadResult r = Sample();
  r.p50_us = std::nan("");
  r.max_us = std::numeric_limits<double>::infinity();
  r.cdf_us = {-std::numeric_limits<double>::infinity()};
  const std::string line = ToJsonLine(r);
  CHECK(line.find("\"p50_us\":null") != std::string::npos);
  CHECK(line.find("\"max_us\":null") != std::string::npos);
  CHECK(line.find("\"cdf_us\":[null]") != std::string::npos);
  absl::StatusOr<std::vector<WorkloadResult>> parsed = ParseJsonLines(line);
  REQUIRE(parsed.ok());
  CHECK(std::isnan((*parsed)[0].p50_us));
  CHECK(std::isnan((*parsed)[0].max_us));
  CHECK(std::isnan((*parsed)[0].cdf_us.at(0)));
}

TEST_CASE("the reader takes escapes, surrogate pairs, blank lines, whitespace and unknown keys",
          "[report][json]") {
  const std::string text = absl::StrCat(
      "\n  \r\n", LineWith("note", R"("\u00e9\ud83d\ude00\/\b\f\r")"),
      " \t", LineWith("system", R"("zrpc", "future": {"a": [1, -2.5e-3, true, false, null, {}]})"),
      LineWith("cdf_us", ""), "\n");
  absl::StatusOr<std::vector<WorkloadResult>> parsed = ParseJsonLines(text);
  REQUIRE(parsed.ok());
  REQUIRE(parsed->size() == 3);
  CHECK((*parsed)[0].note == "\xc3\xa9\xf0\x9f\x98\x80/\b\f\r");
  CHECK((*parsed)[1].system == "zrpc");
  CHECK((*parsed)[2].cdf_us.empty());  // optional
  CHECK(ParseJsonLines(LineWith("note", "")).ok());  // optional
  CHECK(ParseJsonLines("").value().empty());
}

TEST_CASE("syntax errors name the line and column", "[report][json]") {
  const std::string good = ToJsonLine(Sample());
  const std::string line = good.substr(0, good.size() - 1);
  CHECK(absl::StartsWith(ErrorOf(good + "\n" + line.substr(0, 40)),
                         "line 3, column 41: unexpected end of line: "));  // truncated
  CHECK(absl::StartsWith(ErrorOf(good + line + " x"), "line 2, column"));
  CHECK(absl::StrContains(ErrorOf(line + " x"), "unexpected text after the JSON object"));
  CHECK(absl::StrContains(ErrorOf(line + "}"), "unexpected text after the JSON object"));
  CHECK(absl::StrContains(ErrorOf("[1,2]"), "expected '{'"));
  CHECK(ErrorOf("{\"a\":1,}") == "line 1, column 8: expected '\"' to start an object key");
  CHECK(ErrorOf("{\"a\" 1}") == "line 1, column 6: expected ':' after an object key");
  CHECK(ErrorOf("{\"a\":[1 2]}") == "line 1, column 9: expected ',' or ']' in an array");
  CHECK(ErrorOf("{\"a\":01}") == "line 1, column 7: leading zero in a number");
  CHECK(ErrorOf("{\"a\":1.}") == "line 1, column 8: expected a digit after '.' in a number");
  CHECK(ErrorOf("{\"a\":-}") == "line 1, column 7: expected a digit in a number");
  CHECK(ErrorOf("{\"a\":1e}") == "line 1, column 8: expected a digit in a number's exponent");
  CHECK(absl::StrContains(ErrorOf("{\"a\":NaN}"), "expected a value"));
  CHECK(absl::StrContains(ErrorOf("{\"a\":+1}"), "expected a value"));
  CHECK(absl::StrContains(ErrorOf("{\"a\":\"x\ty\"}"), "control character"));
  CHECK(absl::StrContains(ErrorOf("{\"a\":\"\\x\"}"), "unknown escape"));
  CHECK(absl::StrContains(ErrorOf("{\"a\":\"\\u12G4\"}"), "four hex digits"));
  CHECK(absl::StrContains(ErrorOf("{\"a\":\"\\ud800x\"}"), "high surrogate"));
  CHECK(absl::StrContains(ErrorOf("{\"a\":\"\\udc00\"}"), "unpaired low surrogate"));
  CHECK(absl::StrContains(ErrorOf("{\"a\":\"\xc3(\"}"), "invalid UTF-8"));
  CHECK(absl::StrContains(ErrorOf("{\"a\":\"\xed\xa0\x80\"}"), "invalid UTF-8"));  // surrogate
  CHECK(absl::StrContains(ErrorOf("{\"a\":tru}"), "expected a value"));
  CHECK(absl::StrContains(ErrorOf(std::string(100, '[')), "expected '{'"));
  CHECK(absl::StrContains(ErrorOf("{\"a\":" + std::string(100, '[')), "nesting deeper than 64"));
}

TEST_CASE("schema errors name the line and the key", "[report][json]") {
  const std::string good = ToJsonLine(Sample());
  CHECK(ErrorOf(good + LineWith("size", "\"64\"")) ==
        "line 2: key \"size\": expected a non-negative integer, got a string");
  CHECK(ErrorOf(LineWith("size", "-1")) ==
        "line 1: key \"size\": expected a non-negative integer, got -1");
  CHECK(ErrorOf(LineWith("size", "1.5")) ==
        "line 1: key \"size\": expected a non-negative integer, got 1.5");
  CHECK(ErrorOf(LineWith("size", "18446744073709551616")) ==
        "line 1: key \"size\": integer 18446744073709551616 is out of range");
  CHECK(ErrorOf(LineWith("threads", "2147483648")) ==
        "line 1: key \"threads\": integer 2147483648 is out of range");
  CHECK(ParseJsonLines(LineWith("round", "-3")).ok());  // signed fields take negatives
  CHECK(ErrorOf(LineWith("p50_us", "true")) ==
        "line 1: key \"p50_us\": expected a number or null, got a boolean");
  CHECK(ErrorOf(LineWith("p50_us", "1e999")) ==
        "line 1: key \"p50_us\": number 1e999 is out of range");
  CHECK(ErrorOf(LineWith("system", "null")) ==
        "line 1: key \"system\": expected a string, got null");
  CHECK(ErrorOf(LineWith("cdf_us", "{}")) ==
        "line 1: key \"cdf_us\": expected an array of numbers, got an object");
  CHECK(ErrorOf(LineWith("cdf_us", "[1,\"2\"]")) ==
        "line 1: key \"cdf_us\": expected a number or null, got a string");
  CHECK(ErrorOf(good + good + LineWith("calls", "")) ==
        "line 3: missing required key \"calls\"");
  CHECK(ErrorOf(LineWith("system", "\"a\",\"system\":\"b\"")) ==
        "line 1: key \"system\" given twice");
}

}  // namespace
}  // namespace zrpc::bench
