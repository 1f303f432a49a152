// Bulk payloads: bytes that travel beside an rpc's message instead of inside it.
//
// A protobuf `bytes` field is copied twice on its way: serialized into the send slot, then parsed
// out of the receive buffer into a std::string. For a megabyte that is most of the call's cost.
// A method marked bulk in its .proto (see proto/zrpc/options.proto)
//
//   rpc Put(PutRequest) returns (PutReply) { option (zrpc.method).request_bulk = true; }
//
// carries one payload of raw bytes beside the message, like brpc's attachments or Mercury's bulk
// handles, but declared in the .proto so the generated signatures say so. The runtime sends it by
// RDMA WRITE straight from the sender's memory into memory the receiver registered and
// advertised (transport/arena.h), and the receiver reads it in place there.
//
//   OutgoingBulk  what a sender hands over: borrowed bytes plus an optional release callback.
//                 Bytes in memory the caller registered in advance (rpc/registered_memory.h:
//                 RegisteredMemory::Bulk) are sent by the NIC straight from where they are, with
//                 no copy; any other bytes are copied once into the runtime's registered staging
//                 memory (rpc/bulk/staging.h). The channel's and server's stats count both.
//   IncomingBulk  what a receiver gets: a read-only view of the payload where it landed. Holding
//                 it holds that receive memory, and the peer's later payloads queue behind it (the
//                 receive arena frees in ring order), so release it promptly: destroy it, Reset it,
//                 or move it somewhere that does. Release it before the channel or server it
//                 came from is destroyed: it points into that runtime's memory.
//                 Read-only for the receiver, but NOT immutable: until it is released, the sender
//                 can still RDMA WRITE into it (the receive memory is exposed under one key that
//                 covers all of it; per-call scoping does not exist yet). A handler that validates
//                 a payload must not trust it to stay as validated: copy out what it checks, or
//                 check what it copied (transport/README.md, "what a peer can do").
//
// Both are move-only and release exactly once. An empty payload (size 0) is valid and sends
// nothing but the message. A payload that fits the receiver's receive memory (its advertised
// arena) is written there, and one that must wait for space waits at most until the call's
// deadline; a larger one is pulled by the receiver with RDMA READ into memory it allocates, up
// to its max_bulk_size (rpc/WIRE.md, "Pulled payloads"), and then read in place there the same
// way (an IncomingBulk either way).
#ifndef ZRPC_RPC_BULK_H_
#define ZRPC_RPC_BULK_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>

#include "absl/base/attributes.h"
#include "absl/strings/string_view.h"

namespace zrpc {

namespace internal {
class Registration;  // rpc/registered_memory.h
class BulkAccess;
}  // namespace internal

// Bytes to send as a bulk payload. They must stay alive and unchanged until `release` runs.
// Without a release callback:
//   - from a client, until the call ends (the blocking call returns or `done` runs): the channel
//     releases the payload before `done` on every path, deadline and failure included, so a
//     deadline never lets the caller reuse bytes the NIC may still read;
//   - from a server (a handler's *response_bulk), until the server is destroyed: the handler
//     returns before the bytes leave, so memory that dies sooner needs a release callback
//     (or OutgoingBulk::Copy);
//   - on a stream message, either side's (rpc/streaming.h, "Bulk payloads"), until the channel
//     or server is destroyed: the payload is exposed until the peer has read it, which the
//     call's end does not wait for.
// Bytes sent with no copy (from RegisteredMemory) are read by the NIC until the RDMA WRITE
// completes, so `release` runs later than for staged bytes: on a runtime thread, once the peer's
// NIC has them. A client's call still ends (its `done` runs) only after that.
class OutgoingBulk {
 public:
  OutgoingBulk() = default;
  // `release` (may be empty) runs once the runtime no longer reads `data`.
  OutgoingBulk(const void* data, size_t size, ::std::function<void()> release = nullptr)
      : data_(static_cast<const uint8_t*>(data)), size_(size), release_(::std::move(release)) {}
  // Owns a string's bytes (convenient, not free: it is one allocation the runtime may stage).
  static OutgoingBulk Copy(::std::string bytes) {
    auto* owned = new ::std::string(::std::move(bytes));
    return OutgoingBulk(owned->data(), owned->size(), [owned] { delete owned; });
  }

  // A moved-from payload is empty. Most calls carry none, and a payload is moved and destroyed
  // about a dozen times per call on its way down the layers: an empty one costs a few
  // instructions each time (the callback and registration are touched only when set).
  OutgoingBulk(OutgoingBulk&& other) noexcept
      : data_(::std::exchange(other.data_, nullptr)), size_(::std::exchange(other.size_, 0)) {
    if (other.owns_something()) TakeFrom(other);
  }
  OutgoingBulk& operator=(OutgoingBulk&& other) noexcept {
    if (this != &other) {
      Reset();
      data_ = ::std::exchange(other.data_, nullptr);
      size_ = ::std::exchange(other.size_, 0);
      if (other.owns_something()) TakeFrom(other);
    }
    return *this;
  }
  OutgoingBulk(const OutgoingBulk&) = delete;
  OutgoingBulk& operator=(const OutgoingBulk&) = delete;
  ~OutgoingBulk() {
    if (owns_something()) Release();
  }

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }

  // Whether the bytes lie in memory registered in advance (RegisteredMemory::Bulk), so the NIC
  // can read them where they are.
  bool registered() const { return registration_ != nullptr; }

  // Runs the release callback (once) and leaves the payload empty.
  void Reset() {
    data_ = nullptr;
    size_ = 0;
    if (owns_something()) Release();
  }

 private:
  friend class internal::BulkAccess;
  bool owns_something() const { return release_ != nullptr || registration_ != nullptr; }
  ABSL_ATTRIBUTE_NOINLINE void TakeFrom(OutgoingBulk& other) {
    release_ = ::std::move(other.release_);
    other.release_ = nullptr;
    registration_ = ::std::move(other.registration_);
  }
  ABSL_ATTRIBUTE_NOINLINE void Release() {
    if (release_) {
      ::std::function<void()> release = ::std::move(release_);
      release_ = nullptr;
      release();
    }
    registration_.reset();  // after the release: the registration may outlive the user's handle
  }

  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
  ::std::function<void()> release_;
  // The registration the bytes lie in, kept alive (and registered) until the release.
  ::std::shared_ptr<const internal::Registration> registration_;
};

// Where a response's bulk payload should land: a range of memory the caller registered
// (RegisteredMemory::Destination), given as CallOptions::response_destination. The payload is
// then read by this side's NIC straight into that range (no copy on either side), and the
// call's IncomingBulk views it there; releasing that IncomingBulk gives nothing back (the
// memory is the caller's). The call ends (returns, or runs `done`) only once nothing writes into
// the range any more, deadline and cancel included. A payload larger than the range fails the
// call with kResourceExhausted, and nothing is written. Copyable: it keeps the registration
// alive, not the bytes, which the caller keeps until the call ends.
class BulkDestination {
 public:
  BulkDestination() = default;
  uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }

 private:
  friend class internal::BulkAccess;
  uint8_t* data_ = nullptr;
  size_t size_ = 0;
  ::std::shared_ptr<const internal::Registration> registration_;
};

// Where a server puts a request payload it pulls (ServerOptions::place_request_payload): a
// destination in memory the application registered on the server, and what to run once the
// runtime is done with it (the handler's IncomingBulk released, or the call ended without it,
// or the READ failed). `release` may be empty.
struct PayloadPlacement {
  BulkDestination destination;
  ::std::function<void()> release;
};

// The runtime's side of an IncomingBulk: gives the receive memory back. ReleaseBulk may be called
// from any thread (a handler's, a DoneCallback on a runtime thread, the application's), also
// after the connection the payload came on has failed, so it must be thread-safe, must not
// block, and must keep the receive memory mapped until every payload in it is released. The
// releaser itself must outlive every IncomingBulk it hands out.
class BulkReleaser {
 public:
  virtual void ReleaseBulk(uint64_t token) = 0;

 protected:
  ~BulkReleaser() = default;
};

// A received bulk payload, read in place; see the top of this file for why to release it soon.
class IncomingBulk {
 public:
  IncomingBulk() = default;
  // For the runtime: `releaser->ReleaseBulk(token)` runs once, when this is released.
  IncomingBulk(const uint8_t* data, size_t size, BulkReleaser* releaser, uint64_t token)
      : data_(data), size_(size), releaser_(releaser), token_(token) {}

  IncomingBulk(IncomingBulk&& other) noexcept
      : data_(::std::exchange(other.data_, nullptr)),
        size_(::std::exchange(other.size_, 0)),
        releaser_(::std::exchange(other.releaser_, nullptr)),
        token_(::std::exchange(other.token_, 0)) {}
  IncomingBulk& operator=(IncomingBulk&& other) noexcept {
    if (this != &other) {
      Reset();
      data_ = ::std::exchange(other.data_, nullptr);
      size_ = ::std::exchange(other.size_, 0);
      releaser_ = ::std::exchange(other.releaser_, nullptr);
      token_ = ::std::exchange(other.token_, 0);
    }
    return *this;
  }
  IncomingBulk(const IncomingBulk&) = delete;
  IncomingBulk& operator=(const IncomingBulk&) = delete;
  ~IncomingBulk() { Reset(); }

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  ::absl::string_view view() const {
    return ::absl::string_view(reinterpret_cast<const char*>(data_), size_);
  }

  // Gives the receive memory back (once) and leaves the payload empty.
  void Reset() {
    data_ = nullptr;
    size_ = 0;
    if (BulkReleaser* releaser = ::std::exchange(releaser_, nullptr)) releaser->ReleaseBulk(token_);
  }

 private:
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
  BulkReleaser* releaser_ = nullptr;
  uint64_t token_ = 0;
};

}  // namespace zrpc

#endif  // ZRPC_RPC_BULK_H_
