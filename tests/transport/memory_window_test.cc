// Type-2 memory windows (transport/memory_window.h) on raw queue pairs: a window bound to one QP
// opens its range to that QP alone, under the key of its last bind. A key used from another QP
// fails with a remote access error on the user's side, the bytes untouched and the window's own
// connection unaffected; an invalidated key and a stale key byte open nothing.
//
// Built twice: over fakeverbs on the host (ZRPC_OVER_FAKEVERBS) and on the harness's device.
#include "transport/memory_window.h"

#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#include <catch2/catch.hpp>
#include <cstdint>
#include <cstring>
#include <memory>
#include <set>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "transport/cm_util.h"
#include "transport/device.h"
#include "transport/verbs_owners.h"

#ifdef ZRPC_OVER_FAKEVERBS
#include "tests/fakeverbs/fake_device.h"
#define ZRPC_TEST_DEVICE(var) const DeviceConfig var = zrpc::fakeverbs::FakeDevice()
#else
#include "tests/rdma_device.h"
#define ZRPC_TEST_DEVICE(var) ZRPC_REQUIRE_RDMA_DEVICE(var)
#endif

namespace zrpc::transport {
namespace {

constexpr absl::Duration kTimeout = absl::Seconds(30);
constexpr size_t kRegion = 64 * 1024;

// One completion from `cq` within kTimeout; a failed test if none comes.
ibv_wc WaitCompletion(ibv_cq* cq) {
  const absl::Time deadline = absl::Now() + kTimeout;
  ibv_wc wc{};
  while (absl::Now() < deadline) {
    if (ibv_poll_cq(cq, 1, &wc) == 1) return wc;
  }
  FAIL("no completion within " << kTimeout);
  return wc;
}

// The side that owns the memory: the zrpc Device's protection domain, 64 KiB of memory of which 4
// KiB at offset 8 KiB (kChunk) are registered for binding windows only (no remote access of their
// own), and a listener whose accepted QPs share one completion queue. Windows are bound over the
// whole registration, as the transport binds them (memory_window.h, "Ranges").
constexpr size_t kChunkOffset = 8192;
constexpr size_t kChunk = 4096;
struct Owner {
  std::unique_ptr<Device> device;
  PageBuffer memory;
  MrOwner mr;  // [kChunkOffset, kChunkOffset + kChunk)
  CqOwner cq;
  CmChannelOwner channel;
  CmIdOwner listen_id;
  uint16_t port = 0;
};

// A peer that connects to the owner: its own protection domain, a local buffer to write from.
struct Peer {
  CmChannelOwner channel;
  CmIdOwner id;
  PdOwner pd;
  CqOwner cq;
  CmQpOwner qp;
  std::string buffer = std::string(4096, '\0');
  MrOwner mr;
};

void Open(const DeviceConfig& config, Owner* owner) {
  auto device = Device::Open(config);
  REQUIRE(device.ok());
  owner->device = std::move(*device);
  owner->memory = AllocatePages(kRegion);
  REQUIRE(owner->memory != nullptr);
  owner->mr.reset(ibv_reg_mr(owner->device->pd(), owner->memory.get() + kChunkOffset, kChunk,
                             IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND));
  REQUIRE(owner->mr != nullptr);
  owner->cq.reset(ibv_create_cq(owner->device->context(), 64, nullptr, nullptr, 0));
  REQUIRE(owner->cq != nullptr);
  REQUIRE(CreateCmChannelAndId(&owner->channel, &owner->listen_id).ok());
  sockaddr_storage addr{};
  REQUIRE(ResolveSockaddr(owner->device->selection().addr, 0, &addr).ok());
  REQUIRE(rdma_bind_addr(owner->listen_id.get(), reinterpret_cast<sockaddr*>(&addr)) == 0);
  REQUIRE(rdma_listen(owner->listen_id.get(), 4) == 0);
  owner->port = ntohs(rdma_get_src_port(owner->listen_id.get()));
}

ibv_qp_init_attr QpAttr(ibv_cq* cq) {
  ibv_qp_init_attr attr{};
  attr.send_cq = attr.recv_cq = cq;
  attr.qp_type = IBV_QPT_RC;
  attr.cap.max_send_wr = 8;
  attr.cap.max_recv_wr = 1;
  attr.cap.max_send_sge = attr.cap.max_recv_sge = 1;
  return attr;
}

// Connects `peer` to `owner`; the owner's end of it goes to `*accepted` (its QP on the owner's
// protection domain and completion queue).
void Connect(Owner* owner, Peer* peer, CmIdOwner* accepted, CmQpOwner* accepted_qp) {
  const absl::Time deadline = absl::Now() + kTimeout;
  REQUIRE(CreateCmChannelAndId(&peer->channel, &peer->id).ok());
  REQUIRE(ResolveRoute(peer->channel.get(), peer->id.get(), "", owner->device->selection().addr,
                       owner->port, deadline)
              .ok());
  peer->pd.reset(ibv_alloc_pd(peer->id->verbs));
  peer->cq.reset(ibv_create_cq(peer->id->verbs, 16, nullptr, nullptr, 0));
  REQUIRE((peer->pd != nullptr && peer->cq != nullptr));
  ibv_qp_init_attr attr = QpAttr(peer->cq.get());
  REQUIRE(rdma_create_qp(peer->id.get(), peer->pd.get(), &attr) == 0);
  peer->qp.reset(peer->id.get());
  peer->mr.reset(
      ibv_reg_mr(peer->pd.get(), peer->buffer.data(), peer->buffer.size(), IBV_ACCESS_LOCAL_WRITE));
  REQUIRE(peer->mr != nullptr);
  rdma_conn_param param = ConnParam(nullptr, 0, 0, 0);
  REQUIRE(rdma_connect(peer->id.get(), &param) == 0);

  auto request = ExpectCmEvent(owner->channel.get(), RDMA_CM_EVENT_CONNECT_REQUEST, deadline);
  REQUIRE(request.ok());
  rdma_cm_id* child = (*request)->id;
  rdma_ack_cm_event(*request);
  accepted->reset(child);
  ibv_qp_init_attr owner_attr = QpAttr(owner->cq.get());
  REQUIRE(rdma_create_qp(child, owner->device->pd(), &owner_attr) == 0);
  accepted_qp->reset(child);
  rdma_conn_param accept = ConnParam(nullptr, 0, 0, 0);
  REQUIRE(rdma_accept(child, &accept) == 0);
  auto established = ExpectCmEvent(peer->channel.get(), RDMA_CM_EVENT_ESTABLISHED, deadline);
  REQUIRE(established.ok());
  rdma_ack_cm_event(*established);
  auto owner_established = ExpectCmEvent(owner->channel.get(), RDMA_CM_EVENT_ESTABLISHED, deadline);
  REQUIRE(owner_established.ok());
  rdma_ack_cm_event(*owner_established);
}

// The owner with two peers connected, A and B, and the chunk's place.
struct Setup {
  Owner owner;
  Peer a, b;
  CmIdOwner a_end, b_end;  // the owner's ends
  CmQpOwner a_qp, b_qp;
  uint8_t* opened = nullptr;
  uint64_t opened_addr = 0;
};

void Start(const DeviceConfig& config, Setup* setup) {
  Open(config, &setup->owner);
  const ibv_device_attr& attr = setup->owner.device->attr();
  if (!SupportsType2Windows(attr)) {
    FAIL("the test device offers no type-2 memory windows (max_mw "
         << attr.max_mw << ", device_cap_flags 0x" << std::hex << attr.device_cap_flags << ")");
  }
  Connect(&setup->owner, &setup->a, &setup->a_end, &setup->a_qp);
  Connect(&setup->owner, &setup->b, &setup->b_end, &setup->b_qp);
  setup->opened = setup->owner.memory.get() + kChunkOffset;
  setup->opened_addr = reinterpret_cast<uint64_t>(setup->opened);
}

// Posts a signalled work request on `qp` and returns its completion's status.
ibv_wc_status PostAndWait(ibv_qp* qp, ibv_cq* cq, ibv_send_wr* wr) {
  wr->send_flags |= IBV_SEND_SIGNALED;
  ibv_send_wr* bad = nullptr;
  REQUIRE(ibv_post_send(qp, wr, &bad) == 0);
  return WaitCompletion(cq).status;
}

// Posts the bind `window` prepared in `wr` on `qp`, and its completion's status.
ibv_wc_status Bind(MemoryWindow* window, ibv_qp* qp, ibv_cq* cq, ibv_send_wr* wr) {
  wr->send_flags |= IBV_SEND_SIGNALED;
  ibv_send_wr* bad = nullptr;
  REQUIRE(ibv_post_send(qp, wr, &bad) == 0);
  window->BindPosted();
  return WaitCompletion(cq).status;
}

// `peer` RDMA-WRITEs `text` to `addr` under `rkey`; the completion's status.
ibv_wc_status Write(Peer* peer, const std::string& text, uint64_t addr, uint32_t rkey) {
  std::memcpy(peer->buffer.data(), text.data(), text.size());
  ibv_sge sge{reinterpret_cast<uintptr_t>(peer->buffer.data()), static_cast<uint32_t>(text.size()),
              peer->mr->lkey};
  ibv_send_wr wr{};
  wr.wr_id = 1;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_RDMA_WRITE;
  wr.wr.rdma.remote_addr = addr;
  wr.wr.rdma.rkey = rkey;
  return PostAndWait(peer->qp->qp, peer->cq.get(), &wr);
}

TEST_CASE("a window's key opens its range to the QP it is bound to, and to no other",
          "[memory_window]") {
  ZRPC_TEST_DEVICE(config);
  Setup setup;
  Start(config, &setup);
  auto& [owner, a, b, a_end, b_end, a_qp, b_qp, opened, opened_addr] = setup;
  auto window = MemoryWindow::Allocate(owner.device->pd());
  REQUIRE(window.ok());
  // The window opens the chunk to A's connection, for writes.
  ibv_send_wr bind{};
  const uint32_t key1 =
      (*window)->PrepareBind(*owner.mr, opened_addr, kChunk, IBV_ACCESS_REMOTE_WRITE, 7, &bind);
  CHECK(key1 != (*window)->rkey());  // not the window's key until the bind is posted
  REQUIRE(Bind(window->get(), a_end->qp, owner.cq.get(), &bind) == IBV_WC_SUCCESS);
  CHECK(key1 == (*window)->rkey());

  // A, to which it is bound, writes through it.
  REQUIRE(Write(&a, "from a", opened_addr, key1) == IBV_WC_SUCCESS);
  CHECK(std::string(reinterpret_cast<const char*>(opened), 6) == "from a");

  // B holds the same key (stolen, or guessed) and writes to the same place: a remote access
  // error on B's side, the bytes untouched.
  CHECK(Write(&b, "from b", opened_addr, key1) == IBV_WC_REM_ACCESS_ERR);
  CHECK(std::string(reinterpret_cast<const char*>(opened), 6) == "from a");

  // A's connection, the victim of the attempt, carries on.
  REQUIRE(Write(&a, "again!", opened_addr + 64, key1) == IBV_WC_SUCCESS);
  CHECK(std::string(reinterpret_cast<const char*>(opened) + 64, 6) == "again!");

  // Invalidated and bound again: a fresh key byte on the same window.
  ibv_send_wr invalidate{};
  (*window)->PrepareInvalidate(8, &invalidate);
  REQUIRE(PostAndWait(a_end->qp, owner.cq.get(), &invalidate) == IBV_WC_SUCCESS);
  const uint32_t key2 =
      (*window)->PrepareBind(*owner.mr, opened_addr, kChunk, IBV_ACCESS_REMOTE_WRITE, 9, &bind);
  CHECK((key2 >> 8) == (key1 >> 8));
  CHECK((key2 & 0xff) != (key1 & 0xff));
  REQUIRE(Bind(window->get(), a_end->qp, owner.cq.get(), &bind) == IBV_WC_SUCCESS);
  REQUIRE(Write(&a, "key two", opened_addr, key2) == IBV_WC_SUCCESS);
  CHECK(std::string(reinterpret_cast<const char*>(opened), 7) == "key two");

  // The previous key, from the QP the window is bound to: it opens nothing any more.
  CHECK(Write(&a, "stale!", opened_addr, key1) == IBV_WC_REM_ACCESS_ERR);
  CHECK(std::string(reinterpret_cast<const char*>(opened), 7) == "key two");
}

TEST_CASE("a window opens only its own range, and an invalidated key opens nothing",
          "[memory_window]") {
  ZRPC_TEST_DEVICE(config);
  Setup setup;
  Start(config, &setup);
  auto& [owner, a, c, a_end, c_end, a_qp, c_qp, opened, opened_addr] = setup;
  auto window = MemoryWindow::Allocate(owner.device->pd());
  REQUIRE(window.ok());

  ibv_send_wr bind{};
  const uint32_t key =
      (*window)->PrepareBind(*owner.mr, opened_addr, kChunk, IBV_ACCESS_REMOTE_WRITE, 1, &bind);
  REQUIRE(Bind(window->get(), a_end->qp, owner.cq.get(), &bind) == IBV_WC_SUCCESS);
  // One byte past the window's end, from the QP it is bound to.
  CHECK(Write(&a, "over", opened_addr + kChunk - 3, key) == IBV_WC_REM_ACCESS_ERR);
  CHECK(opened[kChunk] == 0);

  // Bound to C's connection and invalidated: C's write with the dead key fails.
  auto window2 = MemoryWindow::Allocate(owner.device->pd());
  REQUIRE(window2.ok());
  const uint32_t key_c =
      (*window2)->PrepareBind(*owner.mr, opened_addr, kChunk, IBV_ACCESS_REMOTE_WRITE, 2, &bind);
  REQUIRE(Bind(window2->get(), c_end->qp, owner.cq.get(), &bind) == IBV_WC_SUCCESS);
  REQUIRE(Write(&c, "alive", opened_addr, key_c) == IBV_WC_SUCCESS);
  ibv_send_wr invalidate{};
  (*window2)->PrepareInvalidate(3, &invalidate);
  REQUIRE(PostAndWait(c_end->qp, owner.cq.get(), &invalidate) == IBV_WC_SUCCESS);
  CHECK(Write(&c, "dead!", opened_addr, key_c) == IBV_WC_REM_ACCESS_ERR);
  CHECK(std::string(reinterpret_cast<const char*>(opened), 5) == "alive");
}

TEST_CASE("a window's next key byte is random and never the last one", "[memory_window]") {
  std::set<uint8_t> seen;
  uint8_t previous = 0;
  for (int i = 0; i < 4096; ++i) {
    const uint8_t next = NextKeyByte(previous);
    REQUIRE(next != previous);
    seen.insert(next);
    previous = next;
  }
  // 4,096 draws over 255 values: all but a handful seen (the chance any one is missed is
  // (254/255)^4096, about 1e-7).
  CHECK(seen.size() >= 250);
}

TEST_CASE("devices without type-2 windows are told apart", "[memory_window]") {
  ibv_device_attr attr{};
  CHECK_FALSE(SupportsType2Windows(attr));
  attr.max_mw = 16;
  CHECK_FALSE(SupportsType2Windows(attr));
  attr.device_cap_flags = IBV_DEVICE_MEM_WINDOW;  // type 1 only
  CHECK_FALSE(SupportsType2Windows(attr));
  attr.device_cap_flags |= IBV_DEVICE_MEM_WINDOW_TYPE_2B;
  CHECK(SupportsType2Windows(attr));
  attr.max_mw = 0;
  CHECK_FALSE(SupportsType2Windows(attr));
}

}  // namespace
}  // namespace zrpc::transport
