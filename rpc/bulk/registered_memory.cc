// RegisteredMemory (rpc/registered_memory.h) and BulkAccess: application memory registered once,
// and payloads made from it.

#include "rpc/registered_memory.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "rpc/bulk/registration.h"

namespace zrpc {
namespace internal {

void BulkAccess::ChainRelease(OutgoingBulk& bulk, std::function<void()> after) {
  if (!bulk.release_) {
    bulk.release_ = std::move(after);
    return;
  }
  bulk.release_ = [first = std::move(bulk.release_), after = std::move(after)] {
    first();
    after();
  };
}

OutgoingBulk BulkAccess::Make(std::shared_ptr<const Registration> registration, const uint8_t* data,
                              size_t size, std::function<void()> release) {
  OutgoingBulk bulk(data, size, std::move(release));
  bulk.registration_ = std::move(registration);
  return bulk;
}

BulkDestination BulkAccess::MakeDestination(std::shared_ptr<const Registration> registration,
                                            uint8_t* data, size_t size) {
  BulkDestination destination;
  destination.data_ = data;
  destination.size_ = size;
  destination.registration_ = std::move(registration);
  return destination;
}

}  // namespace internal

RegisteredMemory::RegisteredMemory(std::shared_ptr<const internal::Registration> registration)
    : registration_(std::move(registration)) {}

uint8_t* RegisteredMemory::data() const { return registration_ ? registration_->data() : nullptr; }

size_t RegisteredMemory::size() const { return registration_ ? registration_->size() : 0; }

absl::StatusOr<RegisteredMemory> RegisteredMemory::Register(
    std::shared_ptr<transport::Device> device, void* data, size_t size) {
  if (data == nullptr || size == 0) {
    return absl::InvalidArgumentError("RegisterMemory: the range is null or empty");
  }
  absl::StatusOr<std::unique_ptr<transport::MemoryRegion>> region =
      device->RegisterMemory(data, size);
  if (!region.ok()) {
    return absl::Status(region.status().code(),
                        absl::StrCat("RegisterMemory: ", region.status().message()));
  }
  return RegisteredMemory(
      std::make_shared<const internal::Registration>(std::move(device), *std::move(region)));
}

namespace {

absl::Status CheckRange(const internal::Registration* registration, const char* what, size_t offset,
                        size_t size) {
  if (registration == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("RegisteredMemory::", what, " on an empty handle"));
  }
  if (size == 0 || offset > registration->size() || size > registration->size() - offset) {
    return absl::InvalidArgumentError(absl::StrCat("RegisteredMemory::", what, "(", offset, ", ",
                                                   size,
                                                   "): not a non-empty "
                                                   "range inside the ",
                                                   registration->size(), " registered bytes"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<OutgoingBulk> RegisteredMemory::Bulk(size_t offset, size_t size,
                                                    std::function<void()> release) const {
  if (absl::Status s = CheckRange(registration_.get(), "Bulk", offset, size); !s.ok()) return s;
  return internal::BulkAccess::Make(registration_, registration_->data() + offset, size,
                                    std::move(release));
}

absl::StatusOr<BulkDestination> RegisteredMemory::Destination(size_t offset, size_t size) const {
  if (absl::Status s = CheckRange(registration_.get(), "Destination", offset, size); !s.ok()) {
    return s;
  }
  return internal::BulkAccess::MakeDestination(registration_, registration_->data() + offset, size);
}

}  // namespace zrpc
