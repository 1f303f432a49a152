// bench_report: merges the JSON Lines results of the benchmark programs and prints, for people,
// the medians across rounds and the zrpc ratios against their targets (benchmarks/report.h),
// when the files hold baseline rows (perftest or grpc) to compare with.
//
//   bench_report [--json OUT.json] [--svg OUT.svg] [--svg-workload echo] [--svg-size 64]
//                FILE.jsonl...
//
// Exit status: 0 when the report was made (a MISSED target is a figure, not a failure), 1 when
// an input could not be read or parsed or an output not written, 2 on a usage error.
#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "benchmarks/report.h"
#include "examples/cli.h"

namespace zrpc::bench {
namespace {

constexpr char kUsage[] =
    "usage: bench_report [--json OUT.json] [--svg OUT.svg] [--svg-workload WORKLOAD]\n"
    "                    [--svg-size BYTES] FILE.jsonl...\n"
    "Prints the medians across rounds of every configuration in the files and the zrpc ratios\n"
    "against their targets; --json writes them as JSON, --svg plots the latency CDFs of\n"
    "--svg-workload (default echo) at --svg-size (default 64; K, M and G suffixes).\n"
    "Options take --name VALUE or --name=VALUE; \"--\" ends them.\n";

struct Args {
  std::string json_out;
  std::string svg_out;
  std::string svg_workload = "echo";
  uint64_t svg_size = 64;
  bool svg_options_given = false;
  std::vector<std::string> inputs;
};

// Parses argv (examples/cli.h's Tokenize, as the benchmark programs); on a usage error returns
// false with the message in *error. *help: --help or -h was given.
bool ParseArgs(int argc, char** argv, Args& args, bool* help, std::string* error) {
  absl::StatusOr<std::vector<examples::cli::Word>> words = examples::cli::Tokenize(
      std::vector<std::string>(argv + 1, argv + argc),
      examples::cli::Options{{"json", "svg", "svg-workload", "svg-size"}, {}, true}, help);
  if (*help) return true;
  if (!words.ok()) {
    *error = std::string(words.status().message());
    return false;
  }
  for (const examples::cli::Word& word : *words) {
    if (word.name.empty()) {
      args.inputs.push_back(word.value);
      continue;
    }
    const std::string arg = "--" + word.name;
    const std::string& value = word.value;
    if (value.empty()) {
      *error = absl::StrCat(arg, " needs a non-empty value");
      return false;
    }
    if (arg == "--json") {
      args.json_out = value;
    } else if (arg == "--svg") {
      args.svg_out = value;
    } else if (arg == "--svg-workload") {
      args.svg_workload = value;
      args.svg_options_given = true;
    } else if (std::optional<uint64_t> size =
                   examples::cli::ParseBytes(value, 0, uint64_t{1} << 40);
               !size.has_value()) {
      *error = absl::StrCat("--svg-size wants a size in bytes, got \"", value, "\"");
      return false;
    } else {
      args.svg_size = *size;
      args.svg_options_given = true;
    }
  }
  if (args.inputs.empty()) {
    *error = "no input files";
    return false;
  }
  if (args.svg_options_given && args.svg_out.empty()) {
    *error = "--svg-workload and --svg-size need --svg OUT.svg";
    return false;
  }
  return true;
}

bool ReadFile(const std::string& path, std::string& text) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  std::ostringstream buffer;
  buffer << in.rdbuf();
  text = buffer.str();
  return !in.bad();
}

bool WriteFile(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  out.close();
  return static_cast<bool>(out);
}

int Main(int argc, char** argv) {
  Args args;
  std::string error;
  bool help = false;
  if (!ParseArgs(argc, argv, args, &help, &error)) {
    std::cerr << "bench_report: " << error << "\n" << kUsage;
    return 2;
  }
  if (help) {
    std::cout << kUsage;
    return 0;
  }
  std::vector<WorkloadResult> results;
  for (const std::string& path : args.inputs) {
    std::string text;
    if (!ReadFile(path, text)) {
      std::cerr << "bench_report: " << path << ": cannot read: " << std::strerror(errno) << "\n";
      return 1;
    }
    absl::StatusOr<std::vector<WorkloadResult>> parsed = ParseJsonLines(text);
    if (!parsed.ok()) {
      std::cerr << "bench_report: " << path << ": " << parsed.status().message() << "\n";
      return 1;
    }
    results.insert(results.end(), parsed->begin(), parsed->end());
  }
  absl::StatusOr<std::vector<Aggregate>> aggregates = AggregateRounds(results);
  if (!aggregates.ok()) {
    std::cerr << "bench_report: " << aggregates.status().message() << "\n";
    return 1;
  }
  // Ratios need a baseline: rows of zrpc alone (a sweep) get the table only.
  const bool baseline = std::any_of(aggregates->begin(), aggregates->end(), [](const Aggregate& a) {
    return a.median.system == "perftest" || a.median.system == "grpc";
  });
  std::vector<Ratio> ratios;
  std::cout << FormatTable(*aggregates);
  if (baseline) {
    ratios = ComputeRatios(*aggregates);
    std::cout << "\n== ratios (targets)\n" << FormatRatios(ratios);
  } else {
    std::cout << "(no perftest or grpc rows: no ratios)\n";
  }
  const std::vector<Ratio> layers = ComputeLayerRatios(*aggregates);
  if (!layers.empty()) {
    std::cout << "\n== where zrpc's cost over perftest arises (layers, same run; no targets)\n"
              << FormatRatios(layers);
    ratios.insert(ratios.end(), layers.begin(), layers.end());
  }

  if (!args.json_out.empty() && !WriteFile(args.json_out, ToJsonDocument(*aggregates, ratios))) {
    std::cerr << "bench_report: " << args.json_out << ": cannot write\n";
    return 1;
  }
  if (!args.svg_out.empty()) {
    absl::StatusOr<std::string> svg = RenderCdfSvg(*aggregates, args.svg_workload, args.svg_size);
    if (!svg.ok()) {
      std::cerr << "bench_report: --svg: " << svg.status().message() << "\n";
      return 1;
    }
    if (!WriteFile(args.svg_out, *svg)) {
      std::cerr << "bench_report: " << args.svg_out << ": cannot write\n";
      return 1;
    }
  }
  return 0;
}

}  // namespace
}  // namespace zrpc::bench

int main(int argc, char** argv) { return zrpc::bench::Main(argc, argv); }
