#include "transport/park_doors.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "transport/kernel_random.h"
#include "transport/verbs_error.h"

namespace zrpc::transport {

absl::StatusOr<std::unique_ptr<ParkDoors>> ParkDoors::Create(ibv_pd* pd, uint32_t count) {
  const size_t bytes = size_t{count} * 8;
  PageBuffer memory = AllocatePages(bytes);
  if (memory == nullptr) {
    return absl::ResourceExhaustedError(absl::StrCat("cannot allocate ", bytes, " bytes of doors"));
  }
  std::unique_ptr<ParkDoors> doors(new ParkDoors(count, std::move(memory)));
  if (pd != nullptr) {
    doors->mr_.reset(ibv_reg_mr(pd, doors->memory_.get(), bytes,
                                IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE));
    if (doors->mr_ == nullptr) {
      return VerbsError(absl::StrCat("ibv_reg_mr(", count, " park doors, ", bytes, " bytes)"),
                        errno);
    }
  }
  return doors;
}

ParkDoors::ParkDoors(uint32_t count, PageBuffer memory)
    : count_(count), memory_(std::move(memory)) {
  std::memset(memory_.get(), 0, bytes());
  free_.reserve(count);
  for (uint32_t i = count; i > 0; --i) free_.push_back(i - 1);
  armed_.assign(count, 0);
}

std::optional<ParkDoors::Lease> ParkDoors::Take() {
  if (free_.empty()) return std::nullopt;
  Lease lease;
  lease.index = free_.back();
  free_.pop_back();
  ++taken_;
  do {
    lease.token = static_cast<uint32_t>(KernelRandom64());
  } while (lease.token == 0);
  armed_[lease.index] = KernelRandom64();
  __atomic_store_n(reinterpret_cast<uint64_t*>(memory_.get()) + lease.index, armed_[lease.index],
                   __ATOMIC_RELEASE);
  return lease;
}

void ParkDoors::Rearm(uint32_t index) {
  uint64_t* door = reinterpret_cast<uint64_t*>(memory_.get()) + index;
  const uint64_t fresh = KernelRandom64();
  __atomic_exchange_n(door, fresh, __ATOMIC_ACQ_REL);
  armed_[index] = fresh;
}

void ParkDoors::Give(uint32_t index) {
  free_.push_back(index);
  --taken_;
}

ParkDoor ParkDoors::Describe(const Lease& lease) const {
  ParkDoor door;
  door.addr = reinterpret_cast<uintptr_t>(memory_.get()) + size_t{lease.index} * 8;
  door.rkey = mr_ != nullptr ? mr_->rkey : 0;
  door.token = lease.token;
  return door;
}

uint64_t ParkDoors::Read(uint32_t index) const {
  return __atomic_load_n(reinterpret_cast<const uint64_t*>(memory_.get()) + index,
                         __ATOMIC_ACQUIRE);
}

void ParkDoors::KnockForTest(uint32_t index, uint64_t value) {
  __atomic_store_n(reinterpret_cast<uint64_t*>(memory_.get()) + index, value, __ATOMIC_RELEASE);
}

}  // namespace zrpc::transport
