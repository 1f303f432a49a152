// RenderCdfSvg (benchmarks/report.h): a standalone, well-formed SVG whose curves stay inside it.
#include <catch2/catch.hpp>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "benchmarks/report.h"

namespace zrpc::bench {
namespace {

struct Element {
  std::string name;
  std::string attributes;  // the raw text after the name
};

// A small XML well-formedness check for what RenderCdfSvg writes: an optional <?xml ...?>
// declaration, then exactly one root element; tags balanced and properly nested; attribute
// values double-quoted; text free of '<' and of '&' that does not start an entity. Returns the
// elements in document order; fails the test case on the first problem.
std::vector<Element> CheckWellFormed(const std::string& xml) {
  std::vector<Element> elements;
  std::vector<std::string> open;
  size_t pos = 0;
  if (absl::StartsWith(xml, "<?xml")) {
    pos = xml.find("?>");
    REQUIRE(pos != std::string::npos);
    pos += 2;
  }
  int roots = 0;
  while (pos < xml.size()) {
    const size_t lt = xml.find('<', pos);
    const std::string text =
        xml.substr(pos, lt == std::string::npos ? std::string::npos : lt - pos);
    for (size_t amp = text.find('&'); amp != std::string::npos; amp = text.find('&', amp + 1)) {
      const std::string rest = text.substr(amp);
      CHECK((absl::StartsWith(rest, "&amp;") || absl::StartsWith(rest, "&lt;") ||
             absl::StartsWith(rest, "&gt;") || absl::StartsWith(rest, "&quot;")));
    }
    if (open.empty()) {
      INFO("text outside the root: " << text);
      CHECK(text.find_first_not_of(" \n") == std::string::npos);
    }
    if (lt == std::string::npos) break;
    const size_t gt = xml.find('>', lt);
    REQUIRE(gt != std::string::npos);
    std::string tag = xml.substr(lt + 1, gt - lt - 1);
    pos = gt + 1;
    if (tag[0] == '/') {
      REQUIRE_FALSE(open.empty());
      CHECK(tag.substr(1) == open.back());
      open.pop_back();
      continue;
    }
    const bool self_closing = tag.back() == '/';
    if (self_closing) tag.pop_back();
    const size_t space = tag.find(' ');
    Element e{tag.substr(0, space), space == std::string::npos ? "" : tag.substr(space + 1)};
    CHECK(std::count(e.attributes.begin(), e.attributes.end(), '"') % 2 == 0);
    CHECK(e.attributes.find('\'') == std::string::npos);
    if (open.empty()) ++roots;
    if (!self_closing) open.push_back(e.name);
    elements.push_back(e);
  }
  CHECK(open.empty());
  CHECK(roots == 1);
  REQUIRE_FALSE(elements.empty());
  CHECK(elements[0].name == "svg");
  return elements;
}

std::string Attribute(const Element& e, const std::string& name) {
  const std::string needle = " " + name + "=\"";
  const std::string padded = " " + e.attributes;
  const size_t start = padded.find(needle);
  if (start == std::string::npos) return "";
  const size_t from = start + needle.size();
  return padded.substr(from, padded.find('"', from) - from);
}

WorkloadResult Curve(const std::string& system, const std::string& workload,
                     std::vector<double> cdf) {
  WorkloadResult r;
  r.system = system;
  r.workload = workload;
  r.size = 64;
  r.cdf_us = std::move(cdf);
  return r;
}

// The viewBox is at least 800 x 500, and every left-aligned text ends inside it: its x plus its
// length at a generous 0.62 em per character (what the renderer budgets; sans-serif averages
// about 0.55 em), its baseline above the bottom. An entity counts as one character.
void CheckLegendFits(const std::string& svg, const std::vector<Element>& elements) {
  const std::vector<std::string> box = absl::StrSplit(Attribute(elements[0], "viewBox"), ' ');
  REQUIRE(box.size() == 4);
  double width, height;
  REQUIRE(absl::SimpleAtod(box[2], &width));
  REQUIRE(absl::SimpleAtod(box[3], &height));
  CHECK(width >= 800);
  CHECK(height >= 500);
  CHECK(Attribute(elements[0], "width") == box[2]);
  CHECK(Attribute(elements[0], "height") == box[3]);
  size_t pos = 0;
  while ((pos = svg.find("<text ", pos)) != std::string::npos) {
    const size_t open_end = svg.find('>', pos);
    const size_t close = svg.find("</text>", open_end);
    REQUIRE(close != std::string::npos);
    const Element e{"text", svg.substr(pos + 6, open_end - pos - 6)};
    std::string text = svg.substr(open_end + 1, close - open_end - 1);
    pos = close;
    const std::string anchor = Attribute(e, "text-anchor");
    if (!Attribute(e, "transform").empty() || anchor == "middle" || anchor == "end") {
      continue;  // axis titles and tick labels: centred or right-aligned on the plot
    }
    for (const char* entity : {"&amp;", "&lt;", "&gt;", "&quot;"}) {
      for (size_t at; (at = text.find(entity)) != std::string::npos;) {
        text.replace(at, std::strlen(entity), "_");
      }
    }
    double x, y, font = 12;
    REQUIRE(absl::SimpleAtod(Attribute(e, "x"), &x));
    REQUIRE(absl::SimpleAtod(Attribute(e, "y"), &y));
    if (!Attribute(e, "font-size").empty()) {
      REQUIRE(absl::SimpleAtod(Attribute(e, "font-size"), &font));
    }
    INFO("text \"" << text << "\" at x " << x << ", y " << y);
    CHECK(x + text.size() * 0.62 * font <= width);
    CHECK(y <= height);
  }
}

std::vector<Aggregate> Aggregates(const std::vector<WorkloadResult>& rs) {
  absl::StatusOr<std::vector<Aggregate>> agg = AggregateRounds(rs);
  REQUIRE(agg.ok());
  return *agg;
}

TEST_CASE("the CDF SVG is well-formed, one polyline per system, inside the viewBox",
          "[report][svg]") {
  std::vector<double> zrpc_cdf, grpc_cdf;
  for (int i = 0; i < 200; ++i) zrpc_cdf.push_back(8 + i * 0.05);
  for (int i = 0; i < 200; ++i) grpc_cdf.push_back(150 + i * 10.0);
  WorkloadResult deeper = Curve("zrpc", "echo", {1000, 2000});
  deeper.in_flight = 16;  // not drawn: the smallest in_flight is
  absl::StatusOr<std::string> svg = RenderCdfSvg(
      Aggregates({Curve("zrpc", "echo", zrpc_cdf), deeper, Curve("grpc", "echo", grpc_cdf),
                  Curve("perftest", "send_lat", {2, 3, 4}), Curve("zrpc", "put", {1}),
                  Curve("other<&>\x01", "echo", {})}),
      "echo", 64);
  REQUIRE(svg.ok());
  const std::vector<Element> elements = CheckWellFormed(*svg);
  CHECK(Attribute(elements[0], "xmlns") == "http://www.w3.org/2000/svg");
  CheckLegendFits(*svg, elements);

  int polylines = 0;
  for (const Element& e : elements) {
    if (e.name != "polyline") continue;
    ++polylines;
    const std::vector<std::string> points = absl::StrSplit(Attribute(e, "points"), ' ');
    CHECK(points.size() >= 3);
    double last_y = 1e9;
    for (const std::string& point : points) {
      const std::vector<std::string> xy = absl::StrSplit(point, ',');
      REQUIRE(xy.size() == 2);
      double x, y;
      REQUIRE(absl::SimpleAtod(xy[0], &x));
      REQUIRE(absl::SimpleAtod(xy[1], &y));
      CHECK(x >= 0);
      CHECK(x <= 800);
      CHECK(y >= 0);
      CHECK(y <= 500);
      CHECK(y <= last_y);  // a CDF climbs (SVG y grows downwards)
      last_y = y;
    }
  }
  CHECK(polylines == 3);  // zrpc, grpc, perftest doubled; "other<&>" has no CDF
  // Decades from 1 us (perftest 2 us doubled = 4 us) to 10000 us (grpc up to 2140 us).
  for (const char* label : {">1<", ">10<", ">100<", ">1000<", ">10000<"}) {
    CHECK(absl::StrContains(*svg, label));
  }
  CHECK(absl::StrContains(*svg, "perftest send_lat x2 (round trip)"));
  CHECK(absl::StrContains(*svg, "other&lt;&amp;&gt;? echo"));
  CHECK(absl::StrContains(*svg, "(no CDF)"));
  CHECK(absl::StrContains(*svg, "Latency CDF: echo, 64 B"));
  CHECK(absl::StrContains(*svg, ">0.0<"));
  CHECK(absl::StrContains(*svg, ">1.0<"));
}

TEST_CASE("a long legend widens the picture and many entries deepen it: nothing is clipped",
          "[report][svg]") {
  std::vector<WorkloadResult> rows;
  rows.push_back(Curve("a-system-with-a-rather-long-name-for-a-legend", "echo", {1, 2}));
  for (int i = 1; i < 14; ++i) {
    rows.push_back(Curve("s" + std::to_string(i), "echo", {1.0 + i, 2.0 + i}));
  }
  rows.push_back(Curve("perftest", "send_lat", {2, 3, 4}));
  absl::StatusOr<std::string> svg = RenderCdfSvg(Aggregates(rows), "echo", 64);
  REQUIRE(svg.ok());
  const std::vector<Element> elements = CheckWellFormed(*svg);
  CheckLegendFits(*svg, elements);
  CHECK(Attribute(elements[0], "viewBox") != "0 0 800 500");
  CHECK(absl::StrContains(*svg, "a-system-with-a-rather-long-name-for-a-legend echo"));
}

TEST_CASE("sub-microsecond decades are labelled as decimals", "[report][svg]") {
  absl::StatusOr<std::string> svg =
      RenderCdfSvg(Aggregates({Curve("zrpc", "get", {0.05, 0.5})}), "get", 64);
  REQUIRE(svg.ok());
  CheckWellFormed(*svg);
  CHECK(absl::StrContains(*svg, ">0.01<"));
  CHECK(absl::StrContains(*svg, ">0.1<"));
  CHECK(absl::StrContains(*svg, ">1<"));
}

TEST_CASE("no matching rows is NotFound, not an empty plot", "[report][svg]") {
  absl::StatusOr<std::string> svg =
      RenderCdfSvg(Aggregates({Curve("zrpc", "echo", {1})}), "echo", 4096);
  REQUIRE_FALSE(svg.ok());
  CHECK(svg.status().code() == absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace zrpc::bench
