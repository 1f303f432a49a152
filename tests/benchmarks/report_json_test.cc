// ToJsonLine and ParseJsonLines (benchmarks/report.h): round trips, escaping, files written
// before the JSON went through protobuf, and the malformed inputs the parser must refuse with the
// line number.
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
  r.size = 9007199254740991ULL;  // 2^53 - 1, the largest integer JSON holds exactly, survives
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
      if (c == '\\')
        ++end;
      else if (c == '"')
        in_string = false;
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

TEST_CASE("the writer puts every key, in order, with numbers as numbers", "[report][json]") {
  const std::string line = ToJsonLine(Sample());
  CHECK(absl::StartsWith(line,
                         "{\"system\":\"zrpc\",\"workload\":\"echo\","
                         "\"size\":9007199254740991,\"in_flight\":16,\"threads\":2,"
                         "\"connections\":3,\"round\":4,\"calls\":123456789,"));
  CHECK(absl::StrContains(line, "\"server_cpu_us_per_call\":-1,\"cdf_us\":[1,2.5,"));
  CHECK(absl::StrContains(line, R"("note":"rxe0 \"quoted\" back\\slash\ttab\nnewline \u0001 caf)"));
  WorkloadResult zero;  // zeros and empty strings are written, not left out
  const std::string empty = ToJsonLine(zero);
  CHECK(absl::StrContains(empty, "\"system\":\"\",\"workload\":\"\",\"size\":0,"));
  CHECK(absl::StrContains(empty, "\"round\":0,\"calls\":0,\"seconds\":0,"));
  CHECK(absl::StrContains(empty, "\"server_cpu_us_per_call\":-1,\"note\":\"\"}"));  // no CDF
  CHECK(ParseJsonLines(empty).ok());
}

TEST_CASE("bytes that are not UTF-8 become U+FFFD, one each", "[report][json]") {
  WorkloadResult bad = Sample();
  bad.note =
      "a\xff"
      "b\xc3";
  bad.system = "\xed\xa0\x80";  // an encoded surrogate is not UTF-8 either
  absl::StatusOr<std::vector<WorkloadResult>> parsed = ParseJsonLines(ToJsonLine(bad));
  REQUIRE(parsed.ok());
  CHECK((*parsed)[0].note ==
        "a\xef\xbf\xbd"
        "b\xef\xbf\xbd");
  CHECK((*parsed)[0].system == "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd");
}

TEST_CASE("NaN and infinities are written as null and read back as NaN", "[report][json]") {
  WorkloadResult r = Sample();
  r.p50_us = std::nan("");
  r.max_us = std::numeric_limits<double>::infinity();
  r.cdf_us = {-std::numeric_limits<double>::infinity(), 2};
  const std::string line = ToJsonLine(r);
  CHECK(line.find("\"p50_us\":null") != std::string::npos);
  CHECK(line.find("\"max_us\":null") != std::string::npos);
  CHECK(line.find("\"cdf_us\":[null,2]") != std::string::npos);
  absl::StatusOr<std::vector<WorkloadResult>> parsed = ParseJsonLines(line);
  REQUIRE(parsed.ok());
  CHECK(std::isnan((*parsed)[0].p50_us));
  CHECK(std::isnan((*parsed)[0].max_us));
  CHECK(std::isnan((*parsed)[0].cdf_us.at(0)));
  CHECK((*parsed)[0].cdf_us.at(1) == 2);
}

TEST_CASE("files from the hand-written writer and from compare.sh still read", "[report][json]") {
  // As the writer before protobuf wrote them (shortest doubles), and as compare.sh's awk writes
  // perftest's rows (nulls, an empty CDF).
  const std::string old_line =
      R"({"system":"zrpc","workload":"echo","size":64,"in_flight":1,"threads":1,)"
      R"("connections":1,"round":2,"calls":5000,"seconds":0.3333333333333333,"p50_us":12.25,)"
      R"("p90_us":13,"p99_us":20.5,"p999_us":30,"max_us":41,"calls_per_sec":15000,)"
      R"("goodput_mib_per_sec":0.9,"client_cpu_us_per_call":2.5,"server_cpu_us_per_call":-1,)"
      R"("cdf_us":[1,2.5,3.0000000000000004],"note":"rxe0 \u00e9"})";
  const std::string perftest_line =
      R"({"system":"perftest","workload":"send_bw","size":64,"in_flight":32,"threads":1,)"
      R"("connections":1,"round":0,"calls":100000,"seconds":0,"p50_us":null,"p90_us":null,)"
      R"("p99_us":null,"p999_us":null,"max_us":null,"calls_per_sec":250000,)"
      R"("goodput_mib_per_sec":15.26,"client_cpu_us_per_call":-1,"server_cpu_us_per_call":-1,)"
      R"("cdf_us":[],"note":""})";
  absl::StatusOr<std::vector<WorkloadResult>> parsed =
      ParseJsonLines(old_line + "\n" + perftest_line + "\n");
  REQUIRE(parsed.ok());
  REQUIRE(parsed->size() == 2);
  const WorkloadResult& a = (*parsed)[0];
  CHECK(a.seconds == 1.0 / 3);
  CHECK(a.cdf_us == std::vector<double>{1, 2.5, 3.0000000000000004});
  CHECK(a.note == "rxe0 \xc3\xa9");
  CHECK(a.round == 2);
  const WorkloadResult& b = (*parsed)[1];
  CHECK(b.system == "perftest");
  CHECK(b.calls == 100000);
  CHECK(std::isnan(b.p50_us));
  CHECK(b.calls_per_sec == 250000);
  CHECK(b.cdf_us.empty());
}

TEST_CASE("the reader takes escapes, surrogate pairs, blank lines, whitespace and unknown keys",
          "[report][json]") {
  const std::string text = absl::StrCat(
      "\n  \r\n", LineWith("note", R"("\u00e9\ud83d\ude00\/\b\f\r")"), " \t",
      LineWith("system", R"("zrpc", "future": {"a": [1, -2.5e-3, true, false, null, {}]})"),
      LineWith("cdf_us", ""), "\n");
  absl::StatusOr<std::vector<WorkloadResult>> parsed = ParseJsonLines(text);
  REQUIRE(parsed.ok());
  REQUIRE(parsed->size() == 3);
  CHECK((*parsed)[0].note == "\xc3\xa9\xf0\x9f\x98\x80/\b\f\r");
  CHECK((*parsed)[1].system == "zrpc");
  CHECK((*parsed)[2].cdf_us.empty());                // optional
  CHECK(ParseJsonLines(LineWith("note", "")).ok());  // optional
  CHECK(ParseJsonLines("").value().empty());
}

TEST_CASE("syntax errors name the line and where", "[report][json]") {
  const std::string good = ToJsonLine(Sample());
  const std::string line = good.substr(0, good.size() - 1);
  CHECK(absl::StartsWith(ErrorOf(good + "\n" + line.substr(0, 40)), "line 3: "));  // truncated
  CHECK(absl::StartsWith(ErrorOf(good + line + " x"), "line 2: "));
  CHECK(ErrorOf(line + " x") == "line 1: Parsing terminated before end of input. (at: x)");
  CHECK(absl::StrContains(ErrorOf(line + "}"), "Parsing terminated before end of input"));
  CHECK(absl::StrContains(ErrorOf("[1,2]"), "Root element must be a message"));
  CHECK(ErrorOf("{\"a\" 1}") == "line 1: Expected : between key:value pair. (at: 1})");
  CHECK(absl::StrContains(ErrorOf("{\"a\":[1 2]}"), "line 1: "));
  CHECK(absl::StrContains(ErrorOf("{\"a\":01}"), "Octal/hex numbers are not valid JSON values"));
  CHECK(absl::StrContains(ErrorOf("{\"a\":1.}"), "line 1: "));
  CHECK(absl::StrContains(ErrorOf("{\"a\":-}"), "line 1: "));
  CHECK(absl::StrContains(ErrorOf("{\"a\":NaN}"), "Unexpected token. (at: NaN})"));
  CHECK(absl::StrContains(ErrorOf("{\"a\":+1}"), "line 1: "));
  CHECK(absl::StrContains(ErrorOf("{\"a\":\"\\x\"}"), "line 1: "));
  CHECK(absl::StrContains(ErrorOf("{\"a\":\"\\u12G4\"}"), "line 1: "));
  CHECK(absl::StrContains(ErrorOf("{\"a\":\"\\ud800x\"}"), "Missing low surrogate"));
  CHECK(absl::StrContains(ErrorOf("{\"a\":\"\xc3(\"}"), "non UTF-8"));
  CHECK(absl::StrContains(ErrorOf("{\"a\":\"\xed\xa0\x80\"}"), "non UTF-8"));  // a surrogate
  CHECK(absl::StrContains(ErrorOf("{\"a\":tru}"), "line 1: "));
  CHECK(absl::StrContains(ErrorOf("{\"a\":" + std::string(100, '[')), "line 1: "));
  CHECK(absl::StrContains(ErrorOf("{\"a\":\"unterminated"), "(at the end of the line)"));
}

TEST_CASE("schema errors name the line and the key", "[report][json]") {
  const std::string good = ToJsonLine(Sample());
  CHECK(ErrorOf(good + LineWith("size", "\"64\"")) ==
        "line 2: key \"size\": expected a non-negative integer, got a string");
  CHECK(ErrorOf(LineWith("size", "-1")) ==
        "line 1: key \"size\": expected a non-negative integer, got -1");
  CHECK(ErrorOf(LineWith("size", "1.5")) ==
        "line 1: key \"size\": expected a non-negative integer, got 1.5");
  // 2^53 - 1 is the largest; 2^53 and 2^53 + 1 (which a double cannot tell from 2^53) are not.
  CHECK(ParseJsonLines(LineWith("calls", "9007199254740991")).ok());
  CHECK(ErrorOf(LineWith("calls", "9007199254740992")) ==
        "line 1: key \"calls\": integer 9007199254740992 is out of range (at most 2^53 - 1)");
  CHECK(absl::StrContains(ErrorOf(LineWith("calls", "9007199254740993")), "out of range"));
  CHECK(absl::StrContains(ErrorOf(LineWith("size", "18446744073709551616")), "out of range"));
  CHECK(absl::StrContains(ErrorOf(LineWith("threads", "2147483648")),
                          "(threads): invalid value 2147483648"));
  CHECK(absl::StrContains(ErrorOf(LineWith("threads", "1.5")), "(threads): invalid value 1.5"));
  CHECK(ParseJsonLines(LineWith("round", "-3")).ok());  // signed fields take negatives
  CHECK(ErrorOf(LineWith("p50_us", "true")) ==
        "line 1: key \"p50_us\": expected a number or null, got a boolean");
  CHECK(ErrorOf(LineWith("p50_us", "{}")) ==
        "line 1: key \"p50_us\": expected a number or null, got an object");
  CHECK(absl::StrContains(ErrorOf(LineWith("p50_us", "1e999")), "exceeds the range of double"));
  CHECK(ErrorOf(LineWith("system", "null")) == "line 1: missing required key \"system\"");
  CHECK(absl::StartsWith(ErrorOf(LineWith("cdf_us", "{}")), "line 1: "));
  CHECK(ErrorOf(LineWith("cdf_us", "[1,\"2\"]")) ==
        "line 1: key \"cdf_us\": expected a number or null, got a string");
  CHECK(ErrorOf(good + good + LineWith("calls", "")) == "line 3: missing required key \"calls\"");
  CHECK(ErrorOf(LineWith("p999_us", "")) == "line 1: missing required key \"p999_us\"");
  CHECK(ErrorOf(LineWith("in_flight", "")) == "line 1: missing required key \"in_flight\"");
  CHECK(absl::StrContains(ErrorOf(LineWith("system", "\"a\",\"system\":\"b\"")), "system"));
}

}  // namespace
}  // namespace zrpc::bench
