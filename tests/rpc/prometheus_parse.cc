#include "tests/rpc/prometheus_parse.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/charconv.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace zrpc::testing {
namespace {

using Labels = std::vector<std::pair<std::string, std::string>>;

struct Family {
  std::string type;  // empty until # TYPE
  bool help = false;
  bool has_samples = false;
};

// One histogram series group: the labels but `le`.
struct HistogramGroup {
  std::vector<std::pair<double, double>> buckets;  // (le, cumulative count)
  bool has_count = false;
  double count = 0;
};

bool IsNameChar(char c, bool first, bool allow_colon) {
  return absl::ascii_isalpha(c) || c == '_' || (allow_colon && c == ':') ||
         (!first && absl::ascii_isdigit(c));
}

// Consumes a metric name (allow_colon) or label name from the front of `s`; empty if none.
absl::string_view TakeName(absl::string_view& s, bool allow_colon) {
  size_t n = 0;
  while (n < s.size() && IsNameChar(s[n], n == 0, allow_colon)) ++n;
  absl::string_view name = s.substr(0, n);
  s.remove_prefix(n);
  return name;
}

bool IsMetricName(absl::string_view s) {
  absl::string_view rest = s;
  return !TakeName(rest, /*allow_colon=*/true).empty() && rest.empty();
}

std::string Escape(absl::string_view value) {
  std::string out;
  for (char c : value) {
    if (c == '\\' || c == '"') out += '\\';
    out += c == '\n' ? std::string("\\n") : std::string(1, c);
  }
  return out;
}

std::string SeriesKey(absl::string_view name, const Labels& labels, absl::string_view skip) {
  std::string key(name);
  if (labels.empty()) return key;
  key += '{';
  bool first = true;
  for (const auto& [label, value] : labels) {
    if (label == skip) continue;
    absl::StrAppend(&key, first ? "" : ",", label, "=\"", Escape(value), "\"");
    first = false;
  }
  return key + '}';
}

// Parses `{name="value",...}` (trailing comma allowed) from the front of `s`.
absl::StatusOr<Labels> TakeLabels(absl::string_view& s) {
  Labels labels;
  if (!absl::ConsumePrefix(&s, "{")) return labels;
  while (!absl::ConsumePrefix(&s, "}")) {
    absl::string_view name = TakeName(s, /*allow_colon=*/false);
    if (name.empty()) return absl::InvalidArgumentError("bad label name");
    if (!absl::ConsumePrefix(&s, "=\"")) return absl::InvalidArgumentError("expected =\"");
    std::string value;
    while (true) {
      if (s.empty()) return absl::InvalidArgumentError("unterminated label value");
      const char c = s[0];
      s.remove_prefix(1);
      if (c == '"') break;
      if (c != '\\') {
        value += c;
        continue;
      }
      if (s.empty()) return absl::InvalidArgumentError("unterminated escape");
      const char e = s[0];
      s.remove_prefix(1);
      if (e == 'n') {
        value += '\n';
      } else if (e == '\\' || e == '"') {
        value += e;
      } else {
        return absl::InvalidArgumentError(absl::StrCat("unknown escape \\", std::string(1, e)));
      }
    }
    for (const auto& [other, unused] : labels) {
      if (other == name) return absl::InvalidArgumentError(absl::StrCat("duplicate label ", name));
    }
    labels.emplace_back(std::string(name), std::move(value));
    if (!absl::ConsumePrefix(&s, ",") && !absl::StartsWith(s, "}")) {
      return absl::InvalidArgumentError("expected , or } after a label");
    }
  }
  return labels;
}

absl::StatusOr<double> ParseValue(absl::string_view s) {
  if (s == "+Inf" || s == "Inf") return std::numeric_limits<double>::infinity();
  if (s == "-Inf") return -std::numeric_limits<double>::infinity();
  if (s == "NaN") return std::numeric_limits<double>::quiet_NaN();
  absl::string_view digits = s;
  absl::ConsumePrefix(&digits, "+");
  double value = 0;
  const char* end = digits.data() + digits.size();
  absl::from_chars_result r = absl::from_chars(digits.data(), end, value);
  if (digits.empty() || r.ec != std::errc() || r.ptr != end || !std::isfinite(value)) {
    return absl::InvalidArgumentError(absl::StrCat("bad value '", s, "'"));
  }
  return value;
}

class Parser {
 public:
  absl::Status Line(absl::string_view line) {
    if (line.empty()) return absl::OkStatus();
    if (absl::ConsumePrefix(&line, "#")) return Comment(line);
    return SampleLine(line);
  }

  absl::Status Finish() {
    for (const auto& [key, group] : histograms_) {
      std::vector<std::pair<double, double>> buckets = group.buckets;
      std::sort(buckets.begin(), buckets.end());
      for (size_t i = 1; i < buckets.size(); ++i) {
        if (buckets[i].first == buckets[i - 1].first) {
          return absl::InvalidArgumentError(absl::StrCat(key, ": duplicate le"));
        }
        if (buckets[i].second < buckets[i - 1].second) {
          return absl::InvalidArgumentError(absl::StrCat(key, ": buckets not cumulative"));
        }
      }
      if (buckets.empty() || !std::isinf(buckets.back().first)) {
        return absl::InvalidArgumentError(absl::StrCat(key, ": no le=\"+Inf\" bucket"));
      }
      if (!group.has_count || group.count != buckets.back().second) {
        return absl::InvalidArgumentError(absl::StrCat(key, ": +Inf bucket != _count"));
      }
    }
    return absl::OkStatus();
  }

  std::map<std::string, double>& samples() { return samples_; }

 private:
  absl::Status Comment(absl::string_view line) {
    const bool help = absl::ConsumePrefix(&line, " HELP ");
    if (!help && !absl::ConsumePrefix(&line, " TYPE ")) return absl::OkStatus();  // a comment
    std::pair<absl::string_view, absl::string_view> parts =
        absl::StrSplit(line, absl::MaxSplits(' ', 1));
    const absl::string_view name = parts.first;
    if (!IsMetricName(name)) return absl::InvalidArgumentError("bad metric name in HELP/TYPE");
    absl::Status entered = Enter(name);
    if (!entered.ok()) return entered;
    Family& family = families_[std::string(name)];
    if (family.has_samples) return absl::InvalidArgumentError("HELP/TYPE after samples");
    if (help) {
      if (family.help) return absl::InvalidArgumentError(absl::StrCat("second HELP ", name));
      family.help = true;
      return absl::OkStatus();
    }
    if (!family.type.empty()) return absl::InvalidArgumentError(absl::StrCat("second TYPE ", name));
    constexpr absl::string_view kTypes[] = {"counter", "gauge", "histogram", "summary", "untyped"};
    if (std::find(std::begin(kTypes), std::end(kTypes), parts.second) == std::end(kTypes)) {
      return absl::InvalidArgumentError("unknown type");
    }
    family.type = std::string(parts.second);
    return absl::OkStatus();
  }

  // Makes `family` the current group; a family whose group ended may not come back.
  absl::Status Enter(absl::string_view family) {
    if (family == current_) return absl::OkStatus();
    if (!current_.empty()) ended_.insert(current_);
    if (ended_.count(std::string(family)) != 0) {
      return absl::InvalidArgumentError(absl::StrCat(family, ": lines not in one group"));
    }
    current_ = std::string(family);
    return absl::OkStatus();
  }

  // The declared family a sample name belongs to, with its suffix ("" for the family itself).
  std::pair<std::string, absl::string_view> FamilyOf(absl::string_view name) const {
    for (absl::string_view suffix : {"_bucket", "_sum", "_count"}) {
      if (!absl::EndsWith(name, suffix)) continue;
      auto it = families_.find(std::string(name.substr(0, name.size() - suffix.size())));
      if (it == families_.end()) continue;
      const std::string& type = it->second.type;
      if (type == "histogram" || (type == "summary" && suffix != "_bucket")) {
        return {it->first, suffix};
      }
    }
    return {std::string(name), ""};
  }

  absl::Status SampleLine(absl::string_view line) {
    const absl::string_view name = TakeName(line, /*allow_colon=*/true);
    if (name.empty()) return absl::InvalidArgumentError("bad metric name");
    absl::StatusOr<Labels> labels = TakeLabels(line);
    if (!labels.ok()) return labels.status();
    std::vector<absl::string_view> tokens =
        absl::StrSplit(line, absl::ByAnyChar(" \t"), absl::SkipEmpty());
    if (line.empty() || (line[0] != ' ' && line[0] != '\t') || tokens.empty() ||
        tokens.size() > 2) {
      return absl::InvalidArgumentError("expected ' value [timestamp]'");
    }
    int64_t timestamp = 0;
    if (tokens.size() == 2 && !absl::SimpleAtoi(tokens[1], &timestamp)) {
      return absl::InvalidArgumentError("bad timestamp");
    }
    absl::StatusOr<double> value = ParseValue(tokens[0]);
    if (!value.ok()) return value.status();

    auto [family_name, suffix] = FamilyOf(name);
    auto family = families_.find(family_name);
    if (family == families_.end() || family->second.type.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(name, ": sample before its # TYPE"));
    }
    absl::Status entered = Enter(family_name);
    if (!entered.ok()) return entered;
    family->second.has_samples = true;
    if (family->second.type == "counter" && !(*value >= 0)) {
      return absl::InvalidArgumentError(absl::StrCat(name, ": negative or NaN counter"));
    }
    const std::string key = SeriesKey(name, *labels, "");
    if (!samples_.emplace(key, *value).second) {
      return absl::InvalidArgumentError(absl::StrCat("duplicate series ", key));
    }
    if (family->second.type == "histogram") return HistogramSample(*labels, suffix, *value);
    return absl::OkStatus();
  }

  absl::Status HistogramSample(const Labels& labels, absl::string_view suffix, double value) {
    HistogramGroup& group = histograms_[SeriesKey(current_, labels, "le")];
    if (suffix.empty()) return absl::InvalidArgumentError("histogram sample without a suffix");
    if (suffix == "_count") {
      group.has_count = true;
      group.count = value;
    } else if (suffix == "_bucket") {
      auto le = std::find_if(labels.begin(), labels.end(),
                             [](const auto& label) { return label.first == "le"; });
      if (le == labels.end()) return absl::InvalidArgumentError("_bucket without le");
      absl::StatusOr<double> bound = ParseValue(le->second);
      if (!bound.ok()) return bound.status();
      group.buckets.emplace_back(*bound, value);
    }
    return absl::OkStatus();
  }

  std::map<std::string, Family> families_;
  std::string current_;
  std::set<std::string> ended_;
  std::map<std::string, HistogramGroup> histograms_;
  std::map<std::string, double> samples_;
};

}  // namespace

absl::StatusOr<std::map<std::string, double>> ParsePrometheusText(absl::string_view text) {
  if (!text.empty() && text.back() != '\n') {
    return absl::InvalidArgumentError("text does not end with a newline");
  }
  Parser parser;
  int line_number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_number;
    absl::Status status = parser.Line(line);
    if (!status.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("line ", line_number, ": ", status.message(), ": '", line, "'"));
    }
  }
  absl::Status status = parser.Finish();
  if (!status.ok()) return status;
  return std::move(parser.samples());
}

}  // namespace zrpc::testing
