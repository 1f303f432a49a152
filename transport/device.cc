#include "transport/device.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>

#include <cerrno>
#include <cstring>
#include <set>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "transport/cm_util.h"
#include "transport/log.h"
#include "transport/memory_window.h"
#include "transport/verbs_error.h"

namespace zrpc::transport {
namespace {

absl::StatusOr<DeviceListOwner> ListDevices() {
  int n = 0;
  errno = 0;
  DeviceListOwner list(rdma_get_devices(&n));
  if (list == nullptr || n == 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "no RDMA device: librdmacm lists none (", std::strerror(errno),
        "); load the NIC's driver, or rdma_rxe for Soft-RoCE, or run under tools/softroce"));
  }
  return list;
}

bool IsV4Mapped(const ibv_gid& gid) {
  static const uint8_t kPrefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  return std::memcmp(gid.raw, kPrefix, 12) == 0;
}

bool IsZero(const ibv_gid& gid) {
  static const uint8_t kZero[16] = {};
  return std::memcmp(gid.raw, kZero, 16) == 0;
}

// The IP address a RoCE GID holds: IPv4 for a mapped one, else the IPv6 address itself.
std::string GidAddress(const ibv_gid& gid) {
  char text[INET6_ADDRSTRLEN] = "?";
  if (IsV4Mapped(gid)) {
    inet_ntop(AF_INET, gid.raw + 12, text, sizeof(text));
  } else {
    inet_ntop(AF_INET6, gid.raw, text, sizeof(text));
  }
  return text;
}

// The first IPv4 address of network interface `ifindex`.
absl::StatusOr<std::string> InterfaceIpv4(uint32_t ifindex) {
  char name[IF_NAMESIZE] = {};
  if (if_indextoname(ifindex, name) == nullptr) return VerbsError("if_indextoname", errno);
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return VerbsError("getifaddrs", errno);
  std::string found;
  for (ifaddrs* a = list; a != nullptr && found.empty(); a = a->ifa_next) {
    if (a->ifa_addr == nullptr || a->ifa_addr->sa_family != AF_INET) continue;
    if (std::strcmp(a->ifa_name, name) != 0) continue;
    char text[INET_ADDRSTRLEN] = {};
    inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(a->ifa_addr)->sin_addr, text, sizeof(text));
    found = text;
  }
  freeifaddrs(list);
  if (found.empty()) {
    return absl::FailedPreconditionError(absl::StrCat("interface ", name, " has no IPv4 address"));
  }
  return found;
}

// Fills the GID and address of `sel` (device, port known) for a RoCE port: `want_index` if it is
// >= 0, else the RoCE v2 GID with an IPv4-mapped address, else one with a global IPv6 address.
absl::Status PickRoceGid(ibv_context* context, const ibv_port_attr& port_attr, int want_index,
                         DeviceSelection* sel) {
  int best = -1;
  ibv_gid best_gid{};
  for (int i = 0; i < port_attr.gid_tbl_len; ++i) {
    if (want_index >= 0 && i != want_index) continue;
    ibv_gid_entry entry{};
    if (ibv_query_gid_ex(context, sel->port, i, &entry, 0) != 0) continue;
    if (IsZero(entry.gid)) continue;
    if (want_index >= 0 && entry.gid_type != IBV_GID_TYPE_ROCE_V2) {
      return absl::FailedPreconditionError(absl::StrCat(
          sel->device, " port ", sel->port, " GID index ", i, " is not RoCE v2; zrpc needs v2"));
    }
    if (entry.gid_type != IBV_GID_TYPE_ROCE_V2) continue;
    bool link_local = entry.gid.raw[0] == 0xfe && (entry.gid.raw[1] & 0xc0) == 0x80;
    if (IsV4Mapped(entry.gid)) {
      best = i;
      best_gid = entry.gid;
      break;
    }
    if (best < 0 && (!link_local || want_index >= 0)) {
      best = i;
      best_gid = entry.gid;
    }
  }
  if (best < 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        sel->device, " port ", sel->port,
        want_index >= 0 ? absl::StrCat(" has no GID at index ", want_index)
                        : " has no RoCE v2 GID with an IP address: give its netdev an address"));
  }
  sel->gid_index = best;
  sel->gid = GidText(best_gid);
  sel->addr = GidAddress(best_gid);
  return absl::OkStatus();
}

int MtuBytes(ibv_mtu mtu) { return 128 << static_cast<int>(mtu); }

// Everything about (context, port) except the address, which the caller may already know.
absl::Status DescribePort(ibv_context* context, int port, int gid_index, bool need_addr,
                          DeviceSelection* sel) {
  sel->device = ibv_get_device_name(context->device);
  sel->port = port;
  ibv_port_attr attr{};
  if (int rc = ibv_query_port(context, port, &attr); rc != 0)
    return VerbsError("ibv_query_port", rc);
  if (attr.state != IBV_PORT_ACTIVE) {
    return absl::FailedPreconditionError(
        absl::StrCat(sel->device, " port ", port, " is ", ibv_port_state_str(attr.state)));
  }
  sel->active_mtu = MtuBytes(attr.active_mtu);
  sel->max_msg_size = attr.max_msg_sz;
  sel->infiniband = attr.link_layer == IBV_LINK_LAYER_INFINIBAND;
  if (!sel->infiniband) {
    if (!need_addr) {
      // The address is given: find the GID that holds it.
      for (int i = 0; i < attr.gid_tbl_len; ++i) {
        ibv_gid_entry entry{};
        if (ibv_query_gid_ex(context, port, i, &entry, 0) != 0) continue;
        if (entry.gid_type == IBV_GID_TYPE_ROCE_V2 && GidAddress(entry.gid) == sel->addr) {
          sel->gid_index = i;
          sel->gid = GidText(entry.gid);
          return absl::OkStatus();
        }
      }
      return absl::FailedPreconditionError(absl::StrCat(sel->addr, " is on ", sel->device, " port ",
                                                        port, " but no RoCE v2 GID holds it"));
    }
    return PickRoceGid(context, attr, gid_index, sel);
  }
  sel->lid = attr.lid;
  sel->gid_index = gid_index >= 0 ? gid_index : 0;
  ibv_gid_entry entry{};
  if (ibv_query_gid_ex(context, port, sel->gid_index, &entry, 0) == 0)
    sel->gid = GidText(entry.gid);
  if (!need_addr) return absl::OkStatus();
  if (entry.ndev_ifindex == 0) {
    return absl::FailedPreconditionError(
        absl::StrCat(sel->device, " port ", port,
                     " (InfiniBand) has no IPoIB interface bound; set "
                     "ZRPC_RDMA_ADDR to the address librdmacm should use"));
  }
  auto addr = InterfaceIpv4(entry.ndev_ifindex);
  if (!addr.ok()) return addr.status();
  sel->addr = *addr;
  return absl::OkStatus();
}

// The device and port librdmacm binds `addr` to; `*context` is librdmacm's context for it.
absl::Status SelectByAddress(const DeviceConfig& config, DeviceSelection* sel,
                             ibv_context** context) {
  CmIdOwner id;
  rdma_cm_id* raw = nullptr;
  if (rdma_create_id(nullptr, &raw, nullptr, RDMA_PS_TCP) != 0) {
    return VerbsError("rdma_create_id", errno);
  }
  id.reset(raw);
  sockaddr_storage local{};
  if (auto s = ResolveSockaddr(config.addr, 0, &local); !s.ok()) return s;
  if (rdma_bind_addr(raw, reinterpret_cast<sockaddr*>(&local)) != 0) {
    return VerbsError(absl::StrCat("rdma_bind_addr(", config.addr, ")"), errno);
  }
  if (raw->verbs == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat(config.addr, " is not an address of any RDMA device"));
  }
  std::string name = ibv_get_device_name(raw->verbs->device);
  if (!config.device.empty() && config.device != name) {
    return absl::FailedPreconditionError(
        absl::StrCat(config.addr, " belongs to ", name, ", not to the configured ", config.device));
  }
  sel->addr = config.addr;
  *context = raw->verbs;
  int port = raw->port_num != 0 ? raw->port_num : config.port;
  return DescribePort(raw->verbs, port, config.gid_index, /*need_addr=*/false, sel);
}

void LogOnce(const DeviceSelection& sel) {
  static absl::Mutex mu(absl::kConstInit);
  static std::set<std::string>* logged ABSL_GUARDED_BY(mu) = new std::set<std::string>;
  std::string line = sel.ToString();
  absl::MutexLock lock(&mu);
  if (logged->insert(line).second) ZRPC_LOG(kInfo, "device", "using ", line);
}

// Chooses among librdmacm's opened devices `list` (see SelectDevice), logs the choice, and
// returns the chosen device's context.
absl::StatusOr<ibv_context*> Select(ibv_context** list, const DeviceConfig& config,
                                    DeviceSelection* sel) {
  if (!config.addr.empty()) {
    ibv_context* context = nullptr;
    if (auto s = SelectByAddress(config, sel, &context); !s.ok()) return s;
    LogOnce(*sel);
    return context;
  }
  std::string tried;
  for (ibv_context** c = list; *c != nullptr; ++c) {
    std::string name = ibv_get_device_name((*c)->device);
    if (!config.device.empty() && name != config.device) continue;
    ibv_device_attr attr{};
    if (int rc = ibv_query_device(*c, &attr); rc != 0) return VerbsError("ibv_query_device", rc);
    for (int port = 1; port <= attr.phys_port_cnt; ++port) {
      if (!config.device.empty() && port != config.port) continue;
      absl::Status s = DescribePort(*c, port, config.gid_index, /*need_addr=*/true, sel);
      if (s.ok()) {
        LogOnce(*sel);
        return *c;
      }
      absl::StrAppend(&tried, tried.empty() ? "" : "; ", s.message());
    }
  }
  if (tried.empty()) {
    return absl::FailedPreconditionError(absl::StrCat("no RDMA device named ", config.device));
  }
  return absl::FailedPreconditionError("no usable RDMA port: " + tried);
}

}  // namespace

std::string DeviceSelection::ToString() const {
  std::string where = infiniband ? absl::StrCat("InfiniBand LID ", lid, ", GID ", gid)
                                 : absl::StrCat("RoCE v2 GID index ", gid_index, " (", gid, ")");
  return absl::StrCat(device, " port ", port, ", ", where, ", MTU ", active_mtu, ", address ",
                      addr);
}

absl::StatusOr<DeviceSelection> SelectDevice(const DeviceConfig& config) {
  auto list = ListDevices();
  if (!list.ok()) return list.status();
  DeviceSelection sel;
  if (auto context = Select(list->get(), config, &sel); !context.ok()) return context.status();
  return sel;
}

absl::StatusOr<std::unique_ptr<Device>> Device::Open(const DeviceConfig& config,
                                                     const SlotPoolOptions& slots) {
  auto list = ListDevices();
  if (!list.ok()) return list.status();
  std::unique_ptr<Device> device(new Device);
  auto context = Select(list->get(), config, &device->selection_);
  if (!context.ok()) return context.status();
  device->devices_ = std::move(*list);
  device->context_ = *context;
  if (int rc = ibv_query_device(device->context_, &device->attr_); rc != 0) {
    return VerbsError("ibv_query_device", rc);
  }
  device->has_windows_ = SupportsType2Windows(device->attr_);
  // rxe (vendor 0xffffff) checks an access through a window against the region beneath it
  // (memory_window.h, "Ranges"); devices that follow the specification check the window's own.
  constexpr uint32_t kRxeVendor = 0xffffff;
  device->windows_bound_range_ = device->has_windows_ && device->attr_.vendor_id != kRxeVendor;
  if (device->attr_.vendor_id == kRxeVendor) {
    device->invalidated_flags_ |= IBV_WC_IP_CSUM_OK;
    device->invalidation_checks_queue_pair_ = false;
    device->binds_survive_retry_ = false;  // device.h, binds_survive_retry
  }
  device->pd_.reset(ibv_alloc_pd(device->context_));
  if (device->pd_ == nullptr) return VerbsError("ibv_alloc_pd", errno);
  auto pool = SlotPool::Create(device->pd_.get(), slots);
  if (!pool.ok()) return pool.status();
  device->slots_ = std::move(*pool);
  auto events = AsyncEvents::For(device->context_);
  if (!events.ok()) return events.status();
  device->async_events_ = std::move(*events);
  // The specification has every device with shared receive queues raise last-WQE-reached for a
  // queue pair of one in error; rxe (Linux 6.1) never does (tools/probes/srq_mw_probe.c), and a
  // stand-in without an event file cannot.
  device->awaits_last_wqe_ =
      device->async_events_ != nullptr && device->attr_.vendor_id != kRxeVendor;
  return device;
}

Device::~Device() = default;

absl::StatusOr<std::unique_ptr<MemoryRegion>> Device::Register(const void* data, size_t size,
                                                               int access, const char* what) {
  MrOwner mr(ibv_reg_mr(pd_.get(), const_cast<void*>(data), size, access));
  if (mr == nullptr) {
    return VerbsError(absl::StrCat("ibv_reg_mr(", size, " bytes", what, ")"), errno);
  }
  registrations_.fetch_add(1, std::memory_order_relaxed);
  return std::unique_ptr<MemoryRegion>(new MemoryRegion(std::move(mr)));
}

absl::StatusOr<std::unique_ptr<MemoryRegion>> Device::RegisterMemory(const void* data,
                                                                     size_t size) {
  return Register(data, size, IBV_ACCESS_LOCAL_WRITE | (has_windows_ ? IBV_ACCESS_MW_BIND : 0), "");
}

absl::StatusOr<std::unique_ptr<MemoryRegion>> Device::RegisterForRemoteRead(const void* data,
                                                                            size_t size) {
  return Register(data, size, IBV_ACCESS_REMOTE_READ, ", remote read");
}

absl::StatusOr<std::unique_ptr<MemoryRegion>> Device::RegisterForWindows(const void* data,
                                                                         size_t size) {
  if (!has_windows_) {
    return absl::UnimplementedError(
        absl::StrCat(selection_.device, " has no type-2 memory windows"));
  }
  return Register(data, size, IBV_ACCESS_MW_BIND, ", for windows");
}

}  // namespace zrpc::transport
