// WorkloadResult as JSON Lines: the writer, a small strict JSON parser, and the aggregated
// document. One table of fields (kFields) drives both directions, so the key names and order
// cannot drift apart.
//
// The parser builds a generic value tree for a line and then maps it onto the struct. Why not
// parse straight into the struct: unknown keys may hold any JSON (objects, arrays) that must be
// checked and skipped, and a tree makes "wrong type for key" errors easy to word. A line is
// small (a few KB with a 200-point CDF), so the tree costs nothing that matters.
#include <charconv>
#include <cmath>
#include <set>
#include <system_error>
#include <type_traits>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "benchmarks/report.h"

namespace zrpc::bench {
namespace {

// ---------------------------------------------------------------------------------------------
// The schema.

struct Field {
  const char* name;
  std::string WorkloadResult::*str = nullptr;
  uint64_t WorkloadResult::*u64 = nullptr;
  int WorkloadResult::*i32 = nullptr;
  double WorkloadResult::*f64 = nullptr;
  std::vector<double> WorkloadResult::*f64s = nullptr;
  bool required = true;
};

Field Str(const char* n, std::string WorkloadResult::*m, bool required = true) {
  Field f{n};
  f.str = m;
  f.required = required;
  return f;
}
Field U64(const char* n, uint64_t WorkloadResult::*m) {
  Field f{n};
  f.u64 = m;
  return f;
}
Field I32(const char* n, int WorkloadResult::*m) {
  Field f{n};
  f.i32 = m;
  return f;
}
Field F64(const char* n, double WorkloadResult::*m) {
  Field f{n};
  f.f64 = m;
  return f;
}
Field F64s(const char* n, std::vector<double> WorkloadResult::*m) {
  Field f{n};
  f.f64s = m;
  f.required = false;
  return f;
}

const std::vector<Field>& Fields() {
  static const auto* fields = new std::vector<Field>{
      Str("system", &WorkloadResult::system),
      Str("workload", &WorkloadResult::workload),
      U64("size", &WorkloadResult::size),
      I32("in_flight", &WorkloadResult::in_flight),
      I32("threads", &WorkloadResult::threads),
      I32("connections", &WorkloadResult::connections),
      I32("round", &WorkloadResult::round),
      U64("calls", &WorkloadResult::calls),
      F64("seconds", &WorkloadResult::seconds),
      F64("p50_us", &WorkloadResult::p50_us),
      F64("p90_us", &WorkloadResult::p90_us),
      F64("p99_us", &WorkloadResult::p99_us),
      F64("p999_us", &WorkloadResult::p999_us),
      F64("max_us", &WorkloadResult::max_us),
      F64("calls_per_sec", &WorkloadResult::calls_per_sec),
      F64("goodput_mib_per_sec", &WorkloadResult::goodput_mib_per_sec),
      F64("client_cpu_us_per_call", &WorkloadResult::client_cpu_us_per_call),
      F64("server_cpu_us_per_call", &WorkloadResult::server_cpu_us_per_call),
      F64s("cdf_us", &WorkloadResult::cdf_us),
      Str("note", &WorkloadResult::note, /*required=*/false),
  };
  return *fields;
}

// ---------------------------------------------------------------------------------------------
// Writing.

// The length of the valid UTF-8 sequence starting at s[i] (1 to 4), or 0 if it is not one
// (overlong forms, surrogates and code points past U+10FFFF are not valid).
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

void AppendJsonString(absl::string_view s, std::string& out) {
  static constexpr char kHex[] = "0123456789abcdef";
  out += '"';
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c >= 0x80) {
      const size_t n = Utf8SequenceLength(s, i);
      const absl::string_view piece = n == 0 ? absl::string_view("\xef\xbf\xbd") : s.substr(i, n);
      out.append(piece.data(), piece.size());  // invalid bytes become U+FFFD
      i += n == 0 ? 1 : n;
      continue;
    }
    ++i;
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20 || c == 0x7f) {
          out += "\\u00";
          out += kHex[c >> 4];
          out += kHex[c & 0xf];
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  out += '"';
}

void AppendJsonNumber(double v, std::string& out) {
  if (!std::isfinite(v)) {
    out += "null";
    return;
  }
  char buffer[64];
  // Shortest round-trip form, never locale-dependent.
  const std::to_chars_result r = std::to_chars(buffer, buffer + sizeof(buffer), v);
  out.append(buffer, r.ptr);
}

void AppendResultMembers(const WorkloadResult& r, std::string& out) {
  bool first = true;
  for (const Field& f : Fields()) {
    if (!first) out += ',';
    first = false;
    AppendJsonString(f.name, out);
    out += ':';
    if (f.str != nullptr) {
      AppendJsonString(r.*f.str, out);
    } else if (f.u64 != nullptr) {
      absl::StrAppend(&out, r.*f.u64);
    } else if (f.i32 != nullptr) {
      absl::StrAppend(&out, r.*f.i32);
    } else if (f.f64 != nullptr) {
      AppendJsonNumber(r.*f.f64, out);
    } else {
      out += '[';
      for (size_t i = 0; i < (r.*f.f64s).size(); ++i) {
        if (i > 0) out += ',';
        AppendJsonNumber((r.*f.f64s)[i], out);
      }
      out += ']';
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Parsing.

struct JsonValue {
  enum class Type { kNull, kBool, kNumber, kString, kArray, kObject };
  Type type = Type::kNull;
  std::string text;  // a string's value, or a number's token as written
  std::vector<JsonValue> items;
  std::vector<std::pair<std::string, JsonValue>> members;
};

const char* TypeName(JsonValue::Type t) {
  switch (t) {
    case JsonValue::Type::kNull: return "null";
    case JsonValue::Type::kBool: return "a boolean";
    case JsonValue::Type::kNumber: return "a number";
    case JsonValue::Type::kString: return "a string";
    case JsonValue::Type::kArray: return "an array";
    case JsonValue::Type::kObject: return "an object";
  }
  return "?";
}

constexpr int kMaxDepth = 64;

// A recursive-descent parser of one line. Errors name the 1-based column.
class LineParser {
 public:
  explicit LineParser(absl::string_view line) : s_(line) {}

  // The whole line as one object, with nothing after it but whitespace.
  absl::Status ParseLine(JsonValue& out) {
    SkipSpace();
    if (AtEnd() || s_[pos_] != '{') return Error("expected '{' to start a JSON object");
    absl::Status st = ParseValue(out, 0);
    if (!st.ok()) return st;
    SkipSpace();
    if (!AtEnd()) return Error("unexpected text after the JSON object");
    return absl::OkStatus();
  }

 private:
  bool AtEnd() const { return pos_ >= s_.size(); }
  void SkipSpace() {
    while (!AtEnd() && (s_[pos_] == ' ' || s_[pos_] == '\t' || s_[pos_] == '\r')) ++pos_;
  }
  absl::Status Error(absl::string_view what) const {
    return absl::InvalidArgumentError(
        absl::StrCat("column ", pos_ + 1, ": ", AtEnd() ? "unexpected end of line: " : "", what));
  }
  bool Consume(absl::string_view word) {
    if (s_.substr(pos_, word.size()) != word) return false;
    pos_ += word.size();
    return true;
  }

  absl::Status ParseValue(JsonValue& out, int depth) {
    if (depth >= kMaxDepth) return Error("nesting deeper than 64");
    SkipSpace();
    if (AtEnd()) return Error("expected a value");
    const char c = s_[pos_];
    if (c == '{') return ParseObject(out, depth);
    if (c == '[') return ParseArray(out, depth);
    if (c == '"') {
      out.type = JsonValue::Type::kString;
      return ParseString(out.text);
    }
    if (c == '-' || (c >= '0' && c <= '9')) return ParseNumber(out);
    for (const char* word : {"true", "false"}) {
      if (Consume(word)) {
        out.type = JsonValue::Type::kBool;
        out.text = word;
        return absl::OkStatus();
      }
    }
    if (Consume("null")) {
      out.type = JsonValue::Type::kNull;
      return absl::OkStatus();
    }
    return Error("expected a value (object, array, string, number, true, false or null)");
  }

  absl::Status ParseObject(JsonValue& out, int depth) {
    out.type = JsonValue::Type::kObject;
    ++pos_;  // '{'
    SkipSpace();
    if (!AtEnd() && s_[pos_] == '}') {
      ++pos_;
      return absl::OkStatus();
    }
    while (true) {
      SkipSpace();
      if (AtEnd() || s_[pos_] != '"') return Error("expected '\"' to start an object key");
      std::string key;
      absl::Status st = ParseString(key);
      if (!st.ok()) return st;
      SkipSpace();
      if (AtEnd() || s_[pos_] != ':') return Error("expected ':' after an object key");
      ++pos_;
      JsonValue value;
      st = ParseValue(value, depth + 1);
      if (!st.ok()) return st;
      out.members.emplace_back(std::move(key), std::move(value));
      SkipSpace();
      if (AtEnd()) return Error("expected ',' or '}' in an object");
      if (s_[pos_] == '}') {
        ++pos_;
        return absl::OkStatus();
      }
      if (s_[pos_] != ',') return Error("expected ',' or '}' in an object");
      ++pos_;
    }
  }

  absl::Status ParseArray(JsonValue& out, int depth) {
    out.type = JsonValue::Type::kArray;
    ++pos_;  // '['
    SkipSpace();
    if (!AtEnd() && s_[pos_] == ']') {
      ++pos_;
      return absl::OkStatus();
    }
    while (true) {
      out.items.emplace_back();
      absl::Status st = ParseValue(out.items.back(), depth + 1);
      if (!st.ok()) return st;
      SkipSpace();
      if (AtEnd()) return Error("expected ',' or ']' in an array");
      if (s_[pos_] == ']') {
        ++pos_;
        return absl::OkStatus();
      }
      if (s_[pos_] != ',') return Error("expected ',' or ']' in an array");
      ++pos_;
    }
  }

  // Four hex digits after "\u".
  bool Hex4(uint32_t& v) {
    if (pos_ + 4 > s_.size()) return false;
    v = 0;
    for (int k = 0; k < 4; ++k) {
      const char h = s_[pos_ + k];
      const int d = h >= '0' && h <= '9'   ? h - '0'
                    : h >= 'a' && h <= 'f' ? h - 'a' + 10
                    : h >= 'A' && h <= 'F' ? h - 'A' + 10
                                           : -1;
      if (d < 0) return false;
      v = v * 16 + d;
    }
    pos_ += 4;
    return true;
  }

  static void AppendUtf8(uint32_t cp, std::string& out) {
    if (cp < 0x80) {
      out += static_cast<char>(cp);
    } else if (cp < 0x800) {
      out += static_cast<char>(0xc0 | (cp >> 6));
      out += static_cast<char>(0x80 | (cp & 0x3f));
    } else if (cp < 0x10000) {
      out += static_cast<char>(0xe0 | (cp >> 12));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
      out += static_cast<char>(0x80 | (cp & 0x3f));
    } else {
      out += static_cast<char>(0xf0 | (cp >> 18));
      out += static_cast<char>(0x80 | ((cp >> 12) & 0x3f));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
      out += static_cast<char>(0x80 | (cp & 0x3f));
    }
  }

  absl::Status ParseEscape(std::string& out) {
    if (AtEnd()) return Error("unterminated string");
    const char e = s_[pos_++];
    switch (e) {
      case '"': out += '"'; return absl::OkStatus();
      case '\\': out += '\\'; return absl::OkStatus();
      case '/': out += '/'; return absl::OkStatus();
      case 'b': out += '\b'; return absl::OkStatus();
      case 'f': out += '\f'; return absl::OkStatus();
      case 'n': out += '\n'; return absl::OkStatus();
      case 'r': out += '\r'; return absl::OkStatus();
      case 't': out += '\t'; return absl::OkStatus();
      case 'u': break;
      default: --pos_; return Error("unknown escape in a string");
    }
    uint32_t cp;
    if (!Hex4(cp)) return Error("expected four hex digits after \\u");
    if (cp >= 0xdc00 && cp <= 0xdfff) return Error("unpaired low surrogate in \\u escape");
    if (cp >= 0xd800 && cp <= 0xdbff) {
      uint32_t low;
      if (!Consume("\\u") || !Hex4(low) || low < 0xdc00 || low > 0xdfff) {
        return Error("high surrogate not followed by a \\u low surrogate");
      }
      cp = 0x10000 + ((cp - 0xd800) << 10) + (low - 0xdc00);
    }
    AppendUtf8(cp, out);
    return absl::OkStatus();
  }

  absl::Status ParseString(std::string& out) {
    ++pos_;  // '"'
    while (true) {
      if (AtEnd()) return Error("unterminated string");
      const unsigned char c = static_cast<unsigned char>(s_[pos_]);
      if (c == '"') {
        ++pos_;
        return absl::OkStatus();
      }
      if (c == '\\') {
        ++pos_;
        absl::Status st = ParseEscape(out);
        if (!st.ok()) return st;
      } else if (c < 0x20) {
        return Error("control character in a string (must be escaped)");
      } else {
        const size_t n = Utf8SequenceLength(s_, pos_);
        if (n == 0) return Error("invalid UTF-8 in a string");
        out.append(s_.data() + pos_, n);
        pos_ += n;
      }
    }
  }

  // RFC 8259: -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?. Kept as text; the schema decides
  // whether it must be an integer.
  absl::Status ParseNumber(JsonValue& out) {
    const size_t start = pos_;
    auto digits = [this] {
      size_t n = 0;
      while (!AtEnd() && s_[pos_] >= '0' && s_[pos_] <= '9') ++pos_, ++n;
      return n;
    };
    if (s_[pos_] == '-') ++pos_;
    if (!AtEnd() && s_[pos_] == '0') {
      ++pos_;
      if (!AtEnd() && s_[pos_] >= '0' && s_[pos_] <= '9') return Error("leading zero in a number");
    } else if (digits() == 0) {
      return Error("expected a digit in a number");
    }
    if (!AtEnd() && s_[pos_] == '.') {
      ++pos_;
      if (digits() == 0) return Error("expected a digit after '.' in a number");
    }
    if (!AtEnd() && (s_[pos_] == 'e' || s_[pos_] == 'E')) {
      ++pos_;
      if (!AtEnd() && (s_[pos_] == '+' || s_[pos_] == '-')) ++pos_;
      if (digits() == 0) return Error("expected a digit in a number's exponent");
    }
    out.type = JsonValue::Type::kNumber;
    out.text = std::string(s_.substr(start, pos_ - start));
    return absl::OkStatus();
  }

  absl::string_view s_;
  size_t pos_ = 0;
};

// ---------------------------------------------------------------------------------------------
// Mapping a parsed line onto WorkloadResult.

absl::Status WrongType(const Field& f, absl::string_view wanted, const JsonValue& v) {
  return absl::InvalidArgumentError(absl::StrCat("key \"", f.name, "\": expected ", wanted,
                                                 ", got ", TypeName(v.type)));
}

absl::Status ToDouble(const Field& f, const JsonValue& v, double& out) {
  if (v.type == JsonValue::Type::kNull) {
    out = std::nan("");
    return absl::OkStatus();
  }
  if (v.type != JsonValue::Type::kNumber) return WrongType(f, "a number or null", v);
  const char* end = v.text.data() + v.text.size();
  const std::from_chars_result r = std::from_chars(v.text.data(), end, out);
  if (r.ec != std::errc() || r.ptr != end) {
    return absl::InvalidArgumentError(
        absl::StrCat("key \"", f.name, "\": number ", v.text, " is out of range"));
  }
  return absl::OkStatus();
}

template <typename Int>
absl::Status ToInteger(const Field& f, const JsonValue& v, Int& out) {
  const bool is_unsigned = std::is_unsigned_v<Int>;
  const char* wanted = is_unsigned ? "a non-negative integer" : "an integer";
  if (v.type != JsonValue::Type::kNumber) return WrongType(f, wanted, v);
  const char* begin = v.text.data();
  const char* end = begin + v.text.size();
  if (v.text.find_first_of(".eE") != std::string::npos || (is_unsigned && *begin == '-')) {
    return absl::InvalidArgumentError(
        absl::StrCat("key \"", f.name, "\": expected ", wanted, ", got ", v.text));
  }
  const std::from_chars_result r = std::from_chars(begin, end, out);
  if (r.ec != std::errc() || r.ptr != end) {
    return absl::InvalidArgumentError(
        absl::StrCat("key \"", f.name, "\": integer ", v.text, " is out of range"));
  }
  return absl::OkStatus();
}

absl::Status SetField(const Field& f, const JsonValue& v, WorkloadResult& r) {
  if (f.str != nullptr) {
    if (v.type != JsonValue::Type::kString) return WrongType(f, "a string", v);
    r.*f.str = v.text;
    return absl::OkStatus();
  }
  if (f.u64 != nullptr) return ToInteger(f, v, r.*f.u64);
  if (f.i32 != nullptr) return ToInteger(f, v, r.*f.i32);
  if (f.f64 != nullptr) return ToDouble(f, v, r.*f.f64);
  if (v.type != JsonValue::Type::kArray) return WrongType(f, "an array of numbers", v);
  std::vector<double>& out = r.*f.f64s;
  out.resize(v.items.size());
  for (size_t i = 0; i < v.items.size(); ++i) {
    absl::Status st = ToDouble(f, v.items[i], out[i]);
    if (!st.ok()) return st;
  }
  return absl::OkStatus();
}

absl::Status ToResult(const JsonValue& object, WorkloadResult& r) {
  std::set<absl::string_view> seen;
  for (const auto& [key, value] : object.members) {
    if (!seen.insert(key).second) {
      return absl::InvalidArgumentError(absl::StrCat("key \"", key, "\" given twice"));
    }
    for (const Field& f : Fields()) {
      if (key != f.name) continue;
      absl::Status st = SetField(f, value, r);
      if (!st.ok()) return st;
    }
  }
  for (const Field& f : Fields()) {
    if (f.required && seen.count(f.name) == 0) {
      return absl::InvalidArgumentError(absl::StrCat("missing required key \"", f.name, "\""));
    }
  }
  return absl::OkStatus();
}

}  // namespace

std::string ToJsonLine(const WorkloadResult& result) {
  std::string out = "{";
  AppendResultMembers(result, out);
  out += "}\n";
  return out;
}

absl::StatusOr<std::vector<WorkloadResult>> ParseJsonLines(absl::string_view text) {
  std::vector<WorkloadResult> results;
  int line_number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_number;
    if (line.find_first_not_of(" \t\r") == absl::string_view::npos) continue;
    JsonValue object;
    WorkloadResult r;
    absl::Status st = LineParser(line).ParseLine(object);
    if (st.ok()) st = ToResult(object, r);
    if (!st.ok()) {
      // Syntax errors read "line N, column C: ...", schema errors "line N: key ...".
      const bool has_column = absl::StartsWith(st.message(), "column ");
      return absl::InvalidArgumentError(
          absl::StrCat("line ", line_number, has_column ? ", " : ": ", st.message()));
    }
    results.push_back(std::move(r));
  }
  return results;
}

std::string ToJsonDocument(const std::vector<Aggregate>& aggregates,
                           const std::vector<Ratio>& ratios) {
  std::string out = "{\"results\":[";
  for (size_t i = 0; i < aggregates.size(); ++i) {
    out += i == 0 ? "\n{" : ",\n{";
    AppendResultMembers(aggregates[i].median, out);
    absl::StrAppend(&out, ",\"rounds\":", aggregates[i].rounds, "}");
  }
  out += "],\n\"ratios\":[";
  for (size_t i = 0; i < ratios.size(); ++i) {
    const Ratio& r = ratios[i];
    out += i == 0 ? "\n{\"name\":" : ",\n{\"name\":";
    AppendJsonString(r.name, out);
    out += ",\"where\":";
    AppendJsonString(r.where, out);
    out += ",\"target\":";
    if (r.has_target) {
      AppendJsonNumber(r.target, out);
    } else {
      out += "null";
    }
    absl::StrAppend(&out, ",\"higher_is_better\":", r.higher_is_better ? "true" : "false",
                    ",\"value\":");
    if (r.available) {
      AppendJsonNumber(r.value, out);
    } else {
      out += "null";
    }
    absl::StrAppend(&out, ",\"rounds\":", r.rounds, ",\"min\":");
    if (r.available && r.rounds > 0) {
      AppendJsonNumber(r.min, out);
      out += ",\"max\":";
      AppendJsonNumber(r.max, out);
    } else {
      out += "null,\"max\":null";
    }
    absl::StrAppend(&out, ",\"met\":",
                    !r.available || !r.has_target ? "null" : r.met ? "true" : "false",
                    ",\"missing\":");
    AppendJsonString(r.missing, out);
    out += "}";
  }
  out += "]}\n";
  return out;
}

}  // namespace zrpc::bench
