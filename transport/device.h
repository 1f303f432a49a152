// Device: the RDMA device zrpc uses, chosen without configuration, and what is shared on it.
//
// Selection (SelectDevice). With nothing configured, zrpc takes the first ACTIVE port of the
// first device, and the address that port carries:
//  - RoCE (link layer Ethernet): the RoCE v2 GID holding an IPv4-mapped address (else a global
//    IPv6 one). The GID *is* the address, so the choice cannot disagree with what librdmacm
//    resolves when connecting from that address; picking a GID by a fixed index is the most
//    reported RoCE failure (../shared/notes/rdma-pitfalls.md).
//  - InfiniBand: the port's LID identifies it, and the address is the IPv4 address of the IPoIB
//    interface bound to GID 0 (librdmacm needs an IP address to resolve a path).
// Every part can be forced (DeviceConfig, from ZRPC_RDMA_DEVICE / _PORT / _GID_INDEX / _ADDR):
// an address selects the device and port that own it; a GID index selects the address it holds.
// What was chosen is printed once per process to stderr, so a misrouted deployment can be read
// from the log.
//
// Sharing (Device). librdmacm opens every device once per process and binds each cm id to its own
// ibv_context for that device; a protection domain must be allocated on that same context, so the
// Device borrows librdmacm's context (rdma_get_devices) instead of opening its own. The Device
// owns, in creation order: the device list reference, one protection domain, and one SlotPool.
// Every Poller, Listener and Connection on the device uses them, and must be destroyed first. It
// also holds the context's reader of asynchronous events (async_events.h), shared with every other
// Device on the context.
#ifndef ZRPC_TRANSPORT_DEVICE_H_
#define ZRPC_TRANSPORT_DEVICE_H_

#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "transport/async_events.h"
#include "transport/device_config.h"
#include "transport/slot_pool.h"
#include "transport/verbs_owners.h"

namespace zrpc::transport {

struct DeviceSelection {
  std::string device;         // verbs device name, e.g. "mlx5_0" or "rxe0"
  int port = 0;               // 1-based
  bool infiniband = false;    // link layer: InfiniBand (true) or Ethernet / RoCE (false)
  int gid_index = -1;         // RoCE: the RoCE v2 GID used; InfiniBand: 0
  std::string gid;            // that GID, as an IPv6-style address
  uint16_t lid = 0;           // InfiniBand only
  int active_mtu = 0;         // bytes
  uint32_t max_msg_size = 0;  // the largest single RDMA operation the port takes (rxe: 8 MiB)
  std::string addr;           // the IP address connections are made from and listened on

  std::string ToString() const;
};

// Chooses device, port, GID and address as described above. FailedPrecondition naming what is
// missing when there is no device, no active port, or no usable address.
absl::StatusOr<DeviceSelection> SelectDevice(const DeviceConfig& config);

// A user buffer registered once for use as the source of bulk writes (Connection::WriteBulk).
// Registration pins the pages: register long-lived buffers, not one per message.
class MemoryRegion {
 public:
  const uint8_t* data() const { return static_cast<const uint8_t*>(mr_->addr); }
  size_t size() const { return mr_->length; }
  uint32_t lkey() const { return mr_->lkey; }
  // Only meaningful for memory registered for remote access (RegisterForRemoteRead).
  uint32_t rkey() const { return mr_->rkey; }
  // The verbs region, for binding windows over it (exposures.h).
  const ibv_mr* mr() const { return mr_.get(); }

 private:
  friend class Device;
  explicit MemoryRegion(MrOwner mr) : mr_(std::move(mr)) {}
  MrOwner mr_;
};

class Device {
 public:
  // Selects (SelectDevice), allocates the protection domain and the slot pool.
  static absl::StatusOr<std::unique_ptr<Device>> Open(const DeviceConfig& config,
                                                      const SlotPoolOptions& slots = {});
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;
  ~Device();

  const DeviceSelection& selection() const { return selection_; }
  ibv_context* context() const { return context_; }
  ibv_pd* pd() const { return pd_.get(); }
  SlotPool& slots() const { return *slots_; }
  const ibv_device_attr& attr() const { return attr_; }
  // The device's asynchronous events read so far (async_events.h): the context's, so every Device
  // on it counts the same ones. All zero on a device without an event file.
  AsyncEventCounts async_events() const {
    return async_events_ != nullptr ? async_events_->counts() : AsyncEventCounts{};
  }

  // Registers [data, data + size) for local access (a source of sends and writes, a destination
  // of reads) and, on a device with type-2 windows, for binding them (exposures.h): no remote
  // access of its own, so its rkey opens nothing, but a range of it can be exposed to one peer
  // through a window without registering it again.
  absl::StatusOr<std::unique_ptr<MemoryRegion>> RegisterMemory(const void* data, size_t size);
  // Registers exactly [data, data + size) for the peer to RDMA READ, and nothing else: memory
  // exposed for one transfer and deregistered after it (MemoryRegion::rkey).
  absl::StatusOr<std::unique_ptr<MemoryRegion>> RegisterForRemoteRead(const void* data,
                                                                      size_t size);
  // Registers exactly [data, data + size) for binding memory windows over it (exposures.h), with
  // no remote access of its own: its rkey opens nothing, a window's opens what it was bound for.
  // kUnimplemented when the device has no type-2 windows.
  absl::StatusOr<std::unique_ptr<MemoryRegion>> RegisterForWindows(const void* data, size_t size);
  // Whether the device offers shared receive queues (shared_receive_queue.h): rxe and every
  // ConnectX do; a device without them gets receives per connection (PollerOptions).
  bool has_shared_receive_queues() const { return attr_.max_srq > 0 && attr_.max_srq_wr > 0; }
  // Whether a window bound on a queue pair with work before it still in flight stays bound when
  // that work is retransmitted. False on rxe (Linux 6.1): when a lost packet makes it go back to
  // an earlier work request, it executes every work request from there again, a BIND_MW among
  // them, and a bind executed twice fails (the window's key has moved on), which breaks the queue
  // pair (found by tests/hosts/lossy_traffic_test at 1 % loss: calls stalled to their deadlines).
  // A connection there binds only on a quiet send queue (Connection::QuietLocked).
  bool binds_survive_retry() const { return binds_survive_retry_; }
  // Whether a queue pair of a shared receive queue that goes to error is followed by the device's
  // last-WQE-reached event, which its connection's drain then awaits (shared_receive_queue.h,
  // "Teardown"): every device with an event file but rxe, which never raises it.
  bool awaits_last_wqe() const { return awaits_last_wqe_; }
  // Whether the device offers type-2 memory windows (memory_window.h).
  bool has_windows() const { return has_windows_; }
  // Whether a window here opens only its own range. False on rxe, where it opens the whole region
  // beneath it (memory_window.h, "Ranges"): there a range to expose needs a region of its own.
  bool windows_bound_range() const { return windows_bound_range_; }
  // The flags of a receive completion that say a SEND_WITH_INV invalidated a key here
  // (ibv_wc::invalidated_rkey). IBV_WC_WITH_INV, and on rxe also IBV_WC_IP_CSUM_OK: rxe's kernel
  // writes its own IB_WC_WITH_INVALIDATE (bit 2) into the completion its user library hands over
  // as is, where verbs read bit 2 as a checksum flag that an RC receive never carries otherwise
  // (seen in the test guest, Linux 6.1: wc_flags 5 = GRH | bit 2, with the key in place).
  uint32_t invalidated_flags() const { return invalidated_flags_; }
  // Whether a SEND_WITH_INV invalidates a type-2 window only when it arrives on the queue pair the
  // window is bound to, as the specification has it for type 2B. False on rxe (Linux 6.1), which
  // invalidates a window from any queue pair that names its whole key (exposure_test shows it):
  // there a peer that guessed another connection's key can end that exposure (not read it).
  bool invalidation_checks_queue_pair() const { return invalidation_checks_queue_pair_; }
  // Memory registrations made through this Device so far (every Register* call that succeeded):
  // a system call and the pages pinned each, which the hot path must not make per call.
  uint64_t registrations() const { return registrations_.load(std::memory_order_relaxed); }

 private:
  Device() = default;
  // ibv_reg_mr with `access`; `what` qualifies the call in the error (", remote read").
  absl::StatusOr<std::unique_ptr<MemoryRegion>> Register(const void* data, size_t size, int access,
                                                         const char* what);
  DeviceSelection selection_;
  DeviceListOwner devices_;
  ibv_context* context_ = nullptr;  // one of devices_, owned by librdmacm
  ibv_device_attr attr_{};
  bool has_windows_ = false;
  bool awaits_last_wqe_ = false;
  bool binds_survive_retry_ = true;
  std::atomic<uint64_t> registrations_{0};
  bool windows_bound_range_ = false;
  uint32_t invalidated_flags_ = IBV_WC_WITH_INV;
  bool invalidation_checks_queue_pair_ = true;
  PdOwner pd_;
  std::unique_ptr<SlotPool> slots_;
  // Last: stopped before the context it reads goes with devices_.
  std::shared_ptr<AsyncEvents> async_events_;
};

}  // namespace zrpc::transport

#endif  // ZRPC_TRANSPORT_DEVICE_H_
