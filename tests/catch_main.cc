// The one Catch2 v2 main every zrpc test links (//tests:catch_main), compiled once.
//
// Catch2 v2 knows nothing about Bazel, so this main bridges the two:
//  - each test case's result goes to $XML_OUTPUT_FILE as JUnit XML (passed, failed with the
//    failing expressions, or skipped with the reason), so `bazel test --test_summary=detailed`
//    lists every test case and tools/test can count them;
//  - Bazel's --test_filter (TESTBRIDGE_TEST_ONLY) becomes a Catch test spec;
//  - each test case's duration is printed, and a spec matching no test case is a failure
//    (a test binary that runs nothing must not look green).
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "tests/skip.h"

namespace zrpc::testing {
namespace {

struct CaseResult {
  std::string name;
  double seconds = 0;
  bool failed = false;
  bool skipped = false;
  std::string skip_reason;
  std::string failures;  // one line per failed assertion
};

std::vector<CaseResult>& Results() {
  static std::vector<CaseResult> results;
  return results;
}

CaseResult* current_case = nullptr;

std::string XmlEscape(const std::string& in) {
  std::string out;
  out.reserve(in.size());
  for (char c : in) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&apos;";
        break;
      default:
        // XML 1.0 forbids most control characters; keep tab and newline.
        if (static_cast<unsigned char>(c) < 0x20 && c != '\t' && c != '\n') {
          out += '?';
        } else {
          out += c;
        }
    }
  }
  return out;
}

void WriteJunitXml(const char* path, const std::string& suite) {
  int failures = 0, skipped = 0;
  double total = 0;
  for (const auto& r : Results()) {
    failures += r.failed;
    skipped += r.skipped;
    total += r.seconds;
  }
  std::ofstream xml(path);
  xml << "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<testsuites>\n"
      << "<testsuite name=\"" << XmlEscape(suite) << "\" tests=\"" << Results().size()
      << "\" failures=\"" << failures << "\" skipped=\"" << skipped << "\" errors=\"0\" time=\""
      << total << "\">\n";
  for (const auto& r : Results()) {
    xml << "  <testcase name=\"" << XmlEscape(r.name) << "\" classname=\"" << XmlEscape(suite)
        << "\" time=\"" << r.seconds << "\"";
    if (r.failed) {
      xml << "><failure message=\"failed\">" << XmlEscape(r.failures) << "</failure></testcase>\n";
    } else if (r.skipped) {
      xml << "><skipped message=\"" << XmlEscape(r.skip_reason) << "\"/></testcase>\n";
    } else {
      xml << "/>\n";
    }
  }
  xml << "</testsuite>\n</testsuites>\n";
}

class BazelListener : public Catch::TestEventListenerBase {
 public:
  using TestEventListenerBase::TestEventListenerBase;

  void testCaseStarting(const Catch::TestCaseInfo& info) override {
    Results().emplace_back();
    Results().back().name = info.name;
    current_case = &Results().back();
    start_ = std::chrono::steady_clock::now();
  }

  bool assertionEnded(const Catch::AssertionStats& stats) override {
    const Catch::AssertionResult& result = stats.assertionResult;
    if (current_case == nullptr || result.isOk()) return true;
    current_case->failed = true;
    const Catch::SourceLineInfo& where = result.getSourceInfo();
    current_case->failures += std::string(where.file) + ":" + std::to_string(where.line) + ": ";
    if (result.hasExpression()) current_case->failures += result.getExpandedExpression() + " ";
    current_case->failures += result.getMessage() + "\n";
    return true;
  }

  void testCaseEnded(const Catch::TestCaseStats& stats) override {
    if (current_case == nullptr) return;
    current_case->seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    if (stats.totals.assertions.failed > 0 || stats.totals.testCases.failed > 0) {
      current_case->failed = true;
    }
    current_case = nullptr;
  }

  void testRunEnded(const Catch::TestRunStats& stats) override {
    if (const char* path = std::getenv("XML_OUTPUT_FILE"); path != nullptr && *path != '\0') {
      WriteJunitXml(path, stats.runInfo.name);
    }
  }

 private:
  std::chrono::steady_clock::time_point start_;
};

CATCH_REGISTER_LISTENER(BazelListener)

}  // namespace

void MarkSkipped(const std::string& reason) {
  std::string name = current_case != nullptr ? current_case->name : "?";
  std::fprintf(stderr, "\n*** SKIPPED: %s: %s\n\n", name.c_str(), reason.c_str());
  if (current_case != nullptr) {
    current_case->skipped = true;
    current_case->skip_reason = reason;
  }
}

}  // namespace zrpc::testing

int main(int argc, char** argv) {
  std::vector<const char*> args(argv, argv + argc);
  // Report every test case with its duration, so a log reads as a per-case report.
  args.push_back("--durations");
  args.push_back("yes");
  // A filter that matches nothing must fail rather than pass having run nothing.
  args.push_back("--warn");
  args.push_back("NoTests");
  std::string filter;
  if (const char* f = std::getenv("TESTBRIDGE_TEST_ONLY"); f != nullptr && *f != '\0') {
    filter = f;
    args.push_back(filter.c_str());
  }
  return Catch::Session().run(static_cast<int>(args.size()), args.data());
}
