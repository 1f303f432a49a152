#include "transport/memory_window.h"

#include <errno.h>

#include <cstring>

#include "absl/status/status.h"
#include "transport/kernel_random.h"
#include "transport/verbs_error.h"

namespace zrpc::transport {

bool SupportsType2Windows(const ibv_device_attr& attr) {
  const uint64_t flags = attr.device_cap_flags;
  return attr.max_mw > 0 &&
         (flags & (IBV_DEVICE_MEM_WINDOW_TYPE_2A | IBV_DEVICE_MEM_WINDOW_TYPE_2B)) != 0;
}

uint8_t NextKeyByte(uint8_t previous) {
  for (;;) {
    const uint8_t key = KernelRandomByte();
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
