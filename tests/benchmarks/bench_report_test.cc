// bench_report end to end: usage errors (exit 2), unreadable or malformed input (exit 1), and a
// report from the fixture files in testdata/ (exit 0) with its table, ratios, JSON and SVG.
#include <catch2/catch.hpp>
#include <string>

#include "absl/strings/match.h"
#include "benchmarks/report.h"
#include "tests/codegen/tool_run.h"

namespace zrpc::testing {
namespace {

std::string Binary() { return Runfile("benchmarks/bench_report"); }
std::string Data(const std::string& name) { return Runfile("tests/benchmarks/testdata/" + name); }

TEST_CASE("bench_report refuses bad arguments with a message and exit status 2", "[bench_report]") {
  const std::string zrpc = Data("zrpc.jsonl");
  const struct {
    std::string args;
    std::string message;
  } cases[] = {
      {"", "no input files"},
      {"--frobnicate " + zrpc, "unknown option --frobnicate"},
      {zrpc + " --json", "--json needs a value"},
      {"--json= " + zrpc, "--json needs a non-empty value"},
      {"--svg out.svg --svg-size 12x " + zrpc, "--svg-size wants a size in bytes, got \"12x\""},
      {"--svg-workload get " + zrpc, "--svg-workload and --svg-size need --svg OUT.svg"},
  };
  for (const auto& c : cases) {
    INFO("bench_report " << c.args);
    std::string output;
    CHECK(Run(Binary() + " " + c.args, &output) == 2);
    CHECK(absl::StrContains(output, "bench_report: " + c.message + "\n"));
    CHECK(absl::StrContains(output, "usage: bench_report"));
  }
}

TEST_CASE(
    "bench_report --help prints the usage and exits 0; options take --name=VALUE and sizes "
    "a suffix",
    "[bench_report]") {
  std::string output;
  CHECK(Run(Binary() + " --help", &output) == 0);
  CHECK(absl::StartsWith(output, "usage: bench_report"));
  output.clear();
  const std::string svg = TmpDir() + "/suffix.svg";
  CHECK(Run(Binary() + " --svg=" + svg + " --svg-workload=echo --svg-size=64 -- " +
                Data("zrpc.jsonl"),
            &output) == 0);
  CHECK(absl::StrContains(ReadFile(svg), "<svg"));
  // 1K is read as 1024 bytes: a size with nothing to plot (exit 1), not a usage error (exit 2).
  output.clear();
  CHECK(Run(Binary() + " --svg=" + svg + " --svg-size=1K " + Data("zrpc.jsonl"), &output) == 1);
  CHECK(absl::StrContains(output, "no results for workload echo at size 1024"));
}

TEST_CASE("bench_report exits 1 with the parser's message on unreadable or malformed input",
          "[bench_report]") {
  std::string output;
  CHECK(Run(Binary() + " " + Data("zrpc.jsonl") + " /nonexistent/results.jsonl", &output) == 1);
  CHECK(absl::StrContains(output, "/nonexistent/results.jsonl: cannot read"));
  output.clear();
  CHECK(Run(Binary() + " " + Data("malformed.jsonl"), &output) == 1);
  CHECK(absl::StrContains(
      output,
      "malformed.jsonl: line 2: key \"calls\": expected a non-negative integer, got a "
      "string\n"));
  output.clear();
  CHECK(Run(Binary() + " " + Data("zrpc.jsonl") + " " + Data("zrpc.jsonl"), &output) == 1);
  CHECK(absl::StrContains(output, "(a file given twice?)"));
}

TEST_CASE("bench_report merges the files into a table, ratios, JSON and an SVG", "[bench_report]") {
  const std::string json = TmpDir() + "/report.json";
  const std::string svg = TmpDir() + "/report.svg";
  std::string output;
  REQUIRE(Run(Binary() + " --json " + json + " --svg=" + svg + " --svg-workload echo " +
                  "--svg-size 64 " + Data("zrpc.jsonl") + " " + Data("perftest.jsonl"),
              &output) == 0);
  INFO(output);
  CHECK(absl::StrContains(output, "system    workload      size in_flight"));
  CHECK(absl::StrContains(output, "21.00"));      // zrpc echo p50: median of 21, 20, 23
  CHECK(absl::StrContains(output, "3.50/2.50"));  // CPU client/server
  CHECK(absl::StrContains(output, "== ratios (targets)"));
  // Each ratio is the median of the ratios within each round, with their spread: the medians'
  // ratio (21 / 20 = 1.050 here) would mix rounds the guest ran at different speeds.
  CHECK(absl::StrContains(
      output,
      "[64 B, in_flight 1, 1x1]                 1.045 (1.000-1.167, 3 rd)    target <= "
      "1.15  met"));
  CHECK(absl::StrContains(output, "0.966 (0.960-0.973, 3 rd)    target >= 0.95  met"));
  CHECK(absl::StrContains(output, "zrpc staged put MiB/s / perftest write_bw MiB/s"));
  CHECK(absl::StrContains(output, "0.837 (0.833-0.840, 3 rd)    target >= 0.90  MISSED"));
  CHECK(absl::StrContains(output, "n/a (no grpc rows for echo 64 B, in_flight 1, 1x1)"));

  const std::string document = ReadFile(json);
  CHECK(absl::StartsWith(document, "{\"results\":[\n{\"system\":\"zrpc\""));
  CHECK(absl::StrContains(document, "\"rounds\":3}"));
  CHECK(absl::StrContains(document,
                          "\"value\":null,\"rounds\":0,\"min\":null,\"max\":null,\"met\":null"));
  CHECK(absl::StrContains(document, "\"value\":1.045"));
  CHECK(absl::StrContains(document, "\"rounds\":3,\"min\":1,\"max\":1.16"));
  const std::string picture = ReadFile(svg);
  CHECK(absl::StrContains(picture, "<svg xmlns=\"http://www.w3.org/2000/svg\""));
  CHECK(absl::StrContains(picture, "perftest send_lat x2 (round trip)"));
  CHECK(absl::EndsWith(picture, "</svg>\n"));
}

TEST_CASE("bench_report prints zrpc rows alone (a sweep) as a table without ratios",
          "[bench_report]") {
  const std::string json = TmpDir() + "/sweep.json";
  std::string output;
  REQUIRE(Run(Binary() + " --json " + json + " " + Data("zrpc.jsonl"), &output) == 0);
  INFO(output);
  CHECK(absl::StrContains(output, "21.00"));
  CHECK(absl::StrContains(output, "(no perftest or grpc rows: no ratios)"));
  CHECK_FALSE(absl::StrContains(output, "== ratios"));
  CHECK_FALSE(absl::StrContains(output, "n/a"));
  CHECK(absl::StrContains(ReadFile(json), "\"ratios\":[]"));
}

}  // namespace
}  // namespace zrpc::testing
