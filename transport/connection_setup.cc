// Connection setup and teardown: resources, the Hello exchange over librdmacm, Listener.
// The datapath is in connection_datapath.cc.
#include <arpa/inet.h>

#include <algorithm>
#include <cerrno>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "transport/cm_util.h"
#include "transport/connection.h"
#include "transport/poller.h"
#include "transport/verbs_error.h"

namespace zrpc::transport {
namespace {

// Private data a rejection can carry (IB CM REJ).
constexpr size_t kMaxRejectData = 148;

// Work-queue entries a connection may have outstanding, each a potential completion.
absl::Status ValidateOptions(const ConnectionOptions& o, const Device& device) {
  auto max_wr = static_cast<uint32_t>(device.attr().max_qp_wr);
  if (o.recv_credits < kMinCredits || o.recv_credits >= max_wr) {
    return absl::InvalidArgumentError(absl::StrCat("recv_credits ", o.recv_credits,
                                                   " is not in [", kMinCredits, ", ", max_wr, ")"));
  }
  if (o.send_queue_depth < 2 * kSignalInterval || o.send_queue_depth >= max_wr) {
    return absl::InvalidArgumentError(absl::StrCat("send_queue_depth ", o.send_queue_depth,
                                                   " is not in [", 2 * kSignalInterval, ", ",
                                                   max_wr, ")"));
  }
  if (o.arena_size % kArenaAlign != 0 || o.arena_size > kMaxArenaSize) {
    return absl::InvalidArgumentError(absl::StrCat(
        "arena_size ", o.arena_size, " is not a multiple of ", kArenaAlign, " up to 1 GiB"));
  }
  return absl::OkStatus();
}

absl::StatusOr<Hello> PeerHello(const rdma_cm_event& event) {
  return DecodeHello(absl::MakeConstSpan(static_cast<const uint8_t*>(event.param.conn.private_data),
                                         event.param.conn.private_data_len));
}

// Refuses a connection request, telling the peer why (its Connect quotes it).
void Reject(rdma_cm_id* id, const absl::Status& why) {
  std::string text(why.message());
  if (text.rfind("zrpc", 0) != 0) text = "zrpc: " + text;  // the peer looks for this prefix
  text.resize(std::min(text.size(), kMaxRejectData - 1));
  rdma_reject(id, text.c_str(), static_cast<uint8_t>(text.size() + 1));
}

std::string PeerAddress(rdma_cm_id* id) {
  char text[INET6_ADDRSTRLEN] = "?";
  sockaddr* sa = rdma_get_peer_addr(id);
  if (sa->sa_family == AF_INET) {
    inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(sa)->sin_addr, text, sizeof(text));
  } else if (sa->sa_family == AF_INET6) {
    inet_ntop(AF_INET6, &reinterpret_cast<sockaddr_in6*>(sa)->sin6_addr, text, sizeof(text));
  }
  return absl::StrCat(text, ":", ntohs(rdma_get_dst_port(id)));
}

}  // namespace

Connection::Connection(Device& device, Poller& poller, ConnectionHandler* handler,
                       const ConnectionOptions& options)
    : device_(device), poller_(poller), handler_(handler), options_(options) {}

Connection::~Connection() {
  bool disconnect;
  {
    absl::MutexLock lock(&mu_);
    disconnect = state_ == State::kOpen;
  }
  if (disconnect && id_ != nullptr) rdma_disconnect(id_.get());
  // The QP goes first: once it is destroyed the NIC reads and writes none of the slots below.
  qp_.reset();
  {
    absl::MutexLock lock(&mu_);
    // Slots still owned here: receives (posted or held) and sends never retired or never posted.
    for (const InFlight& f : in_flight_) {
      if (f.slot != SlotPool::kNoSlot) static_cast<void>(device_.slots().Free(f.slot));
    }
    for (const Waiting& w : waiting_) {
      if (!w.bulk) static_cast<void>(device_.slots().Free(w.slot));
    }
  }
  for (uint32_t slot : recv_slots_) static_cast<void>(device_.slots().Free(slot));
  if (control_slot_ != SlotPool::kNoSlot) static_cast<void>(device_.slots().Free(control_slot_));
}

absl::Status Connection::CreateResources(rdma_cm_id* id) {
  if (id->verbs != device_.context()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the connection runs over ", id->verbs ? ibv_get_device_name(id->verbs->device) : "?",
        ", not over this Device's ", device_.selection().device));
  }
  if (options_.arena_size > 0) {
    arena_ = AllocatePages(options_.arena_size);
    if (arena_ == nullptr) return absl::ResourceExhaustedError("cannot allocate the receive arena");
    // The peer may write into the arena and do nothing else: no REMOTE_READ, no atomics.
    arena_mr_.reset(ibv_reg_mr(device_.pd(), arena_.get(), options_.arena_size,
                               IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE));
    if (arena_mr_ == nullptr) {
      return VerbsError(absl::StrCat("ibv_reg_mr(receive arena, ", options_.arena_size, " bytes)"),
                        errno);
    }
  }
  ibv_qp_init_attr attr{};
  attr.send_cq = poller_.cq();
  attr.recv_cq = poller_.cq();
  attr.qp_type = IBV_QPT_RC;
  attr.cap.max_send_wr = options_.send_queue_depth + 1;  // + the drain marker
  attr.cap.max_recv_wr = options_.recv_credits + 1;
  attr.cap.max_send_sge = 1;
  attr.cap.max_recv_sge = 1;
  attr.cap.max_inline_data = options_.max_inline;
  attr.sq_sig_all = 0;
  if (rdma_create_qp(id, device_.pd(), &attr) != 0) {
    // Some devices refuse a large inline request rather than granting less: ask for none.
    attr.cap.max_inline_data = 0;
    if (rdma_create_qp(id, device_.pd(), &attr) != 0) return VerbsError("rdma_create_qp", errno);
  }
  qp_.reset(id);
  max_inline_ = attr.cap.max_inline_data;
  qp_num_ = id->qp->qp_num;
  // The poller finds the connection of a cm event through this (see Poller::HandleCmEvents).
  id->context = reinterpret_cast<void*>(uintptr_t{qp_num_});

  absl::MutexLock lock(&mu_);
  send_wr_.sg_list = &send_sge_;
  send_wr_.num_sge = 1;
  send_wr_.opcode = IBV_WR_SEND;
  write_wr_.sg_list = &send_sge_;
  write_wr_.num_sge = 1;
  write_wr_.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
  write_wr_.send_flags = IBV_SEND_SIGNALED;  // the source buffer is the caller's until done
  recv_sge_.length = static_cast<uint32_t>(device_.slots().slot_size());
  recv_sge_.lkey = device_.slots().lkey();
  recv_wr_.sg_list = &recv_sge_;
  recv_wr_.num_sge = 1;
  arena_reader_ = ArenaReader(options_.arena_size);

  SlotPool& pool = device_.slots();
  control_slot_ = pool.Allocate();
  if (control_slot_ == SlotPool::kNoSlot) {
    return absl::ResourceExhaustedError("the slot pool ran out: no slot for credit frames");
  }
  for (uint32_t i = 0; i < options_.recv_credits; ++i) {
    uint32_t slot = pool.Allocate();
    if (slot == SlotPool::kNoSlot) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "the slot pool ran out: this connection needs ", options_.recv_credits,
          " slots for its receives; enlarge SlotPoolOptions::slot_count"));
    }
    recv_slots_.push_back(slot);
    recv_state_.push_back(RecvState::kIdle);
  }
  for (uint32_t i = 0; i < options_.recv_credits; ++i) {
    if (auto s = RepostRecvLocked(i); !s.ok()) return s;
  }
  return absl::OkStatus();
}

Hello Connection::OwnHello() const {
  Hello hello;
  hello.recv_credits = options_.recv_credits;
  hello.recv_size = static_cast<uint32_t>(device_.slots().slot_size());
  if (arena_mr_ != nullptr) {
    hello.arena_addr = reinterpret_cast<uintptr_t>(arena_.get());
    hello.arena_rkey = arena_mr_->rkey;
    hello.arena_size = options_.arena_size;
  }
  return hello;
}

void Connection::AcceptHello(const Hello& peer) {
  absl::MutexLock lock(&mu_);
  peer_ = peer;
  credits_ = CreditAccount(peer.recv_credits, options_.recv_credits);
  arena_writer_ = ArenaWriter(peer.arena_size);
  stats_.peer_recv_credits = peer.recv_credits;
  max_message_ = static_cast<uint32_t>(
      std::min<size_t>(device_.slots().slot_size(), peer.recv_size) - FrameHeader::kSize);
  write_wr_.wr.rdma.rkey = peer.arena_rkey;
}

void Connection::OnEstablished() {
  absl::MutexLock lock(&mu_);
  // The id already reports to the poller, which may have failed the connection (a disconnect
  // right after the handshake): then it stays failing.
  if (state_ == State::kConnecting) state_ = State::kOpen;
  // The peer may have sent before this thread saw the handshake end: the poller handles those
  // completions now, in order, on its own thread.
  if (!early_.empty()) poller_.Defer(shared_from_this());
}

absl::StatusOr<std::shared_ptr<Connection>> Connection::Connect(
    Device& device, Poller& poller, const std::string& addr, uint16_t port,
    ConnectionHandler* handler, const ConnectionOptions& options, absl::Duration timeout) {
  if (auto s = ValidateOptions(options, device); !s.ok()) return s;
  absl::Time deadline = absl::Now() + timeout;
  std::shared_ptr<Connection> c(new Connection(device, poller, handler, options));
  if (auto s = CreateCmChannelAndId(&c->setup_channel_, &c->id_); !s.ok()) return s;
  rdma_cm_id* id = c->id_.get();

  if (auto s = ResolveRoute(c->setup_channel_.get(), id, device.selection().addr, addr, port,
                            deadline);
      !s.ok()) {
    return s;
  }

  if (auto s = c->CreateResources(id); !s.ok()) return s;
  // Registered before connecting: the peer may send the moment it sees the connection.
  if (auto s = poller.Register(c); !s.ok()) return s;
  absl::Cleanup unregister = [&] { poller.Unregister(c->qp_num_); };

  uint8_t hello[Hello::kSize];
  EncodeHello(c->OwnHello(), hello);
  rdma_conn_param param = ConnParam(hello, Hello::kSize);
  if (rdma_connect(id, &param) != 0) return VerbsError("rdma_connect", errno);
  auto event = ExpectCmEvent(c->setup_channel_.get(), RDMA_CM_EVENT_ESTABLISHED, deadline);
  if (!event.ok()) return event.status();
  absl::StatusOr<Hello> peer = PeerHello(**event);
  rdma_ack_cm_event(*event);
  if (!peer.ok()) {
    rdma_disconnect(id);  // librdmacm cannot refuse an accept; hang up instead
    return peer.status();
  }
  c->AcceptHello(*peer);
  c->peer_address_ = PeerAddress(id);  // before the poller can see the id
  if (rdma_migrate_id(id, poller.cm_channel()) != 0) return VerbsError("rdma_migrate_id", errno);
  c->OnEstablished();
  std::move(unregister).Cancel();
  return c;
}

absl::StatusOr<std::unique_ptr<Listener>> Listener::Create(Device& device, const std::string& addr,
                                                           uint16_t port) {
  std::unique_ptr<Listener> listener(new Listener(device));
  if (auto s = CreateCmChannelAndId(&listener->channel_, &listener->id_); !s.ok()) return s;
  const std::string& where = addr.empty() ? device.selection().addr : addr;
  sockaddr_storage local{};
  if (auto s = ResolveSockaddr(where, port, &local); !s.ok()) return s;
  if (rdma_bind_addr(listener->id_.get(), reinterpret_cast<sockaddr*>(&local)) != 0) {
    return VerbsError(absl::StrCat("rdma_bind_addr(", where, ":", port, ")"), errno);
  }
  if (rdma_listen(listener->id_.get(), /*backlog=*/64) != 0) return VerbsError("rdma_listen", errno);
  return listener;
}

uint16_t Listener::port() const { return ntohs(rdma_get_src_port(id_.get())); }

absl::StatusOr<std::shared_ptr<Connection>> Listener::Accept(Poller& poller,
                                                             ConnectionHandler* handler,
                                                             const ConnectionOptions& options,
                                                             absl::Duration timeout) {
  if (auto s = ValidateOptions(options, device_); !s.ok()) return s;
  absl::Time deadline = absl::Now() + timeout;
  auto event = ExpectCmEvent(channel_.get(), RDMA_CM_EVENT_CONNECT_REQUEST, deadline);
  if (!event.ok()) return event.status();
  std::shared_ptr<Connection> c(new Connection(device_, poller, handler, options));
  c->id_.reset((*event)->id);
  absl::StatusOr<Hello> peer = PeerHello(**event);
  rdma_ack_cm_event(*event);
  rdma_cm_id* id = c->id_.get();
  if (!peer.ok()) {
    Reject(id, peer.status());
    return peer.status();
  }
  // The new id reports to the listener's channel; move it to a channel of its own for the rest
  // of the handshake, so its events do not mix with other connection requests.
  auto channel = CreateCmChannel();
  if (!channel.ok()) return channel.status();
  c->setup_channel_ = std::move(*channel);
  // The id must die before the channel it reports to; it now reports to setup_channel_.
  if (rdma_migrate_id(id, c->setup_channel_.get()) != 0) {
    return VerbsError("rdma_migrate_id", errno);
  }
  if (auto s = c->CreateResources(id); !s.ok()) {
    Reject(id, s);
    return s;
  }
  c->AcceptHello(*peer);
  if (auto s = poller.Register(c); !s.ok()) {
    Reject(id, s);
    return s;
  }
  absl::Cleanup unregister = [&] { poller.Unregister(c->qp_num_); };
  uint8_t hello[Hello::kSize];
  EncodeHello(c->OwnHello(), hello);
  rdma_conn_param param = ConnParam(hello, Hello::kSize);
  if (rdma_accept(id, &param) != 0) return VerbsError("rdma_accept", errno);
  event = ExpectCmEvent(c->setup_channel_.get(), RDMA_CM_EVENT_ESTABLISHED, deadline);
  if (!event.ok()) return event.status();
  rdma_ack_cm_event(*event);
  c->peer_address_ = PeerAddress(id);  // before the poller can see the id
  if (rdma_migrate_id(id, poller.cm_channel()) != 0) return VerbsError("rdma_migrate_id", errno);
  c->OnEstablished();
  std::move(unregister).Cancel();
  return c;
}

}  // namespace zrpc::transport
