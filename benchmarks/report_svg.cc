// RenderCdfSvg: latency CDFs as a hand-written SVG, one polyline per system.
//
// Layout (pixels, at least 800 x 500): the plot area is x in [70, 590], y in [50, 440]; the
// legend sits to its right so it never hides a curve, and the picture widens (and deepens) to
// hold its longest line and every entry (text width estimated at kCharEm per character).
// Coordinates are written with two decimals through std::to_chars, which ignores the locale (a
// "1,5" in a points list would break the file).
#include <algorithm>
#include <charconv>
#include <cmath>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "benchmarks/report.h"

namespace zrpc::bench {
namespace {

constexpr double kMinWidth = 800, kMinHeight = 500;
constexpr double kLegendX = 636;     // where the legend's text starts
constexpr double kLegendPitch = 36;  // between entries
constexpr double kCharEm = 0.62;     // a generous average glyph width of sans-serif, in em
constexpr double kLeft = 70, kRight = 590, kTop = 50, kBottom = 440;
constexpr const char* kColors[] = {"#1f77b4", "#d62728", "#2ca02c",
                                   "#ff7f0e", "#9467bd", "#8c564b"};

std::string Num(double v) {
  char buffer[64];
  const std::to_chars_result r =
      std::to_chars(buffer, buffer + sizeof(buffer), v, std::chars_format::fixed, 2);
  return std::string(buffer, r.ptr);
}

std::string XmlEscape(absl::string_view s) {
  std::string out;
  for (char c : s) {
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
      default:
        // XML 1.0 forbids control characters but tab and newline (a JSON string may hold any).
        out += static_cast<unsigned char>(c) < 0x20 && c != '\t' && c != '\n' ? '?' : c;
    }
  }
  return out;
}

// "0.01", "0.1", "1", "10", "100" for 10^k.
std::string DecadeLabel(int k) {
  if (k >= 0) return absl::StrCat("1", std::string(k, '0'));
  return absl::StrCat("0.", std::string(-k - 1, '0'), "1");
}

struct Curve {
  std::string label;       // legend, first line: system and workload
  std::string detail;      // legend, second line: the configuration
  std::vector<double> us;  // already scaled (perftest send_lat doubled for echo)
};

// Per system, the row to draw: smallest in_flight, then fewest threads x connections.
std::vector<Curve> PickCurves(const std::vector<Aggregate>& aggregates, absl::string_view workload,
                              uint64_t size) {
  std::vector<const WorkloadResult*> picked;
  for (const Aggregate& a : aggregates) {
    const WorkloadResult& r = a.median;
    const bool doubled = workload == "echo" && r.system == "perftest" && r.workload == "send_lat";
    if (r.size != size || (r.workload != workload && !doubled)) continue;
    auto same = std::find_if(picked.begin(), picked.end(),
                             [&](const WorkloadResult* p) { return p->system == r.system; });
    if (same == picked.end()) {
      picked.push_back(&r);
    } else if (std::make_pair(r.in_flight, r.threads * r.connections) <
               std::make_pair((*same)->in_flight, (*same)->threads * (*same)->connections)) {
      *same = &r;
    }
  }
  std::vector<Curve> curves;
  for (const WorkloadResult* r : picked) {
    Curve c;
    const bool doubled = r->workload != workload;
    c.label = absl::StrCat(r->system, " ", r->workload, doubled ? " x2 (round trip)" : "");
    c.detail = absl::StrCat("in_flight ", r->in_flight, ", ", r->threads, "x", r->connections,
                            r->cdf_us.empty() ? " (no CDF)" : "");
    for (double v : r->cdf_us) c.us.push_back(doubled ? 2 * v : v);
    curves.push_back(std::move(c));
  }
  return curves;
}

}  // namespace

absl::StatusOr<std::string> RenderCdfSvg(const std::vector<Aggregate>& aggregates,
                                         absl::string_view workload, uint64_t size) {
  const std::vector<Curve> curves = PickCurves(aggregates, workload, size);
  if (curves.empty()) {
    return absl::NotFoundError(
        absl::StrCat("no results for workload ", workload, " at size ", size, " to plot"));
  }
  // The x axis spans whole decades around every positive latency drawn.
  double min_us = HUGE_VAL, max_us = 0;
  for (const Curve& c : curves) {
    for (double v : c.us) {
      if (v > 0 && std::isfinite(v)) min_us = std::min(min_us, v), max_us = std::max(max_us, v);
    }
  }
  int lo = 0, hi = 2;  // 1 us .. 100 us when nothing is drawn
  if (max_us > 0) {
    lo = static_cast<int>(std::floor(std::log10(min_us)));
    hi = static_cast<int>(std::ceil(std::log10(max_us)));
    if (hi <= lo) hi = lo + 1;
  }
  auto x_of = [&](double us) {
    const double l =
        us > 0 && std::isfinite(us) ? std::clamp(std::log10(us), 1.0 * lo, 1.0 * hi) : lo;
    return kLeft + (l - lo) / (hi - lo) * (kRight - kLeft);
  };
  auto y_of = [](double fraction) { return kBottom - fraction * (kBottom - kTop); };
  // Room for the legend: its widest line (label at 11 px, detail at 10 px) and every entry.
  double legend_width = 0;
  for (const Curve& c : curves) {
    legend_width =
        std::max({legend_width, c.label.size() * 11 * kCharEm, c.detail.size() * 10 * kCharEm});
  }
  const double width = std::max(kMinWidth, std::ceil(kLegendX + legend_width + 12));
  const double height =
      std::max(kMinHeight, std::ceil(kTop + 10 + kLegendPitch * curves.size() + 12));

  std::string svg = absl::StrCat(
      "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"",
      width, "\" height=\"", height, "\" viewBox=\"0 0 ", width, " ", height,
      "\" font-family=\"sans-serif\" font-size=\"12\">\n", "<rect x=\"0\" y=\"0\" width=\"", width,
      "\" height=\"", height, "\" fill=\"white\"/>\n", "<text x=\"", Num((kLeft + kRight) / 2),
      "\" y=\"28\" text-anchor=\"middle\" "
      "font-size=\"16\">Latency CDF: ",
      XmlEscape(workload), ", ", size, " B (medians of rounds; one round's CDF)</text>\n");

  // Gridlines and labels: y every 0.1 (labelled every 0.2), x at decades (labelled) and at
  // 2..9 times each decade (light).
  for (int i = 0; i <= 10; ++i) {
    const std::string y = Num(y_of(i / 10.0));
    absl::StrAppend(&svg, "<line x1=\"", Num(kLeft), "\" y1=\"", y, "\" x2=\"", Num(kRight),
                    "\" y2=\"", y, "\" stroke=\"#dddddd\"/>\n");
    if (i % 2 == 0) {
      absl::StrAppend(&svg, "<text x=\"", Num(kLeft - 8), "\" y=\"", Num(y_of(i / 10.0) + 4),
                      "\" text-anchor=\"end\">", Num(i / 10.0).substr(0, 3), "</text>\n");
    }
  }
  for (int k = lo; k <= hi; ++k) {
    const std::string x = Num(x_of(std::pow(10.0, k)));
    absl::StrAppend(&svg, "<line x1=\"", x, "\" y1=\"", Num(kTop), "\" x2=\"", x, "\" y2=\"",
                    Num(kBottom), "\" stroke=\"#bbbbbb\"/>\n", "<text x=\"", x, "\" y=\"",
                    Num(kBottom + 18), "\" text-anchor=\"middle\">", DecadeLabel(k), "</text>\n");
    for (int m = 2; m <= 9 && k < hi; ++m) {
      const std::string xm = Num(x_of(m * std::pow(10.0, k)));
      absl::StrAppend(&svg, "<line x1=\"", xm, "\" y1=\"", Num(kTop), "\" x2=\"", xm, "\" y2=\"",
                      Num(kBottom), "\" stroke=\"#f0f0f0\"/>\n");
    }
  }
  absl::StrAppend(
      &svg, "<rect x=\"", Num(kLeft), "\" y=\"", Num(kTop), "\" width=\"", Num(kRight - kLeft),
      "\" height=\"", Num(kBottom - kTop), "\" fill=\"none\" stroke=\"black\"/>\n", "<text x=\"",
      Num((kLeft + kRight) / 2), "\" y=\"", Num(kBottom + 40),
      "\" text-anchor=\"middle\">latency (us, log scale)</text>\n", "<text x=\"20\" y=\"",
      Num((kTop + kBottom) / 2), "\" text-anchor=\"middle\" transform=\"rotate(-90 20 ",
      Num((kTop + kBottom) / 2), ")\">cumulative fraction of calls</text>\n");

  // The curves: point i of m at cumulative fraction i / (m - 1), as Summary defines it.
  for (size_t c = 0; c < curves.size(); ++c) {
    const std::vector<double>& us = curves[c].us;
    const char* color = kColors[c % (sizeof(kColors) / sizeof(kColors[0]))];
    if (!us.empty()) {
      std::string points;
      for (size_t i = 0; i < us.size(); ++i) {
        const double fraction = us.size() == 1 ? 1.0 : static_cast<double>(i) / (us.size() - 1);
        absl::StrAppend(&points, i == 0 ? "" : " ", Num(x_of(us[i])), ",", Num(y_of(fraction)));
      }
      absl::StrAppend(&svg, "<polyline fill=\"none\" stroke=\"", color,
                      "\" stroke-width=\"2\" points=\"", points, "\"/>\n");
    }
    const double ly = kTop + 10 + kLegendPitch * c;
    absl::StrAppend(&svg, "<line x1=\"605\" y1=\"", Num(ly), "\" x2=\"630\" y2=\"", Num(ly),
                    "\" stroke=\"", color, "\" stroke-width=\"2\"/>\n", "<text x=\"", Num(kLegendX),
                    "\" y=\"", Num(ly + 4), "\" font-size=\"11\">", XmlEscape(curves[c].label),
                    "</text>\n", "<text x=\"", Num(kLegendX), "\" y=\"", Num(ly + 18),
                    "\" font-size=\"10\">", XmlEscape(curves[c].detail), "</text>\n");
  }
  svg += "</svg>\n";
  return svg;
}

}  // namespace zrpc::bench
