// Metadata: ordered key/value pairs that travel with a call, beside its messages (gRPC's
// metadata, brpc's user fields). A client sends them with a call (CallOptions::metadata) and a
// handler reads them (ServerContext::client_metadata()); a handler sends trailing metadata back
// with its answer (ServerContext::AddTrailingMetadata), which the caller reads once the call has
// ended (CallOptions::trailing_metadata). Unary calls and every kind of stream carry both.
//
// Contract. Keys are 1 to 255 bytes of lowercase letters, digits, '-', '_' and '.' (gRPC's rule,
// so the same keys work in both), and may repeat: order is kept. A key ending in "-bin" takes
// any bytes as its value; any other key's value is printable ASCII (0x20 to 0x7E). Keys starting
// with "zrpc-" are the runtime's. A call's metadata, encoded, is at most kMaxSize bytes
// each way (an entry costs its key, its value and 4 bytes): it travels in the call's first
// message, inside one receive slot, so no call with metadata costs a round trip more than one
// without, and a call with none costs nothing on the wire (rpc/WIRE.md, "Metadata"). Add refuses
// what breaks a rule, with the reason, and leaves the metadata as it was. Not thread-safe: one
// thread builds it, then any thread may read it.
#ifndef ZRPC_RPC_METADATA_H_
#define ZRPC_RPC_METADATA_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace zrpc {

class Metadata {
 public:
  // The most a call's metadata may take encoded, each way: 3 KiB, which leaves room in a default
  // 4 KiB receive slot for the headers and a small message beside it. (gRPC's default is 8 KiB;
  // a W3C traceparent takes 55 bytes, a JSON web token one or two KiB.)
  static constexpr size_t kMaxSize = 3072;
  // What an entry costs beyond its key and value on the wire.
  static constexpr size_t kEntryOverhead = 4;
  static constexpr size_t kMaxKey = 255;

  struct Entry {
    std::string key;
    std::string value;
    bool operator==(const Entry& other) const { return key == other.key && value == other.value; }
  };

  // Appends `key` with `value`. kInvalidArgument for a key or value that breaks the rules above
  // (a "zrpc-" key included), kResourceExhausted when the metadata would exceed kMaxSize.
  absl::Status Add(absl::string_view key, absl::string_view value) {
    if (absl::Status valid = CheckKey(key); !valid.ok()) return valid;
    if (key.substr(0, 5) == "zrpc-") {
      return absl::InvalidArgumentError(
          absl::StrCat("metadata key \"", key, "\": keys starting with zrpc- are the runtime's"));
    }
    if (absl::Status valid = CheckValue(key, value); !valid.ok()) return valid;
    const size_t size = encoded_size_ + kEntryOverhead + key.size() + value.size();
    if (size > kMaxSize) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "metadata key \"", key, "\": with its ", value.size(), "-byte value the call's metadata ",
          "would take ", size, " bytes encoded, more than the ", kMaxSize, " a call carries"));
    }
    entries_.push_back(Entry{std::string(key), std::string(value)});
    encoded_size_ = size;
    return absl::OkStatus();
  }

  // The first value of `key`, or null.
  const std::string* Find(absl::string_view key) const {
    for (const Entry& entry : entries_) {
      if (entry.key == key) return &entry.value;
    }
    return nullptr;
  }
  // Every value of `key`, in order.
  std::vector<absl::string_view> FindAll(absl::string_view key) const {
    std::vector<absl::string_view> values;
    for (const Entry& entry : entries_) {
      if (entry.key == key) values.push_back(entry.value);
    }
    return values;
  }

  const std::vector<Entry>& entries() const { return entries_; }
  bool empty() const { return entries_.empty(); }
  size_t size() const { return entries_.size(); }
  // Bytes on the wire (at most kMaxSize).
  size_t encoded_size() const { return encoded_size_; }
  void Clear() {
    entries_.clear();
    encoded_size_ = 0;
  }
  bool operator==(const Metadata& other) const { return entries_ == other.entries_; }
  bool operator!=(const Metadata& other) const { return !(*this == other); }

  // The rules, for the runtime's decoder (which also takes "zrpc-" keys) and for callers who
  // want to check first.
  static absl::Status CheckKey(absl::string_view key) {
    if (key.empty() || key.size() > kMaxKey) {
      return absl::InvalidArgumentError(absl::StrCat("a metadata key has ", key.size(),
                                                     " bytes (1 to ", kMaxKey, " are allowed)"));
    }
    for (char c : key) {
      if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '_' || c == '.')) {
        return absl::InvalidArgumentError(
            absl::StrCat("a metadata key has the byte 0x",
                         absl::Hex(static_cast<unsigned char>(c), absl::kZeroPad2),
                         ": only lowercase letters, digits, '-', '_' and '.' are allowed"));
      }
    }
    return absl::OkStatus();
  }
  static absl::Status CheckValue(absl::string_view key, absl::string_view value) {
    if (key.size() >= 4 && key.substr(key.size() - 4) == "-bin") return absl::OkStatus();
    for (char c : value) {
      if (c < 0x20 || c > 0x7e) {
        return absl::InvalidArgumentError(absl::StrCat(
            "metadata key \"", key,
            "\": its value has a byte that is not printable ASCII; binary values go under keys "
            "ending in -bin"));
      }
    }
    return absl::OkStatus();
  }

 private:
  // The runtime's decoder appends entries it has checked already (a block holds at most kMaxSize
  // bytes), keys starting with "zrpc-" included.
  friend absl::Status DecodeMetadataBlock(absl::Span<const uint8_t> entries, Metadata* metadata,
                                          absl::Status* status);
  void AddUnchecked(absl::string_view key, absl::string_view value) {
    entries_.push_back(Entry{std::string(key), std::string(value)});
    encoded_size_ += kEntryOverhead + key.size() + value.size();
  }

  std::vector<Entry> entries_;
  size_t encoded_size_ = 0;
};

}  // namespace zrpc

#endif  // ZRPC_RPC_METADATA_H_
