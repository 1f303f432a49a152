// ServerConnection: the server's side of one connection: requests arriving (service and method
// looked up, the call made and run), pulled requests, cancels, retiring finished calls,
// liveness, Shutdown's answers and the connection's close.

#include "rpc/server/server_connection.h"

#include <google/protobuf/wrappers.pb.h>

#include <thread>
#include <utility>

#include "absl/base/optimization.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "rpc/bulk/registration.h"
#include "rpc/common/call_clock.h"
#include "rpc/common/monotonic.h"
#include "rpc/server/server_impl.h"
#include "rpc/stream/stream_pump.h"
#include "transport/log.h"

namespace zrpc::internal {

ServerConnection::ServerConnection(ServerImpl& server, std::shared_ptr<transport::Poller> poller)
    : RpcConnection("server", server.staging(), server.receive_limits(), server.device(),
                    std::move(poller)),
      server_(server),
      intercepted_(!server.options().interceptors.empty()) {}

ServerConnection::View ServerConnection::Look() const {
  View view;
  view.age = MonotonicNow() - placed_;
  view.calls = calls_count_.load(std::memory_order_relaxed);
  view.last_error = last_error();
  std::shared_ptr<transport::Connection> connection;
  {
    absl::MutexLock lock(&mu_);
    connection = connection_;
  }
  if (connection == nullptr) return view;
  view.peer = connection->peer_address();
  view.auth_key_id = connection->auth_key_id();
  view.open = connection->open();
  view.transport = connection->TryStats();
  return view;
}

void ServerConnection::Attach(std::shared_ptr<transport::Connection> connection) {
  absl::MutexLock lock(&mu_);
  if (!closed_ && connection_ == nullptr) connection_ = std::move(connection);
}

void ServerConnection::OnMessage(transport::Connection& connection,
                                 const transport::ReceivedMessage& message) {
  IncomingMessage incoming;
  if (!Receive(connection, message, &incoming)) return;
  // The client spoke (a ping is not a word: an idle client's pings must not draw probes). One
  // store, for the sweeper (SweepPass: a connection that goes quiet after speaking is probed).
  if (incoming.header.kind != RpcKind::kRequest ||
      incoming.header.service_id != kKeepaliveServiceId) {
    spoke_.store(true, std::memory_order_relaxed);
  }
  switch (incoming.header.kind) {
    case RpcKind::kRequest:
      HandleRequest(connection, incoming);
      return;
    case RpcKind::kCancel:
      HandleCancel(connection, incoming);
      return;
    case RpcKind::kPulled:
      Discard(connection, incoming);
      Unexpose(incoming.header.call_id, incoming.header.pulled_addr());
      return;
    case RpcKind::kStreamMessage:
    case RpcKind::kHalfClose:
    case RpcKind::kStreamCredit:
      HandleStreamFrame(connection, incoming);
      return;
    default:
      Discard(connection, incoming);
      Violation(connection,
                absl::StrCat("a client sent message kind ", static_cast<int>(incoming.header.kind),
                             "; a server takes requests, cancels, pulled and stream "
                             "messages, half-closes and credits"));
  }
}

void ServerConnection::HandleRequest(transport::Connection& connection,
                                     const IncomingMessage& request) {
  const RpcHeader& header = request.header;
  auto answer_error = [&](const absl::Status& status) {
    Discard(connection, request);
    NoteError(absl::StrCat("call ", header.call_id, " refused: ", status.ToString()));
    if (absl::Status sent = SendError(connection, header.call_id, status); !sent.ok()) {
      // Refusals answered at once may outrun their way back (the client's credits): past the
      // connection's send slots, it is cut off rather than left waiting without a word.
      ZRPC_LOG(kError, "server", "cannot answer call ", header.call_id, " from ",
               connection.peer_address(), " (", sent.ToString(), "); closing");
      connection.Close();
    }
  };
  // The client's metadata (WIRE.md, "Metadata"), checked before anything else uses the request,
  // a keepalive's too: a block that breaks the rules is a violation, as a malformed header is.
  // (A pulled request comes here twice, before and after its pull: decoded both times.)
  std::unique_ptr<Metadata> client_metadata;
  if (ABSL_PREDICT_FALSE(!request.layout.metadata.empty())) {
    client_metadata = std::make_unique<Metadata>();
    if (absl::Status decoded =
            DecodeMetadataBlock(request.layout.metadata, client_metadata.get(), nullptr);
        !decoded.ok()) {
      Discard(connection, request);
      return Violation(connection, absl::StrCat("call ", header.call_id, ": ", decoded.message()));
    }
  }
  if (header.service_id == kKeepaliveServiceId) {
    // Answered here, on the poller thread, so that busy handlers never delay it: a keepalive
    // asks whether this process and its connection are alive, not whether it has spare threads.
    Discard(connection, request);
    server_.CountKeepalive();
    absl::StatusOr<transport::SendBuffer> buffer = connection.AcquireSendBuffer();
    if (buffer.ok()) {
      // The answer carries the idle interval this server asks for (rpc/WIRE.md, "Keepalive"):
      // a few bytes, within any slot; none when it has no advice, as an older server answered.
      google::protobuf::UInt32Value advice;
      advice.set_value(server_.IdleIntervalAdviceMs());
      NoteAdvice(advice.value());
      const size_t size = advice.ByteSizeLong();
      advice.SerializeWithCachedSizesToArray(Body(*buffer));
      static_cast<void>(SendMessage(connection, *buffer, RpcHeader::Response(header.call_id), size,
                                    OutgoingBulk()));
    }
    return;
  }
  if (server_.draining()) {
    return answer_error(absl::UnavailableError("the server is shutting down"));
  }
  const ServerImpl::ServiceEntry* entry = server_.FindService(header.service_id);
  if (entry == nullptr) {
    server_.CountUnimplemented();
    return answer_error(absl::UnimplementedError(absl::StrFormat(
        "this server has no service with id 0x%08x (the FNV-1a hash of the service's full "
        "name): the client and server were built from different .proto files",
        header.service_id)));
  }
  const ServiceInfo& info = entry->service->service_info();
  if (header.method_index >= info.method_count) {
    server_.CountUnimplemented();
    return answer_error(absl::UnimplementedError(
        absl::StrCat(info.full_name, " has no method with index ", header.method_index,
                     " on this server (it has ", info.method_count, ")")));
  }
  const MethodInfo& method = info.methods[header.method_index];
  // A stream's request_bulk marks its messages, never its open (rpc/streaming.h).
  if (request.bulk_size() > 0 && (!method.request_bulk || header.opens_stream())) {
    Discard(connection, request);
    return Violation(connection, absl::StrCat("call ", header.call_id, " to ", method.full_name,
                                              " carries a bulk payload the method does not take"));
  }
  if (method.streaming() != header.opens_stream()) {
    // A client built from another version of the .proto: not a violation, as for a method
    // this server lacks.
    server_.CountUnimplemented();
    return answer_error(absl::UnimplementedError(absl::StrCat(
        method.full_name, method.streaming()
                              ? " is a streaming method on this server; the client called it "
                                "as a unary one"
                              : " is a unary method on this server; the client opened a stream")));
  }
  if (absl::Status fits =
          limits().CheckMessage(request.body_size() + request.layout.metadata.size(), "request");
      !fits.ok()) {
    return answer_error(
        absl::Status(fits.code(), absl::StrCat(method.full_name, ": ", fits.message())));
  }
  if (request.pulls()) {
    // Larger than this side's arena: pulled first, then served like any request (OnPulled).
    const auto& place = server_.options().place_request_payload;
    pulled_requests_[header.call_id] = false;
    absl::Status pulling = place && request.bulk_size() > 0
                               ? PullPlaced(connection, request, method, place)
                               : StartPull(connection, request);
    if (!pulling.ok()) {
      pulled_requests_.erase(header.call_id);
      return answer_error(absl::Status(
          pulling.code(), absl::StrCat(method.full_name, ": request: ", pulling.message())));
    }
    return;
  }
  ServerCallImpl* call = nullptr;
  const bool stream = header.opens_stream();
  if (stream && streams_.contains(header.call_id)) {
    // Its frames could not be told from the other stream's: refuse the peer. (A unary request
    // that reuses an id in flight is served: both answers carry the id, the client takes the
    // first and drops the second as late, which hurts only a client that reuses ids.)
    Discard(connection, request);
    return Violation(connection, absl::StrCat("stream id ", header.call_id,
                                              " is already open on this connection"));
  }
  if (!stream || static_cast<int>(streams_.size()) < server_.options().max_streams_per_connection) {
    void* memory;
    if (call_memory_.empty()) {
      memory = ::operator new(sizeof(ServerCallImpl));
    } else {
      memory = call_memory_.back();
      call_memory_.pop_back();
    }
    // The connection outlives its calls (hold_, given up after the close and the last call).
    if (hold_ == nullptr) hold_ = connection.shared_from_this();
    call = new (memory) ServerCallImpl(*this, connection, entry->service, method,
                                       *entry->metrics[method.index], request, CallClockNanos(),
                                       stream ? server_.options().stream_window : uint16_t{0});
    if (client_metadata != nullptr) call->context().SetClientMetadata(std::move(client_metadata));
    call->place_ = calls_.size();
    calls_.push_back(call);
    calls_count_.store(calls_.size(), std::memory_order_relaxed);
    if (stream) streams_.emplace(header.call_id, call);
  }
  if (call == nullptr) {
    server_.CountStreamRefused();
    return answer_error(absl::ResourceExhaustedError(absl::StrCat(
        method.full_name, ": this connection has ", server_.options().max_streams_per_connection,
        " streams open already (ServerOptions::max_streams_per_connection)")));
  }
  server_.CallStarted();
  if (stream && entry->async_streams) {
    // An AsyncService's handler returns at once and owns the stream: no thread of its own, and
    // never inline (it parses the request and may set up work of its own).
    server_.CountAsyncStream();
    server_.pool().Submit(pool_queue_, call);
    return;
  }
  if (stream) {
    absl::Status started = server_.stream_threads().Start([call] { call->Run(); });
    if (!started.ok()) {
      server_.CountStreamRefused();
      call->Finish(
          absl::Status(started.code(), absl::StrCat(method.full_name, ": ", started.message())),
          nullptr, OutgoingBulk());
    }
    return;
  }
  if (entry->inline_methods[method.index]) {
    call->Run();
  } else {
    server_.pool().Submit(pool_queue_, call);
  }
}

absl::Status ServerConnection::PullPlaced(
    transport::Connection& connection, const IncomingMessage& request, const MethodInfo& method,
    const std::function<absl::StatusOr<PayloadPlacement>(const MethodInfo&, size_t)>& place) {
  const uint32_t size = request.bulk_size();
  if (absl::Status fits = limits().CheckBulk(size); !fits.ok()) return fits;
  absl::StatusOr<PayloadPlacement> placed = place(method, size);
  if (!placed.ok()) return placed.status();
  // Given back on every path from here: by the runtime once done, or now.
  PayloadPlacement placement = *std::move(placed);
  const BulkDestination& destination = placement.destination;
  absl::Status refused;
  if (destination.size() < size) {
    refused = absl::ResourceExhaustedError(
        absl::StrCat("ServerOptions::place_request_payload gave ", destination.size(),
                     " bytes for a ", size, "-byte payload"));
  } else if (BulkAccess::registration(destination) == nullptr ||
             BulkAccess::registration(destination)->device() != server_.device().get()) {
    refused = absl::FailedPreconditionError(
        "ServerOptions::place_request_payload gave memory not registered on this server "
        "(Server::RegisterMemory)");
  }
  if (!refused.ok()) {
    if (placement.release) placement.release();
    return refused;
  }
  return StartPullInto(
      connection, request, destination, nullptr,
      placement.release ? std::move(placement.release) : [] {});
}

void ServerConnection::OnPulled(transport::Connection& connection, IncomingMessage& message) {
  if (message.header.kind == RpcKind::kStreamMessage) return StreamPulled(connection, message);
  // The client may stop exposing the payload now (its call may have ended meanwhile: it kept
  // the payload exposed for this READ, and waits for this word).
  static_cast<void>(SendPulledWord(connection, message));
  bool cancelled = false;
  if (auto it = pulled_requests_.find(message.header.call_id); it != pulled_requests_.end()) {
    cancelled = it->second;
    pulled_requests_.erase(it);
  }
  if (cancelled) {  // given up while it was pulled: never served, nothing to answer
    server_.CountSkipped();
    Discard(connection, message);
    return;
  }
  HandleRequest(connection, message);
}

void ServerConnection::HandleCancel(transport::Connection& connection,
                                    const IncomingMessage& cancel) {
  Discard(connection, cancel);
  server_.CountCancel();
  StreamEndings later;
  if (ServerCallImpl* call = FindCall(cancel.header.call_id); call != nullptr) {
    call->GiveUp(&later);
  } else if (auto pulled = pulled_requests_.find(cancel.header.call_id);
             pulled != pulled_requests_.end()) {
    // Still being pulled: dropped when the pull is done. (Neither: the call finished while the
    // cancel travelled, and there is nothing to do.)
    pulled->second = true;
  }
  EndStreams(later);
}

void ServerConnection::Retire(ServerCallImpl* call) {
  transport::Connection& connection = *call->connection_;
  ServerCallImpl* last = calls_.back();
  last->place_ = call->place_;
  calls_[call->place_] = last;
  calls_.pop_back();
  calls_count_.store(calls_.size(), std::memory_order_relaxed);
  if (call->stream() != nullptr) streams_.erase(call->call_id());
  call->~ServerCallImpl();
  call_memory_.push_back(call);
  // The last call after the close: the connection may go (this thread still holds its domain).
  if (domain_closed_ && calls_.empty() && hold_ != nullptr) {
    connection.DropAfterExit(std::move(hold_));
  }
}

ServerCallImpl* ServerConnection::FindCall(uint64_t id) const {
  if (auto it = streams_.find(id); it != streams_.end()) return it->second;
  return FindScanned(id);
}

ServerCallImpl* ServerConnection::FindScanned(uint64_t id) const {
  for (ServerCallImpl* call : calls_) {
    if (call->call_id() == id) return call;
  }
  return nullptr;
}

ServerConnection::~ServerConnection() {
  for (void* memory : call_memory_) ::operator delete(memory);
}

void ServerConnection::OnDeferredFailed(transport::Connection& connection, const RpcHeader& header,
                                        const absl::Status& status) {
  // An answer whose payload waited for this connection's staging quota could not go when its
  // turn came (no staging memory, say): the client hears why instead of waiting.
  NoteError(absl::StrCat("call ", header.call_id, ": answer not sent: ", status.ToString()));
  if (!SendError(connection, header.call_id, status).ok()) connection.Close();
}

void ServerConnection::SweepPass(absl::Time now, const SweepLimits& limits) {
  // A payload being pulled (before its call starts) or exposed (after its call answered) is
  // work in progress too: probed if silent, never idle.
  const bool holds_calls = calls_count_.load(std::memory_order_relaxed) > 0 || Transferring();
  // An idle connection's questions take minutes to change their answer, so it is looked at every
  // eighth of the idle settings (37.5 s at the default 5 minutes), not on every pass
  // (DueForSweep): ten thousand idle connections cost the sweeper a few hundred looks a second,
  // not ten thousand. One that holds calls, or spoke lately, is looked at on every pass. Its
  // first call's request moves the arrivals, so the looks it missed while idle never make it
  // look silent.
  last_look_ = now;
  if (spoke_.exchange(false, std::memory_order_relaxed) && limits.probe > absl::ZeroDuration()) {
    spoke_since_probe_ = true;
    spoke_at_ = now;
  }
  // A client that kept saying something (pings) for twice the interval after its last word is
  // alive; it goes back to the idle looks instead of being looked at on every pass for good.
  if (spoke_since_probe_ && now - spoke_at_ >= 2 * limits.probe) spoke_since_probe_ = false;
  std::shared_ptr<transport::Connection> connection;
  {
    absl::MutexLock lock(&mu_);
    connection = connection_;
  }
  if (connection == nullptr || !connection->open()) return;
  // Pulled words that found no send slot, should no completion have freed one since (a slot
  // given back unused raises no notice).
  SendPulledBacklog(*connection);
  const transport::ConnectionStats stats = connection->stats();
  const uint64_t arrivals = stats.messages_received + stats.bulk_received;
  if (arrivals != arrivals_seen_ || quiet_since_ == absl::InfinitePast()) {
    arrivals_seen_ = arrivals;
    quiet_since_ = now;
    idle_.Heard(now);
    return;
  }
  const absl::Duration quiet = now - quiet_since_;
  // Silent for limits.probe: probed when it holds calls (again each limits.probe), and once when
  // it spoke since its last probe, calls or not. The latter is how a break that leaves this side
  // nothing to send is found: a one-way partition toward the server, under calls answered at
  // once, leaves no answer unacknowledged here to fail through the transport's retries.
  if (limits.probe > absl::ZeroDuration() && quiet >= limits.probe &&
      (spoke_since_probe_ || (holds_calls && now - last_probe_ >= limits.probe))) {
    spoke_since_probe_ = false;
    last_probe_ = now;
    server_.CountProbe();
    static_cast<void>(connection->Probe());
    if (!holds_calls) return;
  }
  // Idle counts from the first look that finds no call, not from the last request: a client
  // whose long call was just answered is not idle, however long ago it last sent something, nor
  // however late this look is (idle_since.h).
  const absl::Duration idle_for = idle_.Look(now, holds_calls);
  if (holds_calls) return;
  // The client checks within the interval this server last asked of it (at accept or in an
  // answer; it may have asked for longer than it would now, with more connections open then):
  // silence before then is a client keeping to it.
  const absl::Duration kept = IdleSilenceBeforeProbe(
      limits.idle_probe, absl::Milliseconds(advised_ms_.load(std::memory_order_relaxed)));
  const auto close = [&](const char* why, const char* option) {
    server_.CountIdleClosed();  // before the close, which the peer may see at once
    NoteError(absl::StrCat("closed: ", why, absl::FormatDuration(idle_for),
                           " (ServerOptions::", option, ")"));
    ZRPC_LOG(kInfo, "server", "closing the connection to ", connection->peer_address(), ": ", why,
             absl::FormatDuration(idle_for), " (ServerOptions::", option, ")");
    connection->Close();
  };
  if (limits.max_idle > absl::ZeroDuration() && idle_for >= limits.max_idle) {
    close("nothing received and no calls for ", "max_connection_idle");
    return;
  }
  if (arrivals == 0) {
    // A peer that connected and never said a word: no zrpc client (its first keepalive comes
    // within its idle_keepalive_interval, 20 s), or one with keepalives off that never called.
    // Closed rather than probed, so a live peer cannot hold a place by silence alone.
    if (idle_for >= kept) {  // never when idle_probe_interval is zero (kept is infinite)
      close("not a word in ", "idle_probe_interval");
    }
    return;
  }
  // A client that spoke and went quiet is asked at its NIC, which answers without its process: a
  // host that vanished fails the probe after the transport's retries, and the connection with
  // it; a live one keeps its connection, however long it stays quiet. Again after each
  // idle_silence of silence.
  const absl::Duration silence = std::max(limits.idle_silence, kept);
  if (idle_for < silence || now - last_probe_ < silence) return;
  last_probe_ = now;
  server_.CountIdleProbe();
  static_cast<void>(connection->Probe());
}

bool ServerConnection::SendsDrained() {
  std::shared_ptr<transport::Connection> connection;
  {
    absl::MutexLock lock(&mu_);
    connection = connection_;
  }
  if (connection == nullptr || !connection->open()) return true;
  if (deferred() > 0) return false;
  if (connection->stats().sends_outstanding == 0) return true;
  // The last answers may have gone unsignalled (transport::Connection::Send without a token):
  // ask for a completion behind them, or they would stay counted until traffic that never comes.
  static_cast<void>(connection->Flush());
  return false;
}

void ServerConnection::Close() {
  std::shared_ptr<transport::Connection> connection;
  {
    absl::MutexLock lock(&mu_);
    connection = connection_;
  }
  if (connection != nullptr) connection->Close();
}

namespace {

// Shutdown's answers, in the connection's domain: a call's Finish retires it there too, so every
// call seen is alive while they are given. Deletes itself.
class AnswerAllTask final : public transport::DomainTask {
 public:
  AnswerAllTask(ServerConnection& owner, absl::Status status)
      : owner_(owner), status_(std::move(status)) {}
  void RunInDomain(transport::Connection& /*connection*/) override {
    owner_.AnswerAllInDomain(status_);
    delete this;
  }

 private:
  ServerConnection& owner_;
  const absl::Status status_;
};

}  // namespace

void ServerConnection::AnswerAll(const absl::Status& status) {
  std::shared_ptr<transport::Connection> connection;
  {
    absl::MutexLock lock(&mu_);
    connection = connection_;
  }
  // Closed: its calls were given up at OnClosed, and no answer could go.
  if (connection == nullptr) return;
  // Before this returns: Shutdown then looks whether the answers have gone (SendsDrained), and a
  // task left for the poller would not have queued them yet.
  connection->RunInDomainNow(*new AnswerAllTask(*this, status));
}

void ServerConnection::AnswerAllInDomain(const absl::Status& status) {
  StreamEndings later;
  for (ServerCallImpl* call : calls_) call->AnswerFor(status, &later);
  EndStreams(later);
}

void ServerConnection::OnClosed(transport::Connection& connection, const absl::Status& why) {
  DropPending(connection);
  // This side's own closes (kCancelled) say nothing new: a violation, a sweep or a shutdown
  // noted its reason already, or there is none. A client going away is ordinary: whatever went
  // wrong before it (a refused call, say) stays the last error.
  if (why.code() != absl::StatusCode::kCancelled && !transport::IsPeerDisconnect(why)) {
    NoteError(absl::StrCat("closed: ", why.ToString()));
  }
  // A client going away (it closed, or its process died) is ordinary; anything else the
  // transport reports (a failed completion, a peer beyond its credits, a bad frame) is a fault
  // the operator needs to see, with its reason. Violations of the RPC protocol were logged when
  // they were found; this side's own closes (kCancelled) need no word.
  if (why.code() != absl::StatusCode::kCancelled && !transport::IsPeerDisconnect(why) &&
      violations() == 0) {
    ZRPC_LOG(kError, "server", "the connection to ", connection.peer_address(),
             " failed: ", why.ToString());
  }
  std::shared_ptr<transport::Connection> attached;  // dropped after the lock
  {
    absl::MutexLock lock(&mu_);
    closed_ = true;
    attached = std::move(connection_);
  }
  if (attached != nullptr) connection.DropAfterExit(std::move(attached));
  // The client is gone: its calls are no longer wanted. Their handlers still Finish them, which
  // gives their memory back (sends fail quietly on a closed connection); the last lets go of
  // hold_ (Retire).
  domain_closed_ = true;
  StreamEndings later;
  for (ServerCallImpl* call : calls_) call->GiveUp(&later);
  EndStreams(later);
  if (calls_.empty() && hold_ != nullptr) connection.DropAfterExit(std::move(hold_));
  if (violations() > 0) server_.CountViolation();
  server_.ConnectionClosed(this, connection.peer_address());  // may destroy `this`: nothing after
}

}  // namespace zrpc::internal
