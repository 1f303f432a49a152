// TraceContext: a call's place in a distributed trace, as W3C Trace Context's `traceparent`
// carries it (https://www.w3.org/TR/trace-context/): a 16-byte trace id shared by every call
// of one request's tree, this call's 8-byte span id, its caller's span id and the trace flags.
// TraceInterceptor (rpc/trace_interceptor.h) reads it from a call's `traceparent` metadata and
// hands it to the handler (ServerContext::trace()).
//
// Contract: a plain value; Parse is a pure function of its argument, any thread.
#ifndef ZRPC_RPC_TRACE_CONTEXT_H_
#define ZRPC_RPC_TRACE_CONTEXT_H_

#include <array>
#include <cstdint>
#include <optional>
#include <string>

#include "absl/strings/string_view.h"

namespace zrpc {

struct TraceContext {
  std::array<uint8_t, 16> trace_id{};
  std::array<uint8_t, 8> span_id{};    // this call's span
  std::array<uint8_t, 8> parent_id{};  // the caller's span: the parent-id its traceparent named
  uint8_t flags = 0;                   // bit 0: sampled

  bool sampled() const { return (flags & 1) != 0; }

  // The ids as lowercase hex, as traceparent writes them (32 and 16 characters).
  std::string trace_id_hex() const { return Hex(trace_id.data(), trace_id.size()); }
  std::string span_id_hex() const { return Hex(span_id.data(), span_id.size()); }
  std::string parent_id_hex() const { return Hex(parent_id.data(), parent_id.size()); }

  // The traceparent a call made on behalf of this one sends: version 00, this trace, this span as
  // the parent, and of the flags the one version 00 defines, sampled (the others are zero, as the
  // specification asks of flags a sender does not know): "00-<trace id>-<span id>-0<0|1>", 55
  // characters.
  std::string traceparent() const {
    return "00-" + trace_id_hex() + "-" + span_id_hex() + (sampled() ? "-01" : "-00");
  }

  // A traceparent value as W3C Trace Context level 1 defines it: "vv-<32 hex>-<16 hex>-<2 hex>",
  // lowercase hex only; version 00 exactly 55 characters; a later version (not ff) at least that
  // with anything after a '-' ignored, as the specification asks of a version it does not know.
  // An all-zero trace id or parent id, version ff, or anything else malformed: nullopt (the
  // specification's answer is to start a new trace). The result's parent_id is the value's
  // parent-id; its span_id is left zero for the receiver to choose.
  static std::optional<TraceContext> Parse(absl::string_view value) {
    constexpr size_t kSize = 55;
    if (value.size() < kSize) return std::nullopt;
    uint8_t version;
    if (!HexBytes(value.substr(0, 2), &version) || version == 0xff) return std::nullopt;
    if (version == 0 ? value.size() != kSize : (value.size() > kSize && value[kSize] != '-')) {
      return std::nullopt;
    }
    if (value[2] != '-' || value[35] != '-' || value[52] != '-') return std::nullopt;
    TraceContext trace;
    if (!HexBytes(value.substr(3, 32), trace.trace_id.data()) ||
        !HexBytes(value.substr(36, 16), trace.parent_id.data()) ||
        !HexBytes(value.substr(53, 2), &trace.flags)) {
      return std::nullopt;
    }
    if (AllZero(trace.trace_id.data(), trace.trace_id.size()) ||
        AllZero(trace.parent_id.data(), trace.parent_id.size())) {
      return std::nullopt;
    }
    return trace;
  }

 private:
  static std::string Hex(const uint8_t* bytes, size_t size) {
    static constexpr char kDigits[] = "0123456789abcdef";
    std::string out(2 * size, '0');
    for (size_t i = 0; i < size; ++i) {
      out[2 * i] = kDigits[bytes[i] >> 4];
      out[2 * i + 1] = kDigits[bytes[i] & 15];
    }
    return out;
  }
  // `hex` (an even number of lowercase hex digits) into hex.size() / 2 bytes at `out`.
  static bool HexBytes(absl::string_view hex, uint8_t* out) {
    for (size_t i = 0; i + 1 < hex.size(); i += 2) {
      int high = Digit(hex[i]), low = Digit(hex[i + 1]);
      if (high < 0 || low < 0) return false;
      out[i / 2] = static_cast<uint8_t>(high << 4 | low);
    }
    return hex.size() % 2 == 0;
  }
  static int Digit(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;  // uppercase is not allowed
  }
  static bool AllZero(const uint8_t* bytes, size_t size) {
    for (size_t i = 0; i < size; ++i) {
      if (bytes[i] != 0) return false;
    }
    return true;
  }
};

}  // namespace zrpc

#endif  // ZRPC_RPC_TRACE_CONTEXT_H_
