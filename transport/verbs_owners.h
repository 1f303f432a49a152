// One RAII owner per verbs / librdmacm object type.
//
// Each alias is a std::unique_ptr whose deleter calls the matching destroy function. A class
// that holds several declares them in creation order, so C++'s reverse-order member destruction
// tears them down in the order rdma-core's rc_pingpong.c uses: QP, CQ, MR, PD, channel, id.
// Destroy failures are not recoverable at that point; they are ignored (the kernel reclaims
// everything when the process exits).
#ifndef ZRPC_TRANSPORT_VERBS_OWNERS_H_
#define ZRPC_TRANSPORT_VERBS_OWNERS_H_

#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>

namespace zrpc::transport {

namespace internal {
template <typename T, auto Destroy>
struct Deleter {
  void operator()(T* p) const { static_cast<void>(Destroy(p)); }
};
// rdma_destroy_qp returns void and takes the cm id, not the QP.
struct CmQpDeleter {
  void operator()(rdma_cm_id* id) const { rdma_destroy_qp(id); }
};
// ibv_dealloc_mw is an inline wrapper in verbs.h, not a function of the library.
struct MwDeleter {
  void operator()(ibv_mw* mw) const { static_cast<void>(ibv_dealloc_mw(mw)); }
};
struct FreeDeleter {
  void operator()(uint8_t* p) const { std::free(p); }
};
struct DeviceListDeleter {
  void operator()(ibv_context** list) const { rdma_free_devices(list); }
};
}  // namespace internal

using ContextOwner = std::unique_ptr<ibv_context, internal::Deleter<ibv_context, ibv_close_device>>;
using PdOwner = std::unique_ptr<ibv_pd, internal::Deleter<ibv_pd, ibv_dealloc_pd>>;
using CqOwner = std::unique_ptr<ibv_cq, internal::Deleter<ibv_cq, ibv_destroy_cq>>;
using CompChannelOwner =
    std::unique_ptr<ibv_comp_channel,
                    internal::Deleter<ibv_comp_channel, ibv_destroy_comp_channel>>;
using MrOwner = std::unique_ptr<ibv_mr, internal::Deleter<ibv_mr, ibv_dereg_mr>>;
using QpOwner = std::unique_ptr<ibv_qp, internal::Deleter<ibv_qp, ibv_destroy_qp>>;
using MwOwner = std::unique_ptr<ibv_mw, internal::MwDeleter>;
using SrqOwner = std::unique_ptr<ibv_srq, internal::Deleter<ibv_srq, ibv_destroy_srq>>;
using CmChannelOwner =
    std::unique_ptr<rdma_event_channel,
                    internal::Deleter<rdma_event_channel, rdma_destroy_event_channel>>;
using CmIdOwner = std::unique_ptr<rdma_cm_id, internal::Deleter<rdma_cm_id, rdma_destroy_id>>;
// librdmacm's list of opened devices (rdma_get_devices); the contexts in it belong to librdmacm.
using DeviceListOwner = std::unique_ptr<ibv_context*, internal::DeviceListDeleter>;
// Owns the QP that rdma_create_qp attached to a cm id (points at the id, destroys only the QP).
using CmQpOwner = std::unique_ptr<rdma_cm_id, internal::CmQpDeleter>;

// Memory to register: page-aligned (registration pins whole pages), whole pages, zeroed (so
// every page is touched before it is pinned). Null when out of memory.
using PageBuffer = std::unique_ptr<uint8_t, internal::FreeDeleter>;
inline PageBuffer AllocatePages(size_t bytes) {
  constexpr size_t kPage = 4096;
  bytes = (bytes + kPage - 1) / kPage * kPage;
  PageBuffer buffer(static_cast<uint8_t*>(std::aligned_alloc(kPage, bytes)));
  if (buffer != nullptr) std::memset(buffer.get(), 0, bytes);
  return buffer;
}

}  // namespace zrpc::transport

#endif  // ZRPC_TRANSPORT_VERBS_OWNERS_H_
