#include "transport/listener.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "transport/cm_util.h"
#include "transport/log.h"
#include "transport/poller.h"
#include "transport/verbs_error.h"
#include "transport/wire.h"

namespace zrpc::transport {

absl::StatusOr<std::unique_ptr<Listener>> Listener::Create(Device& device, const std::string& addr,
                                                           uint16_t port, AcceptHandler* handler,
                                                           const ListenerOptions& options) {
  if (auto s = Connection::ValidateOptions(options.connection, device); !s.ok()) return s;
  if (handler == nullptr) return absl::InvalidArgumentError("the Listener needs an AcceptHandler");
  if (options.handshake_timeout <= absl::ZeroDuration() || options.max_connections == 0 ||
      options.max_connections_per_peer == 0 || options.backlog <= 0 ||
      options.accepts_per_second_per_peer == 0 || options.accept_burst_per_peer == 0) {
    return absl::InvalidArgumentError(
        "handshake_timeout, max_connections, max_connections_per_peer, backlog, "
        "accepts_per_second_per_peer and accept_burst_per_peer must be positive");
  }
  std::unique_ptr<Listener> listener(new Listener(device, handler, options));
  if (auto s = listener->SetAuthKeys(options.connection.auth_keys); !s.ok()) return s;
  if (auto s = CreateCmChannelAndId(&listener->channel_, &listener->id_); !s.ok()) return s;
  const std::string& where = addr.empty() ? device.selection().addr : addr;
  sockaddr_storage local{};
  if (auto s = ResolveSockaddr(where, port, &local); !s.ok()) return s;
  if (rdma_bind_addr(listener->id_.get(), reinterpret_cast<sockaddr*>(&local)) != 0) {
    return VerbsError(absl::StrCat("rdma_bind_addr(", where, ":", port, ")"), errno);
  }
  if (rdma_listen(listener->id_.get(), options.backlog) != 0) {
    return VerbsError("rdma_listen", errno);
  }
  listener->wake_ = std::make_shared<WakeFd>();
  listener->wake_->fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (listener->wake_->fd < 0) return VerbsError("eventfd", errno);
  listener->thread_ = std::thread([l = listener.get()] { l->Loop(); });
  return listener;
}

Listener::Listener(Device& device, AcceptHandler* handler, const ListenerOptions& options)
    : device_(device), handler_(handler), options_(options) {}

Listener::WakeFd::~WakeFd() {
  if (fd >= 0) close(fd);
}

void Listener::WakeFd::Wake() const {
  uint64_t one = 1;
  // Fails only when a wake-up is already pending, which is as good.
  ssize_t written = write(fd, &one, sizeof(one));
  static_cast<void>(written);
}

Listener::~Listener() {
  stop_.store(true);
  if (wake_ != nullptr && wake_->fd >= 0) wake_->Wake();
  if (thread_.joinable()) thread_.join();
  // Unfinished handshakes report to channel_, so they go before it. A poller thread may hold
  // one for the length of a completion: wait for it to let go, so the id dies here.
  // Each is reported (while its connection, which may own what was placed, still lives), so
  // that what was placed for it is freed: a server waiting for its connections to end would
  // otherwise wait for these too.
  const absl::Status stopped =
      absl::UnavailableError("the listener stopped before the handshake ended");
  for (auto& [id, handshake] : handshakes_) {
    handshake.connection->poller_.Unregister(handshake.connection->qp_num_);
    while (handshake.connection.use_count() > 1) std::this_thread::yield();
    handler_->OnRefused(handshake.connection->peer_address_, handshake.connection->handler_,
                        stopped);
  }
  handshakes_.clear();
  // Established, their tag not checked yet: their poller has them; closed, never accepted.
  for (auto& [connection, handshake] : verifying_) {
    std::shared_ptr<Connection>& c = handshake.connection;
    const absl::Status why = c->auth_->Settle(stopped);
    if (why.ok()) {
      handler_->OnAccepted(std::move(c));  // verified just now: it is the handler's
    } else {
      c->Close();
      handler_->OnRefused(c->peer_address_, c->handler_, why);
    }
  }
  verifying_.clear();
  handshake_count_.store(0, std::memory_order_relaxed);
  id_.reset();
  channel_.reset();
}

uint16_t Listener::port() const { return ntohs(rdma_get_src_port(id_.get())); }

uint32_t Listener::connections() const {
  absl::MutexLock lock(&admission_->mu);
  return admission_->total;
}

uint32_t Listener::peak_connections() const {
  absl::MutexLock lock(&admission_->mu);
  return admission_->peak;
}

size_t Listener::handshakes() const { return handshake_count_.load(std::memory_order_relaxed); }

absl::Time Listener::NextDeadline() const {
  absl::Time first = absl::InfiniteFuture();
  for (const auto& [id, handshake] : handshakes_) first = std::min(first, handshake.deadline);
  for (const auto& [c, handshake] : verifying_) first = std::min(first, handshake.deadline);
  return first;
}

void Listener::Loop() {
  while (!stop_.load(std::memory_order_relaxed)) {
    const absl::Time first = NextDeadline();
    const int timeout_ms = first == absl::InfiniteFuture() ? -1 : RemainingMs(first);
    pollfd fds[2] = {{channel_->fd, POLLIN, 0}, {wake_->fd, POLLIN, 0}};
    if (poll(fds, 2, timeout_ms) < 0 && errno != EINTR) {
      ZRPC_LOG(kError, "transport", "the listener's poll failed (errno ", errno, ")");
      absl::SleepFor(absl::Milliseconds(10));
    }
    if ((fds[1].revents & POLLIN) != 0) {
      uint64_t count = 0;
      ssize_t got = read(wake_->fd, &count, sizeof(count));  // a tag's outcome, or the stop
      static_cast<void>(got);
    }
    rdma_cm_event* event = nullptr;
    while (rdma_get_cm_event(channel_.get(), &event) == 0) OnEvent(event);
    ExpireHandshakes();
    SettleVerified();
    handshake_count_.store(handshakes_.size() + verifying_.size(), std::memory_order_relaxed);
  }
}

void Listener::OnEvent(rdma_cm_event* event) {
  rdma_cm_event_type type = event->event;
  if (type == RDMA_CM_EVENT_CONNECT_REQUEST) return OnRequest(event);
  rdma_cm_id* id = event->id;
  int status = event->status;
  rdma_ack_cm_event(event);
  switch (type) {
    case RDMA_CM_EVENT_ESTABLISHED:
      Complete(id);
      break;
    case RDMA_CM_EVENT_REJECTED:
    case RDMA_CM_EVENT_CONNECT_ERROR:
    case RDMA_CM_EVENT_UNREACHABLE:
    case RDMA_CM_EVENT_DISCONNECTED:
    case RDMA_CM_EVENT_DEVICE_REMOVAL:
      Abandon(id,
              absl::UnavailableError(absl::StrCat("the handshake ended with ", rdma_event_str(type),
                                                  " (status ", status, ")")));
      break;
    default:  // TIMEWAIT_EXIT and the like: nothing to do
      break;
  }
}

void Listener::OnRequest(rdma_cm_event* event) {
  rdma_cm_id* id = event->id;
  absl::StatusOr<Hello> hello = Connection::PeerHello(*event, options_.connection);
  // For authentication (auth.h): what the request carries after its Hello, the Hello's bytes as
  // sent, and the client's queue pair as the CM's request names it.
  const auto* data = static_cast<const uint8_t*>(event->param.conn.private_data);
  const size_t length = data != nullptr ? event->param.conn.private_data_len : 0;
  absl::StatusOr<AuthRequest> auth_request = DecodeAuthRequest(
      length > AuthRequest::kOffset
          ? absl::MakeConstSpan(data + AuthRequest::kOffset, length - AuthRequest::kOffset)
          : absl::Span<const uint8_t>());
  std::array<uint8_t, Hello::kSize> client_hello{};
  if (hello.ok()) std::copy(data, data + Hello::kSize, client_hello.begin());
  const uint32_t client_qp = event->param.conn.qp_num;
  // The count this side's queue pair will use, chosen by the peer (see the header comment).
  uint8_t rnr_retry = event->param.conn.rnr_retry_count;
  // And the transport retries both queue pairs take (the IB CM's REQ carries them).
  uint8_t retry = event->param.conn.retry_count;
  // READs: this side answers at most as many as the peer will have outstanding, and issues at
  // most as many as the peer answers, each within what the device allows.
  const ibv_device_attr& attr = device_.attr();
  const auto reads_in = static_cast<uint8_t>(
      std::min<int>({kMaxReadsInFlight, attr.max_qp_rd_atom, event->param.conn.initiator_depth}));
  const auto reads_out = static_cast<uint8_t>(std::min<int>(
      {kMaxReadsInFlight, attr.max_qp_init_rd_atom, event->param.conn.responder_resources}));
  rdma_ack_cm_event(event);
  const std::string peer = PeerAddress(id);
  const std::string ip = PeerIp(id);

  std::shared_ptr<Connection> c;
  auto refuse = [&](const absl::Status& why) {
    Reject(id, why);
    if (c == nullptr) {
      rdma_destroy_id(id);
      handler_->OnRefused(peer, nullptr, why);
      return;
    }
    c->poller_.Unregister(c->qp_num_);            // a no-op when it never registered
    handler_->OnRefused(peer, c->handler_, why);  // while `c` (which may own the handler) lives
    c.reset();  // destroys the id and gives the admission place back
  };
  if (!hello.ok()) return refuse(hello.status());
  if ((hello->flags & kHelloParks) != 0) {
    // Only the accepting side parks (its door is in its reply): a request that says it parks
    // would start the server's sending parked with nowhere to knock.
    return refuse(absl::FailedPreconditionError(
        "zrpc handshake: a connecting peer may not park the server's window (kHelloParks)"));
  }
  if (hello->recv_credits < kMinCredits) {
    // One credit is the accepting side's provisional window (auth.h); a client's is never.
    return refuse(absl::FailedPreconditionError(
        absl::StrCat("zrpc handshake: a connecting peer offers ", hello->recv_credits,
                     " receive credits, not the ", kMinCredits, " or more its window needs")));
  }
  if (rnr_retry > kRnrRetryCount) {
    return refuse(absl::FailedPreconditionError(
        absl::StrCat("zrpc handshake: peer asks for RNR retry count ", rnr_retry,
                     " (7 retries forever); at most ", kRnrRetryCount, " is accepted")));
  }
  if (retry > kMaxRetryCount) {
    return refuse(absl::FailedPreconditionError(
        absl::StrCat("zrpc handshake: peer asks for retry count ", retry,
                     " (rxe retries 7 forever); at most ", kMaxRetryCount, " is accepted")));
  }
  if (!auth_request.ok()) return refuse(auth_request.status());
  std::shared_ptr<const AuthKeyring> keys;
  {
    absl::MutexLock lock(&keys_mu_);
    keys = keys_;
  }
  absl::StatusOr<const AuthKey*> key = CheckAuthRequest(keys.get(), *auth_request, *hello);
  if (!key.ok()) return refuse(key.status());
  if (auto s = Admit(ip); !s.ok()) return refuse(s);
  absl::StatusOr<Placement> placement = handler_->Place(peer);
  if (placement.ok() && (placement->poller == nullptr || placement->handler == nullptr)) {
    placement = absl::InternalError("the AcceptHandler placed a connection nowhere");
  }
  if (!placement.ok()) {
    Leave(*admission_, ip);
    return refuse(placement.status());
  }
  c.reset(new Connection(device_, *placement->poller, placement->handler, options_.connection));
  if (*key != nullptr) {
    absl::StatusOr<AuthNonce> nonce = NewAuthNonce();
    if (!nonce.ok()) return refuse(nonce.status());
    c->auth_ = std::make_unique<AuthSession>(AuthRole::kServer, **key);
    AuthTranscript& transcript = c->auth_->transcript();
    transcript.client_nonce = auth_request->nonce;
    transcript.server_nonce = *nonce;
    transcript.client_qp = client_qp;
    transcript.client_hello = client_hello;
    c->auth_->set_on_finish([wake = wake_](const absl::Status&) { wake->Wake(); });
  }
  c->handler_owner_ = std::move(placement->owner);
  c->on_closed_ = [admission = admission_, ip] { Leave(*admission, ip); };
  c->id_.reset(id);
  c->peer_address_ = peer;  // before the poller can see the id
  if (auto s = c->CreateResources(id); !s.ok()) {
    return refuse(absl::Status(s.code(), absl::StrCat("server full: ", s.message())));
  }
  // Registered first: admission decides whether its window starts parked, which its credits
  // and its Hello say.
  c->accepted_ = true;
  if (auto s = c->poller_.Register(c); !s.ok()) {
    return refuse(absl::Status(s.code(), absl::StrCat("server full: ", s.message())));
  }
  c->AcceptHello(*hello);
  // The Hello, then the upper layer's accept data, then where to knock (wire.h) or, with a key,
  // this side's nonce and tag (auth.h: the door waits for the client's tag).
  static_assert(AuthReply::kOffset == ParkDoor::kOffset);
  uint8_t reply[AuthReply::kOffset + std::max(ParkDoor::kSize, AuthReply::kSize)] = {};
  EncodeHello(c->OwnHello(), reply);
  std::copy(placement->accept_data.begin(), placement->accept_data.end(), reply + Hello::kSize);
  size_t reply_size = ParkDoor::kOffset;
  if (c->auth_ != nullptr) {
    AuthTranscript& transcript = c->auth_->transcript();
    transcript.server_qp = c->qp_num_;
    std::copy(reply, reply + Hello::kSize, transcript.server_hello.begin());
    absl::StatusOr<AuthTag> tag = c->auth_->OwnTag();
    if (!tag.ok()) return refuse(tag.status());
    EncodeAuthReply(AuthReply{transcript.server_nonce, *tag}, reply + AuthReply::kOffset);
    reply_size += AuthReply::kSize;
  } else if (c->door_.has_value()) {
    EncodeParkDoor(c->poller_.doors()->Describe(*c->door_), reply + ParkDoor::kOffset);
    reply_size += ParkDoor::kSize;
  }
  rdma_conn_param param = ConnParam(reply, reply_size, reads_out, reads_in, options_.connection);
  if (auto s = SetAckTimeout(id, options_.connection.ack_timeout_exponent); !s.ok()) {
    return refuse(s);
  }
  if (rdma_accept(id, &param) != 0) return refuse(VerbsError("rdma_accept", errno));
  handshakes_[id] = Handshake{std::move(c), absl::Now() + options_.handshake_timeout};
}

absl::Status Listener::Admit(const std::string& ip) {
  Admission& a = *admission_;
  absl::MutexLock lock(&a.mu);
  if (a.total >= options_.max_connections) {
    return absl::ResourceExhaustedError(absl::StrCat("server full: ", a.total,
                                                     " connections open or handshaking "
                                                     "(max_connections)"));
  }
  auto it = a.per_peer.find(ip);
  if (it != a.per_peer.end() && it->second >= options_.max_connections_per_peer) {
    return absl::ResourceExhaustedError(
        absl::StrCat("server full for ", ip, ": ", it->second,
                     " connections from that address (max_connections_per_peer)"));
  }
  // The request rate last: a request refused for the places above takes no token (one refused
  // later, by the placement or for resources, keeps the token it took). A steady clock: a step
  // of the wall clock must not empty every bucket.
  const double rate = options_.accepts_per_second_per_peer;
  const double burst = options_.accept_burst_per_peer;
  const auto now = std::chrono::steady_clock::now();
  auto refilled = [&](const RequestRate& r) {
    return std::min(burst,
                    r.tokens + std::chrono::duration<double>(now - r.refilled).count() * rate);
  };
  if (a.rates.size() >= a.sweep_at) {
    absl::erase_if(a.rates, [&](const auto& entry) { return refilled(entry.second) >= burst; });
    a.sweep_at = std::max<size_t>(1024, 2 * a.rates.size());
  }
  auto [bucket, fresh] = a.rates.try_emplace(ip, RequestRate{burst, now});
  RequestRate& r = bucket->second;
  if (!fresh) {
    r.tokens = refilled(r);
    r.refilled = now;
  }
  if (r.tokens < 1) {
    // Short: the reason travels in the reject's private data, with an IPv6 address in it.
    return absl::UnavailableError(absl::StrCat("server busy for ", ip, ": over ",
                                               options_.accepts_per_second_per_peer,
                                               "/s from it (accepts_per_second_per_peer)"));
  }
  r.tokens -= 1;
  a.peak = std::max(a.peak, ++a.total);
  ++a.per_peer[ip];
  return absl::OkStatus();
}

void Listener::Leave(Admission& admission, const std::string& ip) {
  absl::MutexLock lock(&admission.mu);
  --admission.total;
  auto it = admission.per_peer.find(ip);
  if (it != admission.per_peer.end() && --it->second == 0) admission.per_peer.erase(it);
}

void Listener::Complete(rdma_cm_id* id) {
  auto it = handshakes_.find(id);
  if (it == handshakes_.end()) return;
  std::shared_ptr<Connection> c = std::move(it->second.connection);
  const absl::Time deadline = it->second.deadline;
  handshakes_.erase(it);
  Poller& poller = c->poller_;
  if (rdma_migrate_id(id, poller.cm_channel()) != 0) {
    absl::Status why = VerbsError("rdma_migrate_id", errno);
    rdma_disconnect(id);
    poller.Unregister(c->qp_num_);
    handler_->OnRefused(c->peer_address_, c->handler_, why);
    return;
  }
  // An event that arrived before the migration (the peer hung up at once) moved with the id but
  // woke nobody: have the poller look, or the connection would stay open with nobody behind it.
  poller.LookAtCmChannel();
  if (c->auth_ == nullptr) {
    c->OnEstablished();
    handler_->OnAccepted(std::move(c));
    return;
  }
  // Its tag next (SettleVerified hands it on), by the deadline its request set.
  Connection* key = c.get();
  Handshake& handshake = verifying_[key];
  handshake.connection = std::move(c);
  handshake.deadline = deadline;
  handshake.connection->OnEstablished();
}

absl::StatusOr<const AuthKey*> Listener::CheckAuthRequest(const AuthKeyring* keys,
                                                          const AuthRequest& request,
                                                          const Hello& hello) {
  const uint32_t id = request.key_id;
  if (keys == nullptr) {
    if (id == 0 && (hello.flags & kHelloAuth) == 0) return nullptr;
    auth_counts_.unexpected_key.fetch_add(1, std::memory_order_relaxed);
    return absl::FailedPreconditionError(
        absl::StrCat("zrpc handshake: the client presents key ", id,
                     ", but this server authenticates no one (it has no auth_keys)"));
  }
  if (id == 0 || (hello.flags & kHelloAuth) == 0) {
    auth_counts_.no_key.fetch_add(1, std::memory_order_relaxed);
    return absl::PermissionDeniedError(
        "zrpc handshake: this server admits only clients that present a key (auth_keys), and "
        "this one presents none");
  }
  const AuthKey* key = keys->Find(id);
  if (key == nullptr) {
    auth_counts_.unknown_key.fetch_add(1, std::memory_order_relaxed);
    return absl::PermissionDeniedError(absl::StrCat("zrpc handshake: the client presents key ", id,
                                                    ", which this server does not hold"));
  }
  if (!nonces_.Insert(id, request.nonce)) {
    auth_counts_.replay.fetch_add(1, std::memory_order_relaxed);
    return absl::PermissionDeniedError(
        absl::StrCat("zrpc handshake: the request repeats a nonce seen lately with key ", id,
                     " (a replayed handshake)"));
  }
  return key;
}

void Listener::SettleVerified() {
  std::vector<Connection*> done;
  for (const auto& [c, handshake] : verifying_) {
    if (c->auth_->finished()) done.push_back(c);
  }
  for (Connection* key : done) {
    auto it = verifying_.find(key);
    std::shared_ptr<Connection> c = std::move(it->second.connection);
    verifying_.erase(it);
    const absl::Status why = c->auth_->outcome();
    if (why.ok()) {
      auth_counts_.authenticated.fetch_add(1, std::memory_order_relaxed);
      handler_->OnAccepted(std::move(c));
      continue;
    }
    // PermissionDenied is a tag that did not match (AuthSession::CheckPeerTag); the rest, a
    // client that did not finish.
    (why.code() == absl::StatusCode::kPermissionDenied ? auth_counts_.bad_tag : auth_counts_.no_tag)
        .fetch_add(1, std::memory_order_relaxed);
    ZRPC_LOG(kWarning, "transport", "refused ", c->peer_address_, " (key ", c->auth_->key_id(),
             "): ", why.message());
    c->Close();  // its poller ends it, and tells its handler nothing (connection_auth.cc)
    handler_->OnRefused(c->peer_address_, c->handler_, why);
  }
}

Listener::AuthCounts Listener::auth_counts() const {
  AuthCounts counts;
  counts.authenticated = auth_counts_.authenticated.load(std::memory_order_relaxed);
  counts.refused_no_key = auth_counts_.no_key.load(std::memory_order_relaxed);
  counts.refused_unknown_key = auth_counts_.unknown_key.load(std::memory_order_relaxed);
  counts.refused_unexpected_key = auth_counts_.unexpected_key.load(std::memory_order_relaxed);
  counts.refused_replay = auth_counts_.replay.load(std::memory_order_relaxed);
  counts.refused_bad_tag = auth_counts_.bad_tag.load(std::memory_order_relaxed);
  counts.refused_no_tag = auth_counts_.no_tag.load(std::memory_order_relaxed);
  return counts;
}

absl::Status Listener::SetAuthKeys(std::vector<AuthKey> keys) {
  std::shared_ptr<const AuthKeyring> ring;
  if (!keys.empty()) {
    absl::StatusOr<AuthKeyring> made = AuthKeyring::Create(std::move(keys));
    if (!made.ok()) return made.status();
    ring = std::make_shared<const AuthKeyring>(*std::move(made));
  }
  absl::MutexLock lock(&keys_mu_);
  keys_ = std::move(ring);
  return absl::OkStatus();
}

void Listener::Abandon(rdma_cm_id* id, const absl::Status& why) {
  auto it = handshakes_.find(id);
  if (it == handshakes_.end()) return;
  std::shared_ptr<Connection> c = std::move(it->second.connection);
  handshakes_.erase(it);
  c->poller_.Unregister(c->qp_num_);
  handler_->OnRefused(c->peer_address_, c->handler_, why);
}

void Listener::ExpireHandshakes() {
  absl::Time now = absl::Now();
  std::vector<rdma_cm_id*> expired;
  for (const auto& [id, handshake] : handshakes_) {
    if (handshake.deadline <= now) expired.push_back(id);
  }
  const absl::Status late =
      absl::DeadlineExceededError(absl::StrCat("the peer did not finish the handshake within ",
                                               absl::FormatDuration(options_.handshake_timeout)));
  for (rdma_cm_id* id : expired) Abandon(id, late);
  // Settled here, handed on by SettleVerified (a tag checked meanwhile wins: then it is in).
  for (const auto& [c, handshake] : verifying_) {
    if (handshake.deadline <= now) c->auth_->Finish(late);
  }
}

}  // namespace zrpc::transport
