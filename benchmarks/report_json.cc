// WorkloadResult and the aggregated document as JSON, through protobuf's JSON mapping
// (util/json_util.h) on the messages of report_row.proto. This file only maps the structs to
// those messages and back, and checks what the mapping cannot: required keys, null for "not
// measured", and the integers written as JSON numbers (see report_row.proto for why some fields
// are google.protobuf.Value).
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "benchmarks/report.h"
#include "benchmarks/report_row.pb.h"
#include "google/protobuf/util/json_util.h"

namespace zrpc::bench {
namespace {

using google::protobuf::Value;

// The largest integer every JSON reader holds exactly (a double has 53 bits of mantissa), and
// the largest such that any larger JSON integer reads as a larger double: 2^53 + 1 reads as
// 2^53, which is refused, rather than as a wrong count.
constexpr double kMaxJsonInteger = 9007199254740991.0;  // 2^53 - 1

// ---------------------------------------------------------------------------------------------
// Writing.

// The length of the valid UTF-8 sequence at s[i], or 0 when the bytes there are not one.
// protobuf's printer drops bytes that are not UTF-8 (and logs an error); the writer turns each
// into U+FFFD instead, so a mangled note still shows where it was mangled.
size_t Utf8SequenceLength(absl::string_view s, size_t i) {
  const auto byte = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char c = byte(i);
  if (c < 0x80) return 1;
  size_t n;
  uint32_t cp;
  if (c >= 0xc2 && c <= 0xdf) {
    n = 2, cp = c & 0x1f;
  } else if (c >= 0xe0 && c <= 0xef) {
    n = 3, cp = c & 0x0f;
  } else if (c >= 0xf0 && c <= 0xf4) {
    n = 4, cp = c & 0x07;
  } else {
    return 0;
  }
  if (i + n > s.size()) return 0;
  for (size_t k = 1; k < n; ++k) {
    if ((byte(i + k) & 0xc0) != 0x80) return 0;
    cp = (cp << 6) | (byte(i + k) & 0x3f);
  }
  if ((n == 3 && cp < 0x800) || (n == 4 && cp < 0x10000) || cp > 0x10ffff ||
      (cp >= 0xd800 && cp <= 0xdfff)) {
    return 0;
  }
  return n;
}

std::string ValidUtf8(absl::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    const size_t n = Utf8SequenceLength(s, i);
    if (n == 0) {
      out += "\xef\xbf\xbd";
      ++i;
    } else {
      out.append(s.data() + i, n);
      i += n;
    }
  }
  return out;
}

// A finite number as itself; NaN and the infinities, which JSON cannot hold, as null.
void SetNumber(double v, Value* out) {
  if (std::isfinite(v)) {
    out->set_number_value(v);
  } else {
    out->set_null_value(google::protobuf::NULL_VALUE);
  }
}

json::Row ToRow(const WorkloadResult& r) {
  json::Row row;
  row.set_system(ValidUtf8(r.system));
  row.set_workload(ValidUtf8(r.workload));
  row.mutable_size()->set_number_value(static_cast<double>(r.size));
  row.set_in_flight(r.in_flight);
  row.set_threads(r.threads);
  row.set_connections(r.connections);
  row.set_round(r.round);
  row.mutable_calls()->set_number_value(static_cast<double>(r.calls));
  SetNumber(r.seconds, row.mutable_seconds());
  SetNumber(r.p50_us, row.mutable_p50_us());
  SetNumber(r.p90_us, row.mutable_p90_us());
  SetNumber(r.p99_us, row.mutable_p99_us());
  SetNumber(r.p999_us, row.mutable_p999_us());
  SetNumber(r.max_us, row.mutable_max_us());
  SetNumber(r.calls_per_sec, row.mutable_calls_per_sec());
  SetNumber(r.goodput_mib_per_sec, row.mutable_goodput_mib_per_sec());
  SetNumber(r.client_cpu_us_per_call, row.mutable_client_cpu_us_per_call());
  SetNumber(r.server_cpu_us_per_call, row.mutable_server_cpu_us_per_call());
  for (double v : r.cdf_us) SetNumber(v, row.add_cdf_us());
  row.set_note(ValidUtf8(r.note));
  return row;
}

json::RatioRow ToRatioRow(const Ratio& r) {
  json::RatioRow row;
  row.set_name(ValidUtf8(r.name));
  row.set_where(ValidUtf8(r.where));
  SetNumber(r.has_target ? r.target : NAN, row.mutable_target());
  row.set_higher_is_better(r.higher_is_better);
  SetNumber(r.available ? r.value : NAN, row.mutable_value());
  row.set_rounds(r.rounds);
  const bool spread = r.available && r.rounds > 0;
  SetNumber(spread ? r.min : NAN, row.mutable_min());
  SetNumber(spread ? r.max : NAN, row.mutable_max());
  if (r.available && r.has_target) {
    row.mutable_met()->set_bool_value(r.met);
  } else {
    row.mutable_met()->set_null_value(google::protobuf::NULL_VALUE);
  }
  row.set_missing(ValidUtf8(r.missing));
  return row;
}

// One JSON object on one line, keys in field-number order. Printing fails only on what the
// messages above never hold (strings that are not UTF-8, numbers JSON cannot write); were it to,
// the object says so and every reader refuses it.
std::string Print(const google::protobuf::Message& message) {
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  // Not always_print_primitive_fields: it would print the repeated cdf_us first, out of order.
  // Every scalar has presence and is set, so only an empty cdf_us is left out.
  std::string out;
  const auto status = google::protobuf::util::MessageToJsonString(message, &out, options);
  if (!status.ok()) {
    return "{\"error\":\"protobuf could not print the row\"}";
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// Reading.

const char* KindName(const Value& v) {
  switch (v.kind_case()) {
    case Value::kNullValue:
      return "null";
    case Value::kNumberValue:
      return "a number";
    case Value::kStringValue:
      return "a string";
    case Value::kBoolValue:
      return "a boolean";
    case Value::kStructValue:
      return "an object";
    case Value::kListValue:
      return "an array";
    case Value::KIND_NOT_SET:
      break;
  }
  return "nothing";
}

absl::Status Missing(absl::string_view key) {
  return absl::InvalidArgumentError(absl::StrCat("missing required key \"", key, "\""));
}

absl::Status ReadInteger(absl::string_view key, bool present, const Value& v, uint64_t& out) {
  if (!present) return Missing(key);
  if (v.kind_case() != Value::kNumberValue) {
    return absl::InvalidArgumentError(
        absl::StrCat("key \"", key, "\": expected a non-negative integer, got ", KindName(v)));
  }
  const double d = v.number_value();
  if (d < 0 || d != std::floor(d)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("key \"%s\": expected a non-negative integer, got %.17g", key, d));
  }
  if (d > kMaxJsonInteger) {
    return absl::InvalidArgumentError(
        absl::StrFormat("key \"%s\": integer %.17g is out of range (at most 2^53 - 1)", key, d));
  }
  out = static_cast<uint64_t>(d);
  return absl::OkStatus();
}

// A number, or null read as NaN ("not measured").
absl::Status ReadDouble(absl::string_view key, const Value& v, double& out) {
  if (v.kind_case() == Value::kNumberValue) {
    out = v.number_value();
  } else if (v.kind_case() == Value::kNullValue) {
    out = NAN;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("key \"", key, "\": expected a number or null, got ", KindName(v)));
  }
  return absl::OkStatus();
}

absl::Status FromRow(const json::Row& row, WorkloadResult& r) {
  if (!row.has_system()) return Missing("system");
  if (!row.has_workload()) return Missing("workload");
  r.system = row.system();
  r.workload = row.workload();
  if (absl::Status st = ReadInteger("size", row.has_size(), row.size(), r.size); !st.ok()) {
    return st;
  }
  const std::pair<const char*, bool> ints[] = {{"in_flight", row.has_in_flight()},
                                               {"threads", row.has_threads()},
                                               {"connections", row.has_connections()},
                                               {"round", row.has_round()}};
  for (const auto& [key, present] : ints) {
    if (!present) return Missing(key);
  }
  r.in_flight = row.in_flight();
  r.threads = row.threads();
  r.connections = row.connections();
  r.round = row.round();
  if (absl::Status st = ReadInteger("calls", row.has_calls(), row.calls(), r.calls); !st.ok()) {
    return st;
  }
  const struct {
    const char* key;
    bool present;
    const Value& value;
    double& out;
  } doubles[] = {
      {"seconds", row.has_seconds(), row.seconds(), r.seconds},
      {"p50_us", row.has_p50_us(), row.p50_us(), r.p50_us},
      {"p90_us", row.has_p90_us(), row.p90_us(), r.p90_us},
      {"p99_us", row.has_p99_us(), row.p99_us(), r.p99_us},
      {"p999_us", row.has_p999_us(), row.p999_us(), r.p999_us},
      {"max_us", row.has_max_us(), row.max_us(), r.max_us},
      {"calls_per_sec", row.has_calls_per_sec(), row.calls_per_sec(), r.calls_per_sec},
      {"goodput_mib_per_sec", row.has_goodput_mib_per_sec(), row.goodput_mib_per_sec(),
       r.goodput_mib_per_sec},
      {"client_cpu_us_per_call", row.has_client_cpu_us_per_call(), row.client_cpu_us_per_call(),
       r.client_cpu_us_per_call},
      {"server_cpu_us_per_call", row.has_server_cpu_us_per_call(), row.server_cpu_us_per_call(),
       r.server_cpu_us_per_call},
  };
  for (const auto& d : doubles) {
    if (!d.present) return Missing(d.key);
    if (absl::Status st = ReadDouble(d.key, d.value, d.out); !st.ok()) return st;
  }
  r.cdf_us.clear();
  r.cdf_us.reserve(row.cdf_us_size());
  for (const Value& v : row.cdf_us()) {
    double d;
    if (absl::Status st = ReadDouble("cdf_us", v, d); !st.ok()) return st;
    r.cdf_us.push_back(d);
  }
  r.note = row.note();
  return absl::OkStatus();
}

// protobuf's syntax errors come as three lines: what was wrong, up to 20 characters either side
// of where, and a caret under the place. One line of the error keeps the text from the caret on.
std::string OneLineError(absl::string_view message) {
  const std::vector<absl::string_view> parts = absl::StrSplit(message, '\n');
  if (parts.size() != 3 || parts[2].empty() || parts[2].back() != '^') {
    return absl::StrJoin(parts, " ");
  }
  const size_t caret = parts[2].size() - 1;
  const absl::string_view rest = caret < parts[1].size() ? parts[1].substr(caret) : "";
  return rest.empty() ? absl::StrCat(parts[0], " (at the end of the line)")
                      : absl::StrCat(parts[0], " (at: ", rest, ")");
}

}  // namespace

std::string ToJsonLine(const WorkloadResult& result) {
  return absl::StrCat(Print(ToRow(result)), "\n");
}

absl::StatusOr<std::vector<WorkloadResult>> ParseJsonLines(absl::string_view text) {
  google::protobuf::util::JsonParseOptions options;
  options.ignore_unknown_fields = true;  // newer producers may add keys
  std::vector<WorkloadResult> results;
  int line_number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_number;
    if (line.find_first_not_of(" \t\r") == absl::string_view::npos) continue;
    json::Row row;
    const auto parsed = google::protobuf::util::JsonStringToMessage(
        google::protobuf::StringPiece(line.data(), line.size()), &row, options);
    if (!parsed.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("line ", line_number, ": ", OneLineError(std::string(parsed.message()))));
    }
    WorkloadResult r;
    if (absl::Status st = FromRow(row, r); !st.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("line ", line_number, ": ", st.message()));
    }
    results.push_back(std::move(r));
  }
  return results;
}

std::string ToJsonDocument(const std::vector<Aggregate>& aggregates,
                           const std::vector<Ratio>& ratios) {
  // One object per line, as in the JSON Lines files, so that the document stays readable and
  // diffable; each object is printed by protobuf.
  std::string out = "{\"results\":[";
  for (size_t i = 0; i < aggregates.size(); ++i) {
    json::Row row = ToRow(aggregates[i].median);
    row.set_rounds(aggregates[i].rounds);
    absl::StrAppend(&out, i == 0 ? "\n" : ",\n", Print(row));
  }
  out += "],\n\"ratios\":[";
  for (size_t i = 0; i < ratios.size(); ++i) {
    absl::StrAppend(&out, i == 0 ? "\n" : ",\n", Print(ToRatioRow(ratios[i])));
  }
  out += "]}\n";
  return out;
}

}  // namespace zrpc::bench
