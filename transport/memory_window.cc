#include "transport/memory_window.h"

#include <errno.h>
#include <sys/random.h>

#include <cstring>

#include "absl/status/status.h"
#include "transport/verbs_error.h"

namespace zrpc::transport {
namespace {

// Random bytes from the kernel, taken a block at a time: one getrandom per kBlock binds.
class KeyBytes {
 public:
  uint8_t Next() {
    if (next_ == kBlock) Refill();
    return block_[next_++];
  }

 private:
  static constexpr size_t kBlock = 64;
  void Refill() {
    size_t got = 0;
    while (got < kBlock) {
      const ssize_t n = getrandom(block_ + got, kBlock - got, 0);
      if (n > 0) {
        got += static_cast<size_t>(n);
      } else if (n < 0 && errno != EINTR) {
        break;  // no kernel source (never on Linux >= 3.17): what the block held stays
      }
    }
    next_ = 0;
  }
  uint8_t block_[kBlock] = {};
  size_t next_ = kBlock;
};

}  // namespace

bool SupportsType2Windows(const ibv_device_attr& attr) {
  const uint64_t flags = attr.device_cap_flags;
  return attr.max_mw > 0 &&
         (flags & (IBV_DEVICE_MEM_WINDOW_TYPE_2A | IBV_DEVICE_MEM_WINDOW_TYPE_2B)) != 0;
}

uint8_t NextKeyByte(uint8_t previous) {
  thread_local KeyBytes bytes;
  for (;;) {
    const uint8_t key = bytes.Next();
    if (key != previous) return key;
  }
}

absl::StatusOr<std::unique_ptr<MemoryWindow>> MemoryWindow::Allocate(ibv_pd* pd) {
  MwOwner mw(ibv_alloc_mw(pd, IBV_MW_TYPE_2));
  if (mw == nullptr) {
    const int err = errno;
    if (err == EOPNOTSUPP) {
      return absl::UnimplementedError(
          "ibv_alloc_mw: this device has no type-2 memory windows (EOPNOTSUPP)");
    }
    return VerbsError("ibv_alloc_mw", err);
  }
  return std::unique_ptr<MemoryWindow>(new MemoryWindow(std::move(mw)));
}

uint32_t MemoryWindow::PrepareBind(const ibv_mr& mr, uint64_t addr, uint64_t length,
                                   unsigned int access, uint64_t wr_id, ibv_send_wr* wr) {
  const uint32_t key = (rkey_ & ~uint32_t{0xff}) | NextKeyByte(static_cast<uint8_t>(rkey_));
  std::memset(wr, 0, sizeof(*wr));
  wr->wr_id = wr_id;
  wr->opcode = IBV_WR_BIND_MW;
  wr->bind_mw.mw = mw_.get();
  wr->bind_mw.rkey = key;
  wr->bind_mw.bind_info.mr = const_cast<ibv_mr*>(&mr);
  wr->bind_mw.bind_info.addr = addr;
  wr->bind_mw.bind_info.length = length;
  wr->bind_mw.bind_info.mw_access_flags = access;
  pending_key_ = key;
  return key;
}

void MemoryWindow::BindPosted() {
  // Verbs update ibv_mw::rkey after a type-1 bind (ibv_bind_mw) only; after a type-2 bind posted as
  // a work request the consumer does, and the next bind must name the window by it (rxe's kernel
  // refuses one that names an older key).
  mw_->rkey = rkey_ = pending_key_;
}

void MemoryWindow::PrepareInvalidate(uint64_t wr_id, ibv_send_wr* wr) const {
  std::memset(wr, 0, sizeof(*wr));
  wr->wr_id = wr_id;
  wr->opcode = IBV_WR_LOCAL_INV;
  wr->invalidate_rkey = rkey_;
}

}  // namespace zrpc::transport
