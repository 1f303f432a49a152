#include "transport/park_doors.h"

#include <cstring>
#include <random>

#include "absl/strings/str_cat.h"
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
  std::random_device seed;
  token_state_ = (uint64_t{seed()} << 32) | seed();
}

std::optional<ParkDoors::Lease> ParkDoors::Take() {
  if (free_.empty()) return std::nullopt;
  Lease lease;
  lease.index = free_.back();
  free_.pop_back();
  ++taken_;
  __atomic_store_n(reinterpret_cast<uint64_t*>(memory_.get()) + lease.index, 0, __ATOMIC_RELAXED);
  // splitmix64: tokens that do not follow from one another (a peer that saw its own cannot tell
  // another's), never 0.
  do {
    uint64_t z = (token_state_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    lease.token = static_cast<uint32_t>((z ^ (z >> 31)) >> 32);
  } while (lease.token == 0);
  return lease;
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
