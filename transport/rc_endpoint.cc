#include "transport/rc_endpoint.h"

#include <arpa/inet.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "transport/cm_util.h"
#include "transport/verbs_error.h"

namespace zrpc::transport {
namespace {


absl::Status CheckAdvert(const void* data, size_t len, BufferAdvert* out) {
  if (data == nullptr || len < sizeof(BufferAdvert)) {
    return absl::FailedPreconditionError(
        absl::StrCat("peer sent ", len, " bytes of connection data, expected ",
                     sizeof(BufferAdvert)));
  }
  std::memcpy(out, data, sizeof(*out));
  if (out->magic != BufferAdvert::kMagic) {
    return absl::FailedPreconditionError(
        absl::StrCat("peer is not zrpc: magic 0x", absl::Hex(out->magic), ", expected 0x",
                     absl::Hex(BufferAdvert::kMagic)));
  }
  if (out->version != BufferAdvert::kVersion) {
    return absl::FailedPreconditionError(absl::StrCat(
        "peer speaks version ", out->version, ", this build speaks ", BufferAdvert::kVersion));
  }
  return absl::OkStatus();
}

absl::Status CheckRange(size_t offset, size_t length, size_t size, const char* what) {
  if (offset > size || length > size - offset) {
    return absl::OutOfRangeError(absl::StrCat(what, ": [", offset, ", ", offset + length,
                                              ") is outside the ", size, "-byte buffer"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status RcEndpoint::SetUp(const RcOptions& options) {
  options_ = options;
  ibv_context* context = id_->verbs;
  if (context == nullptr) return absl::InternalError("rdma_cm id has no device");
  pd_.reset(ibv_alloc_pd(context));
  if (pd_ == nullptr) return VerbsError("ibv_alloc_pd", errno);
  int cqe = static_cast<int>(options.max_send_wr + options.max_recv_wr);
  cq_.reset(ibv_create_cq(context, cqe, nullptr, nullptr, 0));
  if (cq_ == nullptr) return VerbsError("ibv_create_cq", errno);
  buffer_ = AllocatePages(options.buffer_size);
  if (buffer_ == nullptr) return absl::ResourceExhaustedError("cannot allocate the buffer");
  // The peer may write into this buffer, and nothing else: no REMOTE_READ, no atomics.
  mr_.reset(ibv_reg_mr(pd_.get(), buffer_.get(), options.buffer_size,
                       IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE));
  if (mr_ == nullptr) return VerbsError("ibv_reg_mr", errno);

  ibv_qp_init_attr attr{};
  attr.send_cq = cq_.get();
  attr.recv_cq = cq_.get();
  attr.qp_type = IBV_QPT_RC;
  attr.cap.max_send_wr = options.max_send_wr;
  attr.cap.max_recv_wr = options.max_recv_wr;
  attr.cap.max_send_sge = 1;
  attr.cap.max_recv_sge = 1;
  attr.cap.max_inline_data = options.max_inline;
  attr.sq_sig_all = 0;
  if (rdma_create_qp(id_.get(), pd_.get(), &attr) != 0) return VerbsError("rdma_create_qp", errno);
  qp_.reset(id_.get());
  max_inline_ = attr.cap.max_inline_data;  // what the device granted

  if (uint64_t(options.initial_recvs) * options.recv_size > options.buffer_size) {
    return absl::InvalidArgumentError("initial_recvs * recv_size exceeds buffer_size");
  }
  for (uint32_t i = 0; i < options.initial_recvs; ++i) {
    if (auto s = PostRecv(size_t(i) * options.recv_size, options.recv_size, i); !s.ok()) return s;
  }
  return absl::OkStatus();
}

BufferAdvert RcEndpoint::OwnAdvert() const {
  BufferAdvert advert;
  advert.addr = reinterpret_cast<uintptr_t>(buffer_.get());
  advert.rkey = mr_->rkey;
  advert.size = static_cast<uint32_t>(options_.buffer_size);
  return advert;
}

absl::StatusOr<std::unique_ptr<RcEndpoint>> RcEndpoint::Connect(const std::string& addr,
                                                                uint16_t port,
                                                                const RcOptions& options,
                                                                absl::Duration timeout) {
  if (options.buffer_size > UINT32_MAX) return absl::InvalidArgumentError("buffer_size > 4 GiB");
  absl::Time deadline = absl::Now() + timeout;
  std::unique_ptr<RcEndpoint> ep(new RcEndpoint);
  if (auto s = CreateCmChannelAndId(&ep->channel_, &ep->id_); !s.ok()) return s;
  rdma_cm_id* id = ep->id_.get();

  if (auto s = ResolveRoute(ep->channel_.get(), id, "", addr, port, deadline); !s.ok()) return s;

  if (auto s = ep->SetUp(options); !s.ok()) return s;
  BufferAdvert own = ep->OwnAdvert();
  rdma_conn_param param = ConnParam(&own, sizeof(own));
  if (rdma_connect(id, &param) != 0) return VerbsError("rdma_connect", errno);
  auto event = ExpectCmEvent(ep->channel_.get(), RDMA_CM_EVENT_ESTABLISHED, deadline);
  if (!event.ok()) return event.status();
  absl::Status advert_ok = CheckAdvert((*event)->param.conn.private_data,
                                       (*event)->param.conn.private_data_len, &ep->peer_);
  rdma_ack_cm_event(*event);
  ep->connected_ = true;
  if (!advert_ok.ok()) return advert_ok;  // the destructor disconnects
  return ep;
}

RcEndpoint::~RcEndpoint() {
  if (connected_) rdma_disconnect(id_.get());
}

std::string RcEndpoint::DeviceName() const { return ibv_get_device_name(id_->verbs->device); }

int RcEndpoint::PortNum() const { return id_->port_num; }

std::string RcEndpoint::GidText() const {
  return transport::GidText(id_->route.addr.addr.ibaddr.sgid);
}

absl::StatusOr<int> RcEndpoint::GidIndex() const {
  ibv_port_attr port_attr{};
  if (int rc = ibv_query_port(id_->verbs, id_->port_num, &port_attr); rc != 0) {
    return VerbsError("ibv_query_port", rc);
  }
  const ibv_gid& used = id_->route.addr.addr.ibaddr.sgid;
  for (int i = 0; i < port_attr.gid_tbl_len; ++i) {
    ibv_gid gid{};
    if (ibv_query_gid(id_->verbs, id_->port_num, i, &gid) != 0) continue;
    if (std::memcmp(gid.raw, used.raw, sizeof(gid.raw)) != 0) continue;
    // RoCE devices list each address twice (RoCE v1 and v2); zrpc connections are RoCE v2.
    ibv_gid_entry entry{};
    if (ibv_query_gid_ex(id_->verbs, id_->port_num, i, &entry, 0) == 0 &&
        entry.gid_type == IBV_GID_TYPE_ROCE_V1) {
      continue;
    }
    return i;
  }
  return absl::NotFoundError(absl::StrCat("GID ", GidText(), " is not in the port's table"));
}

ibv_sge RcEndpoint::Sge(size_t offset, size_t length) const {
  return ibv_sge{reinterpret_cast<uintptr_t>(buffer_.get() + offset),
                 static_cast<uint32_t>(length), mr_->lkey};
}

// Post* validate ranges before posting: a work request outside the registered buffer would
// fail asynchronously (a local protection error that moves the QP to the error state).
absl::Status RcEndpoint::PostRecv(size_t offset, size_t length, uint64_t wr_id) {
  if (auto s = CheckRange(offset, length, options_.buffer_size, "PostRecv"); !s.ok()) return s;
  ibv_sge sge = Sge(offset, length);
  ibv_recv_wr wr{};
  wr.wr_id = wr_id;
  wr.sg_list = &sge;
  wr.num_sge = length > 0 ? 1 : 0;
  ibv_recv_wr* bad = nullptr;
  if (int rc = ibv_post_recv(qp_->qp, &wr, &bad); rc != 0) return VerbsError("ibv_post_recv", rc);
  return absl::OkStatus();
}

absl::Status RcEndpoint::PostSend(size_t offset, size_t length, uint64_t wr_id, bool signaled) {
  return PostSendQueue(IBV_WR_SEND, offset, length, wr_id, signaled, 0, 0);
}

absl::Status RcEndpoint::PostWrite(size_t offset, size_t length, size_t remote_offset,
                                   uint64_t wr_id, bool signaled, bool with_imm, uint32_t imm) {
  if (auto s = CheckRange(remote_offset, length, peer_.size, "PostWrite (remote)"); !s.ok()) {
    return s;
  }
  return PostSendQueue(with_imm ? IBV_WR_RDMA_WRITE_WITH_IMM : IBV_WR_RDMA_WRITE, offset, length,
                       wr_id, signaled, imm, peer_.addr + remote_offset);
}

absl::Status RcEndpoint::PostSendQueue(ibv_wr_opcode opcode, size_t offset, size_t length,
                                       uint64_t wr_id, bool signaled, uint32_t imm,
                                       uint64_t remote_addr) {
  if (auto s = CheckRange(offset, length, options_.buffer_size, "post (local)"); !s.ok()) return s;
  ibv_sge sge = Sge(offset, length);
  ibv_send_wr wr{};
  wr.wr_id = wr_id;
  wr.sg_list = &sge;
  wr.num_sge = length > 0 ? 1 : 0;
  wr.opcode = opcode;
  wr.send_flags = (signaled ? IBV_SEND_SIGNALED : 0) | (length <= max_inline_ ? IBV_SEND_INLINE : 0);
  wr.imm_data = htonl(imm);
  wr.wr.rdma.remote_addr = remote_addr;  // ignored by SEND
  wr.wr.rdma.rkey = peer_.rkey;
  ibv_send_wr* bad = nullptr;
  if (int rc = ibv_post_send(qp_->qp, &wr, &bad); rc != 0) return VerbsError("ibv_post_send", rc);
  return absl::OkStatus();
}

absl::StatusOr<Completion> RcEndpoint::Poll(absl::Duration timeout) {
  ibv_wc wc{};
  // Reading the clock costs more than an empty poll (much more under emulation): the deadline
  // is computed after the first 1024 empty polls and checked every 1024 after that.
  absl::Time deadline = absl::InfiniteFuture();
  for (uint32_t spins = 1;; ++spins) {
    int n = ibv_poll_cq(cq_.get(), 1, &wc);
    if (n < 0) return VerbsError("ibv_poll_cq", -n);
    if (n == 1) break;
    if ((spins & 1023) == 0) {
      if (spins == 1024) {
        deadline = absl::Now() + timeout;
      } else if (absl::Now() > deadline) {
        return absl::DeadlineExceededError("no completion before the deadline");
      }
    }
  }
  if (auto s = CompletionError(wc); !s.ok()) return s;
  Completion c;
  c.wr_id = wc.wr_id;
  c.byte_len = wc.byte_len;
  switch (wc.opcode) {
    case IBV_WC_SEND: c.kind = Completion::Kind::kSend; break;
    case IBV_WC_RDMA_WRITE: c.kind = Completion::Kind::kWrite; break;
    case IBV_WC_RECV: c.kind = Completion::Kind::kRecv; break;
    case IBV_WC_RECV_RDMA_WITH_IMM:
      c.kind = Completion::Kind::kRecvWithImm;
      c.imm = ntohl(wc.imm_data);
      break;
    default: c.kind = Completion::Kind::kOther;
  }
  return c;
}

absl::StatusOr<std::unique_ptr<RcListener>> RcListener::Create(const std::string& addr,
                                                               uint16_t port) {
  std::unique_ptr<RcListener> listener(new RcListener);
  if (auto s = CreateCmChannelAndId(&listener->channel_, &listener->id_); !s.ok()) return s;
  rdma_cm_id* id = listener->id_.get();
  sockaddr_storage local{};
  if (auto s = ResolveSockaddr(addr, port, &local); !s.ok()) return s;
  if (rdma_bind_addr(id, reinterpret_cast<sockaddr*>(&local)) != 0) {
    return VerbsError(absl::StrCat("rdma_bind_addr(", addr, ")"), errno);
  }
  if (rdma_listen(id, /*backlog=*/16) != 0) return VerbsError("rdma_listen", errno);
  return listener;
}

uint16_t RcListener::port() const { return ntohs(rdma_get_src_port(id_.get())); }

absl::StatusOr<std::unique_ptr<RcEndpoint>> RcListener::Accept(const RcOptions& options,
                                                               absl::Duration timeout) {
  if (options.buffer_size > UINT32_MAX) return absl::InvalidArgumentError("buffer_size > 4 GiB");
  absl::Time deadline = absl::Now() + timeout;
  auto event = ExpectCmEvent(channel_.get(), RDMA_CM_EVENT_CONNECT_REQUEST, deadline);
  if (!event.ok()) return event.status();
  std::unique_ptr<RcEndpoint> ep(new RcEndpoint);
  ep->id_.reset((*event)->id);
  absl::Status advert_ok = CheckAdvert((*event)->param.conn.private_data,
                                       (*event)->param.conn.private_data_len, &ep->peer_);
  rdma_ack_cm_event(*event);
  if (!advert_ok.ok()) {
    rdma_reject(ep->id_.get(), nullptr, 0);
    return advert_ok;
  }
  // The new id reports to the listener's channel; give the endpoint a channel of its own so
  // its events (ESTABLISHED, DISCONNECTED) do not mix with other connection requests.
  auto channel = CreateCmChannel();
  if (!channel.ok()) return channel.status();
  CmIdOwner id = std::move(ep->id_);
  ep->channel_ = std::move(*channel);
  if (rdma_migrate_id(id.get(), ep->channel_.get()) != 0) {
    return VerbsError("rdma_migrate_id", errno);
  }
  ep->id_ = std::move(id);
  if (auto s = ep->SetUp(options); !s.ok()) {
    rdma_reject(ep->id_.get(), nullptr, 0);
    return s;
  }
  BufferAdvert own = ep->OwnAdvert();
  rdma_conn_param param = ConnParam(&own, sizeof(own));
  if (rdma_accept(ep->id_.get(), &param) != 0) return VerbsError("rdma_accept", errno);
  ep->connected_ = true;
  event = ExpectCmEvent(ep->channel_.get(), RDMA_CM_EVENT_ESTABLISHED, deadline);
  if (!event.ok()) return event.status();
  rdma_ack_cm_event(*event);
  return ep;
}

}  // namespace zrpc::transport
