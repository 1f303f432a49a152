// RegisteredMemory: a buffer of the application's, registered with the NIC once, whose bytes
// bulk payloads are sent from with no copy.
//
//   auto memory = channel->RegisterMemory(tensor.data(), tensor.size());   // once
//   for (...) {
//     absl::StatusOr<zrpc::OutgoingBulk> bulk = memory->Bulk(0, tensor.size());
//     stub.Put(key, *std::move(bulk), &reply, options);                    // no copy, no staging
//   }
//
// Why register. The NIC reads only registered memory. An OutgoingBulk over ordinary bytes is
// copied once into the runtime's staging memory (rpc/bulk/staging.h): cheap for kilobytes, most of
// the cost for megabytes. Registering pins the pages and costs a system call (tens of
// microseconds, more per gigabyte), so it is done once per buffer, not per call: the same buffer
// sent a thousand times is registered once. Registration counts against RLIMIT_MEMLOCK for
// non-root processes (`ulimit -l`); the error says so.
//
// Where it works. A registration belongs to one device and protection domain: the one of the
// channel or server that made it. Channels and servers with the same device configuration and
// slot options share a device (rpc/common/shared_device.h), so memory registered on one can be sent
// from the others. A payload from memory registered on another device is staged like any other
// bytes, and a warning is logged once per connection: still correct, no longer zero-copy, and
// visible in the stats (bulk_bytes_staged against bulk_bytes_zero_copy).
//
// Lifetime. The handle is move-only; the registration it owns lasts until the handle and every
// OutgoingBulk made from it are gone, so destroying the handle while payloads are in flight is
// safe: the memory is deregistered after the last WRITE from it completes. The application
// keeps the bytes themselves alive and unchanged until each payload's release (bulk.h): the NIC
// reads them during the WRITE. A registration also keeps its device alive, so it may outlive the
// channel or server that made it.
//
// Remote access. The memory is registered for local access only (the NIC reads it to send, and
// writes into it to receive: Destination); no remote key for it is ever given to a peer. A
// payload larger than the peer's arena is exposed for one call by a registration of its own
// (rpc/WIRE.md, "Pulled payloads").
#ifndef ZRPC_RPC_REGISTERED_MEMORY_H_
#define ZRPC_RPC_REGISTERED_MEMORY_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <utility>

#include "absl/status/statusor.h"
#include "rpc/bulk.h"

namespace zrpc {

namespace transport {
class Device;  // transport/device.h
}

namespace internal {
class Registration;  // rpc/bulk/registration.h
}

class RegisteredMemory {
 public:
  RegisteredMemory() = default;
  RegisteredMemory(RegisteredMemory&&) noexcept = default;
  RegisteredMemory& operator=(RegisteredMemory&&) noexcept = default;
  RegisteredMemory(const RegisteredMemory&) = delete;
  RegisteredMemory& operator=(const RegisteredMemory&) = delete;

  // Registers [data, data + size) on `device`. kInvalidArgument for a null or empty range;
  // the driver's error otherwise (ENOMEM/EPERM name RLIMIT_MEMLOCK). Channels and servers call
  // this (ClientChannel::RegisterMemory, Server::RegisterMemory).
  static absl::StatusOr<RegisteredMemory> Register(std::shared_ptr<transport::Device> device,
                                                   void* data, size_t size);

  uint8_t* data() const;
  size_t size() const;
  bool valid() const { return registration_ != nullptr; }

  // A payload of the `size` bytes at `offset`, sent with no copy; `release` (may be empty) runs
  // once the runtime no longer reads them (bulk.h). kInvalidArgument when the range is empty or
  // does not lie inside this memory, or the handle is empty (moved from).
  absl::StatusOr<OutgoingBulk> Bulk(size_t offset, size_t size,
                                    std::function<void()> release = nullptr) const;
  // The `size` bytes at `offset` as the place a response payload lands (CallOptions::
  // response_destination). The same range checks as Bulk.
  absl::StatusOr<BulkDestination> Destination(size_t offset, size_t size) const;

 private:
  explicit RegisteredMemory(std::shared_ptr<const internal::Registration> registration);
  std::shared_ptr<const internal::Registration> registration_;
};

}  // namespace zrpc

#endif  // ZRPC_RPC_REGISTERED_MEMORY_H_
