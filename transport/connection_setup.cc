// Connection setup and teardown: resources, the Hello exchange over librdmacm (the accepting
// side is in listener.cc).
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
#include "transport/work_request_id.h"

namespace zrpc::transport {
namespace {
// The smallest inline size worth asking for: a frame header and as much again.
constexpr uint32_t kMinInlineRequest = 2 * FrameHeader::kSize;

// A connection keeps no copy of the keys: the handshake's session holds the one it uses.
ConnectionOptions WithoutKeys(ConnectionOptions options) {
  options.auth_keys.clear();
  return options;
}
}  // namespace

// Work-queue entries a connection may have outstanding, each a potential completion.
absl::Status Connection::ValidateOptions(const ConnectionOptions& o, const Device& device) {
  auto max_wr = static_cast<uint32_t>(device.attr().max_qp_wr);
  if (o.recv_credits < kMinCredits || o.recv_credits >= max_wr || o.recv_credits > kMaxCredits) {
    return absl::InvalidArgumentError(absl::StrCat("recv_credits ", o.recv_credits, " is not in [",
                                                   kMinCredits, ", ",
                                                   std::min(max_wr - 1, kMaxCredits), "]"));
  }
  if (o.idle_recv_credits < kMinCredits || o.idle_recv_credits > o.recv_credits) {
    return absl::InvalidArgumentError(absl::StrCat("idle_recv_credits ", o.idle_recv_credits,
                                                   " is not in [", kMinCredits, ", recv_credits (",
                                                   o.recv_credits, ")]"));
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
  if (o.arena_on_demand && o.arena_size == 0) {
    return absl::InvalidArgumentError("arena_on_demand needs an arena_size to lend");
  }
  if (o.max_send_slots == 0) return absl::InvalidArgumentError("max_send_slots must be positive");
  if (o.max_exposures == 0) return absl::InvalidArgumentError("max_exposures must be positive");
  if (o.ack_timeout_exponent < 12 || o.ack_timeout_exponent > 24) {
    return absl::InvalidArgumentError(
        absl::StrCat("ack_timeout_exponent ", o.ack_timeout_exponent,
                     " is not in [12, 24] (4.096 us x 2^exponent a try: 17 ms to 69 s)"));
  }
  if (o.retry_count < 1 || o.retry_count > kMaxRetryCount) {
    return absl::InvalidArgumentError(absl::StrCat("retry_count ", o.retry_count, " is not in [1, ",
                                                   kMaxRetryCount, "] (rxe retries 7 forever)"));
  }
  if (o.rnr_retry_count > kRnrRetryCount) {
    return absl::InvalidArgumentError(absl::StrCat("rnr_retry_count ", o.rnr_retry_count,
                                                   " is not in [0, ", kRnrRetryCount,
                                                   "] (7 retries forever)"));
  }
  if (!o.auth_keys.empty()) {
    if (absl::StatusOr<AuthKeyring> keys = AuthKeyring::Create(o.auth_keys); !keys.ok()) {
      return keys.status();
    }
    if (device.slots().slot_size() < FrameHeader::kSize + AuthFrame::kSize) {
      return absl::InvalidArgumentError(
          absl::StrCat("the device's slots of ", device.slots().slot_size(),
                       " bytes cannot carry authentication's frames (SlotPoolOptions::slot_size)"));
    }
  }
  if (device.slots().slot_size() < FrameHeader::kSize + size_t{o.min_message_size}) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the device's slots of ", device.slots().slot_size(), " bytes cannot carry the ",
        o.min_message_size, "-byte messages this connection needs (SlotPoolOptions::slot_size)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<Hello> Connection::PeerHello(const rdma_cm_event& event,
                                            const ConnectionOptions& options) {
  absl::StatusOr<Hello> hello =
      DecodeHello(absl::MakeConstSpan(static_cast<const uint8_t*>(event.param.conn.private_data),
                                      event.param.conn.private_data_len));
  if (!hello.ok()) return hello;
  // Every size this side derives from the peer's receives must leave room for what the layer
  // above needs: a peer offering less is refused here, before anything is allocated for it.
  if (absl::Status fits = CheckPeerReceives(*hello, options.min_message_size); !fits.ok()) {
    return fits;
  }
  // A peer that authenticates sends its first frame into one of these receives.
  if ((hello->flags & kHelloAuth) != 0 &&
      hello->recv_size < FrameHeader::kSize + std::max(AuthFrame::kSize, AuthOkFrame::kSize)) {
    return absl::FailedPreconditionError(
        absl::StrCat("zrpc handshake: the peer's receives of ", hello->recv_size,
                     " bytes cannot carry authentication's frames"));
  }
  return hello;
}

Connection::Connection(Device& device, Poller& poller, ConnectionHandler* handler,
                       const ConnectionOptions& options)
    : device_(device),
      poller_(poller),
      handler_(handler),
      options_(WithoutKeys(options)),
      shared_receives_(poller.srq() != nullptr),
      awaits_last_wqe_(shared_receives_ && device.awaits_last_wqe()),
      quiet_binds_(!device.binds_survive_retry()) {}

absl::StatusOr<RetryTiming> Connection::QueryRetryTiming() const {
  if (qp_ == nullptr || qp_->qp == nullptr) {
    return absl::FailedPreconditionError("the connection has no queue pair");
  }
  return transport::QueryRetryTiming(qp_->qp);
}

Connection::~Connection() {
  RunOnClosed();
  // Destroyed while draining (a poller's Shutdown that gave up on it): out of the watchdog's
  // count, or its cm thread would keep waking for it.
  LeaveDrainWatch();
  // No other thread is left: nothing holds the domain, and nothing was left in it (a thread
  // leaves an operation only while another holds the domain, and that one carries it out).
  domain_.AssertHeld();
  const bool disconnect = state_ == State::kOpen || state_ == State::kVerifying;
  if (disconnect && id_ != nullptr) rdma_disconnect(id_.get());
  // A loan's window goes before the QP it is bound to: the window holds a reference to the QP,
  // and rxe (Linux 6.1) waits up to 50 s for a destroyed QP's references to go.
  arena_window_.reset();
  static_cast<void>(exposures_.EndAll());  // reported by the drain, or never (not drained)
  // The QP goes first: once it is destroyed the NIC reads and writes none of the slots below.
  qp_.reset();
  // A loan still out goes back to the pool, its key dead with its window.
  if (arena_piece_ != kNoPiece) GivePieceBackLocked();
  {
    // Slots still owned here: receives (posted or held) and sends never retired or never posted.
    for (size_t i = 0; i < in_flight_.size(); ++i) {
      if (in_flight_[i].slot != SlotPool::kNoSlot) FreeSendSlot(in_flight_[i].slot);
    }
    for (size_t i = 0; i < waiting_.size(); ++i) {
      if (waiting_[i].kind == Waiting::kMessage) FreeSendSlot(waiting_[i].slot);
    }
  }
  // Receives of the shared queue that arrived before the handshake ended, or that the poller
  // left here, and were never handled: their slots were taken from the queue for this connection.
  if (shared_receives_) {
    for (const ibv_wc& wc : early_) FreeSharedReceiveSlot(wc);
    for (const ibv_wc& wc : stash_) FreeSharedReceiveSlot(wc);
  }
  // Posted or held (with the shared receive queue, only held ones: kNoSlot marks the others).
  for (uint32_t slot : recv_slots_) {
    if (slot != SlotPool::kNoSlot) static_cast<void>(device_.slots().Free(slot));
  }
  delete[] op_pool_.load(std::memory_order_acquire);
  if (control_slot_ != SlotPool::kNoSlot) static_cast<void>(device_.slots().Free(control_slot_));
}

void Connection::FreeSharedReceiveSlot(const ibv_wc& wc) {
  if (IsSharedReceiveId(wc.wr_id)) {
    static_cast<void>(device_.slots().Free(WorkRequestIndex(wc.wr_id)));
  }
}

absl::Status Connection::CreateResources(rdma_cm_id* id) {
  if (id->verbs != device_.context()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the connection runs over ", id->verbs ? ibv_get_device_name(id->verbs->device) : "?",
        ", not over this Device's ", device_.selection().device));
  }
  if (options_.arena_on_demand) {
    const ArenaPool* pool = poller_.arena_pool();
    if (pool == nullptr || pool->piece_size() != options_.arena_size) {
      return absl::FailedPreconditionError(absl::StrCat(
          "arena_on_demand: the poller lends ",
          pool == nullptr ? "no arenas (PollerOptions::arena_pool_pieces 0, or a device without "
                            "type-2 memory windows)"
                          : absl::StrCat("arenas of ", pool->piece_size(), " bytes"),
          ", not of arena_size ", options_.arena_size));
    }
  } else if (options_.arena_size > 0) {
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
  // Where the device's reports of this queue pair's errors go (async_events.h).
  attr.qp_context = poller_.device_events();
  attr.cap.max_send_wr = options_.send_queue_depth + 1;  // + the drain marker
  // With the poller's shared receive queue the QP has no receive queue of its own.
  attr.srq = shared_receives_ ? poller_.srq()->srq() : nullptr;
  attr.cap.max_recv_wr = shared_receives_ ? 0 : options_.recv_credits + 1;
  attr.cap.max_send_sge = 1;
  attr.cap.max_recv_sge = 1;
  attr.sq_sig_all = 0;
  // Devices refuse an inline request above their limit rather than granting less, and verbs
  // reports no limit to ask for (rxe grants 512 bytes of a 1 MiB request so): halve the request
  // until one is granted, down to none. rdma_create_qp leaves the attributes as they were when
  // it fails, so only the inline size changes between attempts.
  for (uint32_t inline_bytes = options_.max_inline;; inline_bytes /= 2) {
    if (inline_bytes < kMinInlineRequest) inline_bytes = 0;
    attr.cap.max_inline_data = inline_bytes;
    if (rdma_create_qp(id, device_.pd(), &attr) == 0) break;
    if (inline_bytes == 0) return VerbsError("rdma_create_qp", errno);
  }
  qp_.reset(id);
  max_inline_ = attr.cap.max_inline_data;
  qp_num_ = id->qp->qp_num;
  // The poller finds the connection of a cm event through this (see Poller::HandleCmEvents).
  id->context = reinterpret_cast<void*>(uintptr_t{qp_num_});

  // Not shared with any thread yet (the poller learns of it at Register, after this).
  domain_.AssertHeld();
  // Their scatter lists are the chain's (AppendLocked): one SGE each.
  send_wr_.opcode = IBV_WR_SEND;
  write_wr_.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
  write_wr_.send_flags = IBV_SEND_SIGNALED;  // the source buffer is the caller's until done
  read_wr_.opcode = IBV_WR_RDMA_READ;
  arena_reader_ = options_.arena_on_demand ? ArenaReader::OnDemand(options_.arena_size)
                                           : ArenaReader(options_.arena_size);
  arena_base_ = arena_.get();

  SlotPool& pool = device_.slots();
  control_slot_ = pool.Allocate();
  if (control_slot_ == SlotPool::kNoSlot) return pool.ExhaustedError("for credit frames");
  if (shared_receives_) {
    // Messages arrive in the queue's slots, which this table holds from delivery to Release.
    recv_slots_.assign(options_.recv_credits, SlotPool::kNoSlot);
    recv_state_.assign(options_.recv_credits, RecvState::kIdle);
    for (uint32_t i = 0; i < options_.recv_credits; ++i) recv_free_.push_back(i);
    return absl::OkStatus();
  }
  for (uint32_t i = 0; i < options_.recv_credits; ++i) {
    uint32_t slot = pool.Allocate();
    if (slot == SlotPool::kNoSlot) {
      return pool.ExhaustedError(
          absl::StrCat("for receive ", i + 1, " of ", options_.recv_credits));
    }
    recv_slots_.push_back(slot);
    recv_state_.push_back(RecvState::kIdle);
    recv_sges_.push_back(ibv_sge{reinterpret_cast<uintptr_t>(pool.data(slot)),
                                 static_cast<uint32_t>(pool.slot_size()), pool.lkey(slot)});
  }
  recv_chain_.resize(options_.recv_credits);
  for (uint32_t i = 0; i < options_.recv_credits; ++i) RepostRecvLocked(i);
  return recv_chain_length_ == 0 ? absl::OkStatus() : PostRecvChainNowLocked();
}

Hello Connection::OwnHello() const {
  Hello hello;
  hello.recv_credits = initial_window();
  if (door_.has_value()) hello.flags |= kHelloParks;  // its accept reply carries the door
  hello.max_recv_credits = options_.recv_credits;
  hello.recv_size = static_cast<uint32_t>(device_.slots().slot_size());
  if (options_.arena_on_demand) {
    hello.flags |= kHelloArenaOnDemand;  // lent by kArena frames: no address or key yet
    hello.arena_size = options_.arena_size;
  } else if (arena_mr_ != nullptr) {
    hello.arena_size = options_.arena_size;
    // Authenticating, the address and key go in this side's first frame (SendAuthFrameLocked).
    if (auth_ == nullptr) {
      hello.arena_addr = reinterpret_cast<uintptr_t>(arena_.get());
      hello.arena_rkey = arena_mr_->rkey;
    }
  }
  if (auth_ != nullptr) hello.flags |= kHelloAuth;
  return hello;
}

void Connection::AcceptHello(const Hello& peer) {
  // Setup: the poller may be holding the domain for completions that came before the handshake
  // finished (it only queues them then).
  EnterWaiting();
  peer_ = peer;
  // A window that parks starts with its floor as its size even when parked (what a knock
  // opens it by).
  OwnWindow own{shared_receives_ ? options_.idle_recv_credits : options_.recv_credits,
                options_.recv_credits, shared_receives_ ? &receive_share_ : nullptr};
  own.parks = door_.has_value();
  own.parked = start_parked_;
  own.provisional = auth_ != nullptr && accepted_;
  credits_ = CreditAccount(peer.recv_credits, peer.max_recv_credits, own);
  arena_writer_ = (peer.flags & kHelloArenaOnDemand) != 0 ? ArenaWriter::OnDemand(peer.arena_size)
                                                          : ArenaWriter(peer.arena_size);
  stats_.peer_recv_credits = peer.recv_credits;
  stats_.peer_max_recv_credits = peer.max_recv_credits;
  max_message_ = static_cast<uint32_t>(
      std::min<size_t>(device_.slots().slot_size(), peer.recv_size) - FrameHeader::kSize);
  write_wr_.wr.rdma.rkey = peer.arena_rkey;
  ExitLocked();
}

void Connection::OnEstablished() {
  EnterWaiting();
  // The id already reports to the poller, which may have failed the connection (a disconnect
  // right after the handshake): then it stays failing.
  if (state_ == State::kConnecting) {
    SetStateLocked(auth_ != nullptr ? State::kVerifying : State::kOpen);
    // The client's tag goes first, alone (its one credit: the server's Hello offers no more).
    if (auth_ != nullptr && !accepted_) {
      auth_frame_owed_ = true;
      MaybeSendCreditFrameLocked();
      PostChainLocked();
    }
  }
  // A parked window whose peer knocked before this side saw the handshake end: heard now.
  if (knock_heard_.load(std::memory_order_acquire)) OnParkRequestLocked();
  // The peer may have sent before this thread saw the handshake end: those completions are
  // handled now, in order, as this thread lets the domain go, and what they produce goes to the
  // poller (ExitLocked).
  ExitLocked();
}

absl::StatusOr<std::shared_ptr<Connection>> Connection::Connect(
    Device& device, Poller& poller, const std::string& addr, uint16_t port,
    ConnectionHandler* handler, const ConnectionOptions& options, absl::Duration timeout) {
  if (auto s = ValidateOptions(options, device); !s.ok()) return s;
  absl::Time deadline = absl::Now() + timeout;
  std::shared_ptr<Connection> c(new Connection(device, poller, handler, options));
  if (auto s = CreateCmChannelAndId(&c->setup_channel_, &c->id_); !s.ok()) return s;
  rdma_cm_id* id = c->id_.get();
  // A failed attempt gives its setup channel's file descriptor back now. The connection itself
  // may live on for a while (a poller that knew it retires it between passes, and a poller busy
  // with a thousand connections that just failed takes its time): a channel reconnecting a
  // thousand connections to a server that refuses them held a thousand descriptors at once, and
  // a process sharing the default limit of 1,024 could open nothing more (soak_scale_test: the
  // server's restart failed with EMFILE). The id moves to the poller's channel, as an
  // established one's does, with no QP number: an event of its own that comes later reaches no
  // connection (QP 0 is never an RC queue pair's).
  absl::Cleanup give_back_channel = [&] {
    id->context = nullptr;
    if (rdma_migrate_id(id, poller.cm_channel()) == 0) c->setup_channel_.reset();
  };

  if (auto s =
          ResolveRoute(c->setup_channel_.get(), id, device.selection().addr, addr, port, deadline);
      !s.ok()) {
    return s;
  }

  if (auto s = c->CreateResources(id); !s.ok()) return s;
  // Registered before connecting: the peer may send the moment it sees the connection.
  if (auto s = poller.Register(c); !s.ok()) return s;
  absl::Cleanup unregister = [&] { poller.Unregister(c->qp_num_); };

  // The Hello, and with a key the AuthRequest in the bytes it leaves (wire.h, auth.h).
  uint8_t request[AuthRequest::kOffset + AuthRequest::kSize] = {};
  size_t request_size = Hello::kSize;
  if (!options.auth_keys.empty()) {
    absl::StatusOr<AuthNonce> nonce = NewAuthNonce();
    if (!nonce.ok()) return nonce.status();
    c->auth_ = std::make_unique<AuthSession>(AuthRole::kClient, options.auth_keys.front());
    AuthTranscript& transcript = c->auth_->transcript();
    transcript.client_nonce = *nonce;
    transcript.client_qp = c->qp_num_;
    EncodeAuthRequest(AuthRequest{transcript.key_id, *nonce}, request + AuthRequest::kOffset);
    request_size = AuthRequest::kOffset + AuthRequest::kSize;
  }
  EncodeHello(c->OwnHello(), request);
  if (c->auth_ != nullptr) {
    std::copy(request, request + Hello::kSize, c->auth_->transcript().client_hello.begin());
  }
  const ibv_device_attr& attr = device.attr();
  rdma_conn_param param = ConnParam(
      request, static_cast<uint8_t>(request_size),
      static_cast<uint8_t>(std::min<int>(kMaxReadsInFlight, attr.max_qp_init_rd_atom)),
      static_cast<uint8_t>(std::min<int>(kMaxReadsInFlight, attr.max_qp_rd_atom)), options);
  if (auto s = SetAckTimeout(id, options.ack_timeout_exponent); !s.ok()) return s;
  if (rdma_connect(id, &param) != 0) return VerbsError("rdma_connect", errno);
  auto event = ExpectCmEvent(c->setup_channel_.get(), RDMA_CM_EVENT_ESTABLISHED, deadline);
  if (!event.ok()) return event.status();
  absl::StatusOr<Hello> peer = PeerHello(**event, options);
  {
    // The server's accept data, after its Hello: as many bytes as came (the CM pads with
    // zeros; a transport that does not, or an older server, may send fewer).
    const auto* data = static_cast<const uint8_t*>((*event)->param.conn.private_data);
    const size_t length = (*event)->param.conn.private_data_len;
    if (data != nullptr && length > Hello::kSize) {
      const size_t extra = std::min(length - Hello::kSize, kAcceptDataSize);
      std::copy(data + Hello::kSize, data + Hello::kSize + extra, c->peer_accept_data_.begin());
    }
    if (peer.ok() && (c->auth_ != nullptr || (peer->flags & kHelloAuth) != 0)) {
      peer = c->CheckServerAuth(**event, *std::move(peer));
    }
    // A server that parks says where to knock (wire.h, ParkDoor); one that authenticates, only
    // once it has checked this side's tag (its kAuthOk frame).
    if (peer.ok() && (peer->flags & kHelloParks) != 0 && c->auth_ == nullptr) {
      absl::StatusOr<ParkDoor> door = DecodeParkDoor(
          data != nullptr && length > ParkDoor::kOffset
              ? absl::MakeConstSpan(data + ParkDoor::kOffset, length - ParkDoor::kOffset)
              : absl::Span<const uint8_t>());
      if (door.ok()) {
        c->peer_door_ = *door;
      } else {
        peer = door.status();
      }
    }
  }
  // This queue pair's RNR retry count is the one the server put in its reply (cm_util.h).
  uint8_t rnr_retry = (*event)->param.conn.rnr_retry_count;
  rdma_ack_cm_event(*event);
  if (peer.ok() && rnr_retry > kRnrRetryCount) {
    peer = absl::FailedPreconditionError(
        absl::StrCat("zrpc handshake: the server asks for RNR retry count ", rnr_retry,
                     " (7 retries forever); at most ", kRnrRetryCount, " is accepted"));
  }
  if (!peer.ok()) {
    rdma_disconnect(id);  // librdmacm cannot refuse an accept; hang up instead
    return peer.status();
  }
  c->AcceptHello(*peer);
  c->peer_address_ = PeerAddress(id);  // before the poller can see the id
  if (rdma_migrate_id(id, poller.cm_channel()) != 0) return VerbsError("rdma_migrate_id", errno);
  // No id is left on the setup channel: its file descriptor goes now, not with the connection
  // (a client with thousands of connections would hold as many).
  c->setup_channel_.reset();
  // An event that arrived before the migration (the peer hung up at once) moved with the id but
  // woke nobody: have the poller look.
  poller.LookAtCmChannel();
  c->OnEstablished();
  // From here the poller has the connection: a failure is its to end (and, before the server
  // confirmed this side's tag, never the handler's to hear: connection_auth.cc).
  std::move(unregister).Cancel();
  std::move(give_back_channel).Cancel();
  if (c->auth_ != nullptr) {
    c->auth_->Wait(deadline);
    absl::Status verified = c->auth_->Settle(absl::DeadlineExceededError(
        "zrpc handshake: the server did not confirm this client's tag before the connect "
        "timeout"));
    if (!verified.ok()) {
      c->Close();
      return verified;
    }
  }
  return c;
}

}  // namespace zrpc::transport
