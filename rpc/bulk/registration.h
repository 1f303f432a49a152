// The runtime's side of registered application memory: Registration, one memory region and the
// device it belongs to, and BulkAccess, the runtime's way into what OutgoingBulk and
// BulkDestination keep private (rpc/bulk.h). The public handle is RegisteredMemory
// (rpc/registered_memory.h); this header is the runtime's, and holds the transport types that
// header must not show its users.
#ifndef ZRPC_RPC_BULK_REGISTRATION_H_
#define ZRPC_RPC_BULK_REGISTRATION_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <utility>

#include "rpc/bulk.h"
#include "transport/device.h"

namespace zrpc {

namespace internal {

// One registration of application memory: its memory region and the device (protection domain)
// the region belongs to, destroyed in that order. Shared by the application's handle and every
// payload in flight from it.
class Registration {
 public:
  Registration(std::shared_ptr<transport::Device> device,
               std::unique_ptr<transport::MemoryRegion> region)
      : device_(std::move(device)), region_(std::move(region)) {}

  uint8_t* data() const { return const_cast<uint8_t*>(region_->data()); }
  size_t size() const { return region_->size(); }
  uint32_t lkey() const { return region_->lkey(); }
  // For binding windows over a range of it (transport/exposures.h).
  const transport::MemoryRegion& region() const { return *region_; }
  const transport::Device* device() const { return device_.get(); }

 private:
  std::shared_ptr<transport::Device> device_;
  std::unique_ptr<transport::MemoryRegion> region_;
};

// The runtime's access to what OutgoingBulk keeps private.
class BulkAccess {
 public:
  static const Registration* registration(const OutgoingBulk& bulk) {
    return bulk.registration_.get();
  }
  // Makes `after` run right after the payload's own release (or alone, when it has none).
  static void ChainRelease(OutgoingBulk& bulk, std::function<void()> after);
  static OutgoingBulk Make(std::shared_ptr<const Registration> registration, const uint8_t* data,
                           size_t size, std::function<void()> release);
  static BulkDestination MakeDestination(std::shared_ptr<const Registration> registration,
                                         uint8_t* data, size_t size);
  static const Registration* registration(const BulkDestination& destination) {
    return destination.registration_.get();
  }
};

}  // namespace internal

}  // namespace zrpc

#endif  // ZRPC_RPC_BULK_REGISTRATION_H_
