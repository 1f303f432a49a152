// MemoryWindow: how a region registered once opens part of itself to one peer, and closes again.
//
// Why. Memory registered once and shared by many connections (a poller's arena pool) cannot be
// exposed by its memory region's own rkey: that key works from every queue pair of the protection
// domain, so one peer could write into another's space. A type-2 memory window is bound to one
// QP by a work request on that QP's send queue; its rkey then works only for RDMA arriving on that
// QP, only within the bound range and only for the access bound. A key used on any other QP is a
// remote access error for the QP that used it: the user of a foreign key loses its own connection
// and the window's owner is unaffected (tools/probes/srq_mw_probe.c saw this on rxe;
// tests/transport/memory_window_test.cc checks it). Invalidating the window (a LOCAL_INV on its QP,
// or a peer's SEND_WITH_INV) or deallocating it ends the key.
//
// Keys. The upper 24 bits of a window's rkey name the window on the device and never change; the
// low byte is the consumer's key, set by every bind. Each bind here draws a fresh random key byte
// (from getrandom), never the one just used, so a key seen on the wire dies with its window's
// next invalidation and the next one is not its successor: rxe's keys are otherwise predictable
// from the previous one (ReDMArk, USENIX Security 2021). A guess has a 1-in-255 chance and costs
// the guesser its connection.
//
// Ranges: bind a window over a whole registered region, and register each range to be opened on
// its own. rxe (Linux 6.1, checked by memory_window_test while it was written) checks an access
// through a window against the range of the region beneath it, not the window's own: a window over
// 4 KiB of a 64 KiB region let its QP write a byte past the window's end. A region per opened
// range makes both checks the same on every device; registrations are counted, not sized, so the
// bytes registered do not change.
//
// Requirements. The device must offer type-2 windows (SupportsType2Windows: IBV_DEVICE_MEM_WINDOW
// _TYPE_2A or _2B, max_mw above zero); the memory region must be registered with
// IBV_ACCESS_MW_BIND, and with IBV_ACCESS_LOCAL_WRITE for a window that grants remote writes. The
// region needs no remote access of its own: its rkey then opens nothing.
//
// A MemoryWindow only prepares work requests; the owner of the QP posts them, on the QP's send
// queue, where they take a send-queue entry and, signalled, a completion-queue entry like any
// other request, and complete in order with it (a bind completes before a later SEND tells the
// peer the key). Not thread-safe: one owner, as for the QP.
#ifndef ZRPC_TRANSPORT_MEMORY_WINDOW_H_
#define ZRPC_TRANSPORT_MEMORY_WINDOW_H_

#include <infiniband/verbs.h>

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "transport/verbs_owners.h"

namespace zrpc::transport {

// Whether `attr` (ibv_query_device) offers type-2 memory windows.
bool SupportsType2Windows(const ibv_device_attr& attr);

// A random byte other than `previous`: a window's next key byte.
uint8_t NextKeyByte(uint8_t previous);

class MemoryWindow {
 public:
  // Allocates an unbound type-2 window on `pd`. kUnimplemented when the device has none
  // (EOPNOTSUPP), else the verbs error.
  static absl::StatusOr<std::unique_ptr<MemoryWindow>> Allocate(ibv_pd* pd);
  MemoryWindow(const MemoryWindow&) = delete;
  MemoryWindow& operator=(const MemoryWindow&) = delete;
  ~MemoryWindow() = default;

  // Fills `wr` (all of it: a zeroed request with next == nullptr) to bind this window over
  // [addr, addr + length) of `mr` with `access` (IBV_ACCESS_REMOTE_WRITE and/or _READ), under a
  // fresh key. Returns that key: the peer may use it once the bind has been posted (a message
  // posted after it on the same QP tells the peer, and the QP runs them in order). The window must
  // not be bound (never bound, or invalidated since). Call BindPosted once `wr` is posted.
  uint32_t PrepareBind(const ibv_mr& mr, uint64_t addr, uint64_t length, unsigned int access,
                       uint64_t wr_id, ibv_send_wr* wr);
  // The bind PrepareBind filled in has been posted: its key is the window's from now on (a
  // bind names the window by its current key, so this must come after the post, not before).
  void BindPosted();
  // Fills `wr` to invalidate the key of the last bind (IBV_WR_LOCAL_INV): once it completes, the
  // key opens nothing, and the window may be bound again.
  void PrepareInvalidate(uint64_t wr_id, ibv_send_wr* wr) const;

  // The key of the last bind posted (before any: the window's key from the device).
  uint32_t rkey() const { return rkey_; }
  ibv_mw* get() const { return mw_.get(); }

 private:
  explicit MemoryWindow(MwOwner mw) : mw_(std::move(mw)), rkey_(mw_->rkey) {}
  MwOwner mw_;
  uint32_t rkey_;
  uint32_t pending_key_ = 0;  // of the bind prepared and not yet posted
};

}  // namespace zrpc::transport

#endif  // ZRPC_TRANSPORT_MEMORY_WINDOW_H_
