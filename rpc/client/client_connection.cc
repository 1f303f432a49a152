// ClientConnection: the client's side of one connection: sending requests, matching responses,
// keepalives, failing calls.

#include "rpc/client/client_connection.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/attributes.h"
#include "absl/base/optimization.h"
#include "absl/strings/str_cat.h"
#include "rpc/bulk/registration.h"
#include "rpc/common/call_clock.h"
#include "rpc/common/monotonic.h"
#include "rpc/connection/rpc_header.h"
#include "rpc/impl/block_cache.h"
#include "rpc/registered_memory.h"
#include "transport/log.h"

namespace zrpc::internal {

const MethodInfo kKeepalivePing = {"zrpc.Keepalive/Ping", 0, false, false, false, false, false};

void ClientCall::End(absl::Status status) {
  // The request payload's gate, then the destination's: End withdraws a payload exposed for the
  // server to pull, and lets no READ into the destination start; the ending waits for what
  // is still under way, then comes back here for the next gate.
  for (std::shared_ptr<BulkGate>* pending : {&gate, &landing}) {
    if (std::shared_ptr<BulkGate> held = std::move(*pending)) {
      held->End();
      held->AfterRelease([call = std::move(*this), status = std::move(status)]() mutable {
        call.End(std::move(status));
      });
      return;
    }
  }
  if (metrics != nullptr) {
    metrics->OnFinishNanos(status.ok() ? absl::StatusCode::kOk : status.code(),
                           CallClockNanos() - start_nanos);
  }
  done(std::move(status));
}

void ClientConnection::Attach(std::shared_ptr<transport::Connection> connection) {
  connection_ = std::move(connection);
  // The server's keepalive advice from its accept reply, until an answer to a ping says more.
  server_idle_interval_ms_.store(AcceptDataIdleIntervalMs(connection_->peer_accept_data()),
                                 std::memory_order_relaxed);
  absl::MutexLock lock(&self_mu_);
  // A connection that closed at once (OnClosed ran on the poller already) must not keep itself.
  if (!closed()) self_ = shared_from_this();
}

CallTiming StartTiming(const CallOptions& options) {
  CallTiming timing;
  timing.start_nanos = timing.now_nanos = CallClockNanos();
  const absl::Time start = absl::FromUnixNanos(timing.start_nanos);
  if (options.timeout != absl::InfiniteDuration()) {
    timing.deadline = start + std::max(options.timeout, absl::ZeroDuration());
  }
  if (options.deadline != absl::InfiniteFuture()) {
    timing.deadline = std::min(timing.deadline, ToMonotonic(options.deadline, start));
  }
  return timing;
}

uint64_t ClientConnection::Start(uint32_t service_id, const transport::SendBuffer& buffer,
                                 size_t body_size, OutgoingBulk&& large_body, OutgoingBulk&& bulk,
                                 ClientCall&& call, const CallOptions& options,
                                 const CallTiming& timing, uint16_t stream_window) {
  return Begin(service_id, &buffer, nullptr, body_size, std::move(large_body), std::move(bulk),
               std::move(call), options, timing, stream_window);
}

uint64_t ClientConnection::StartWaiting(uint32_t service_id, uint8_t* body, size_t block,
                                        size_t body_size, OutgoingBulk&& bulk, ClientCall&& call,
                                        const CallOptions& options, const CallTiming& timing) {
  // Larger than a slot: the request will go at the front of a payload, as Start's would (WIRE.md,
  // "Messages larger than a slot"), so it is that payload from here on, behind the call's gate.
  // The metadata block (if any) stays for the SEND, copied out of the body's memory.
  OutgoingBulk large_body;
  if (!FitsSlot(*connection_, block + body_size)) {
    uint8_t* metadata = nullptr;
    if (block > 0) {
      metadata = static_cast<uint8_t*>(std::malloc(block));
      if (metadata == nullptr) {
        std::free(body);
        bulk.Reset();
        call.End(absl::ResourceExhaustedError("out of memory for a request's metadata"));
        return 0;
      }
      std::memcpy(metadata, body, block);
    }
    large_body = OutgoingBulk(body + block, body_size, [body] { std::free(body); });
    body = metadata;
    body_size = 0;
  }
  body_size += block;
  return Begin(service_id, nullptr, body, body_size, std::move(large_body), std::move(bulk),
               std::move(call), options, timing, 0);
}

// What StartInDomain works on, by reference: the objects Begin was given (the channel's, taken by
// reference so that a call's parts are not moved from frame to frame) when the caller is in the
// domain already (a done-callback starting the next call: nothing moved or allocated), else a
// StartCall's.
struct ClientConnection::StartRequest {
  uint64_t id;
  uint32_t service_id;
  const transport::SendBuffer* buffer;  // null: the request waits for a slot (waiting_body)
  uint8_t*& waiting_body;               // StartWaiting's, malloc'd
  size_t body_size;
  OutgoingBulk& large_body;
  OutgoingBulk& bulk;
  ClientCall& call;
  const std::shared_ptr<Cancellation>& cancellation;
  absl::Time deadline;
  int64_t now_nanos;  // the call clock's reading at the call's start
  uint16_t stream_window;
  // Where an application thread's start puts its stream, to be marked opened after the exit
  // (StartCall::AfterExit); null where it is marked at once (a runtime thread).
  std::shared_ptr<StreamState>* open_after_exit;
};

// A call's start carried into the domain from outside it: from the connection's pool (made on the
// caller's thread, given back by whichever thread ran it: ObjectPool), run or left by RunInDomain,
// and given back after the exit, with the reference that kept the connection alive while it was
// left.
struct ClientConnection::StartCall final : transport::DomainTask, transport::ExitTask {
  void RunInDomain(transport::Connection& /*connection*/) override {
    StartRequest request{id,           service_id, has_buffer ? &buffer : nullptr,
                         waiting_body, body_size,  large_body,
                         bulk,         call,       cancellation,
                         deadline,     now_nanos,  stream_window,
                         &opened};
    hold->StartInDomain(request);
    hold->connection_->RunAfterExit(*this);
  }
  void AfterExit() override {
    // Outside the domain: the stream's listener (a pump) may send, and wait for room to.
    if (opened != nullptr) std::exchange(opened, nullptr)->MarkOpened();
    // What it held goes now; the connection's reference last, after the object is given back
    // (the pool is the connection's, and another thread may take the object at once).
    std::shared_ptr<ClientConnection> self = std::move(hold);
    cancellation.reset();
    call = ClientCall();
    // A start refused for the waiting queue left them: the release ends the call (its gate).
    large_body.Reset();
    bulk.Reset();
    if (self->start_pool_.Owns(this)) {
      self->start_pool_.Give(this);
    } else {
      delete this;
    }
  }
  static void* operator new(size_t size) { return TakeBlock(size); }
  static void operator delete(void* block, size_t size) noexcept { GiveBlock(block, size); }

  std::shared_ptr<ClientConnection> hold;  // keeps the connection while the start may be left
  uint64_t id = 0;
  uint32_t service_id = 0;
  transport::SendBuffer buffer{};
  bool has_buffer = false;
  uint8_t* waiting_body = nullptr;  // StartWaiting's, malloc'd
  size_t body_size = 0;
  OutgoingBulk large_body;
  OutgoingBulk bulk;
  ClientCall call;
  std::shared_ptr<Cancellation> cancellation;
  absl::Time deadline;
  int64_t now_nanos;  // the call clock's reading at the call's start
  uint16_t stream_window = 0;
  std::shared_ptr<StreamState> opened;  // to mark opened after the exit (StartRequest)
};

ClientConnection::ClientConnection(ClientConnectionOwner& owner, uint32_t max_calls,
                                   absl::Duration pull_grace,
                                   std::shared_ptr<transport::Device> device,
                                   std::shared_ptr<transport::Poller> poller)
    : RpcConnection("client", owner.staging(), owner.receive_limits(), std::move(device),
                    std::move(poller)),
      owner_(owner),
      calls_(max_calls),
      expire_(*this),
      pull_grace_(pull_grace),
      keepalive_(reinterpret_cast<uintptr_t>(this) ^ static_cast<uint64_t>(MonotonicNanos()),
                 MonotonicNow()),
      max_pending_cancels_(max_calls) {}

ClientConnection::~ClientConnection() = default;

// A call to end in the domain (AbortCall, OnDeferredFailed) from a thread outside it.
struct ClientConnection::EndCall final : transport::DomainTask, transport::ExitTask {
  EndCall(std::shared_ptr<ClientConnection> c, uint64_t call_id, absl::Status why, bool tell)
      : hold(std::move(c)), id(call_id), status(std::move(why)), tell_server(tell) {}
  void RunInDomain(transport::Connection& /*connection*/) override {
    hold->AbortInDomain(id, std::move(status), tell_server);
    hold->connection_->RunAfterExit(*this);
  }
  void AfterExit() override { delete this; }
  static void* operator new(size_t size) { return TakeBlock(size); }
  static void operator delete(void* block, size_t size) noexcept { GiveBlock(block, size); }

  std::shared_ptr<ClientConnection> hold;
  const uint64_t id;
  absl::Status status;
  const bool tell_server;
};

// A call that ended in the domain on an application thread: its ending runs after the exit.
struct ClientConnection::Ending final : transport::ExitTask {
  Ending(ClientCall c, absl::Status why) : call(std::move(c)), status(std::move(why)) {}
  void AfterExit() override {
    call.End(std::move(status));
    delete this;
  }
  static void* operator new(size_t size) { return TakeBlock(size); }
  static void operator delete(void* block, size_t size) noexcept { GiveBlock(block, size); }

  ClientCall call;
  absl::Status status;
};

template <typename Task>
void ClientConnection::RunTask(Task* task) {
  connection_->RunInDomain(*task);
}

void ClientConnection::EndInDomain(ClientCall call, absl::Status status) {
  if (OnRuntimeThread()) {
    call.End(std::move(status));
    return;
  }
  connection_->RunAfterExit(*new Ending(std::move(call), std::move(status)));
}

uint64_t ClientConnection::Begin(uint32_t service_id, const transport::SendBuffer* buffer,
                                 uint8_t* waiting_body, size_t body_size, OutgoingBulk&& large_body,
                                 OutgoingBulk&& bulk, ClientCall&& call, const CallOptions& options,
                                 const CallTiming& timing, uint16_t stream_window) {
  // The call's times were fixed at its start (CallTiming): no clock read here, and the request's
  // remaining time goes on the wire from the same reading (unless staging defers it).
  const int64_t now = timing.now_nanos;
  call.start_nanos = timing.start_nanos;
  if (call.metrics != nullptr) {
    call.metrics->OnStart();
    call.metrics->AddMessageBytes(body_size + large_body.size(), 0);
    call.metrics->AddBulkBytes(bulk.size(), 0);
  }
  // The call ends only once the runtime reads neither its payload nor its large body.
  const int held = (bulk.empty() ? 0 : 1) + (large_body.empty() ? 0 : 1);
  if (held > 0) {
    call.gate = std::make_shared<BulkGate>(held);
    for (OutgoingBulk* part : {&bulk, &large_body}) {
      if (!part->empty()) BulkAccess::ChainRelease(*part, [gate = call.gate] { gate->Released(); });
    }
  }
  // Refused before the domain, on the caller's thread, as a call that never started.
  absl::Status refused;
  if (timing.deadline <= absl::FromUnixNanos(now)) {
    refused = absl::DeadlineExceededError(
        absl::StrCat(call.method->full_name, ": the deadline passed before the call was sent"));
  } else if (options.cancellation != nullptr && options.cancellation->cancelled()) {
    refused = absl::CancelledError(
        absl::StrCat(call.method->full_name, ": cancelled before it was sent"));
  }
  if (!refused.ok()) {
    if (buffer != nullptr) connection_->ReleaseSendBuffer(*buffer);
    std::free(waiting_body);
    bulk.Reset();  // before done: the caller may reuse the bytes once it runs
    large_body.Reset();
    call.End(std::move(refused));
    return 0;
  }
  if (connection_->InDomain()) {
    // A done-callback starting the next call, in its batch: at once, nothing moved or allocated.
    const uint64_t id = ids_.NextInDomain();
    StartRequest request{id,         service_id,    buffer, waiting_body,         body_size,
                         large_body, bulk,          call,   options.cancellation, timing.deadline,
                         now,        stream_window, nullptr};
    StartInDomain(request);
    return id;
  }
  const uint64_t id = ids_.NextShared();
  StartCall* start = start_pool_.Take();
  if (start == nullptr) start = new StartCall;  // more left at once than the pool holds
  start->id = id;
  start->service_id = service_id;
  start->has_buffer = buffer != nullptr;
  if (buffer != nullptr) start->buffer = *buffer;
  start->waiting_body = waiting_body;
  start->body_size = body_size;
  start->large_body = std::move(large_body);
  start->bulk = std::move(bulk);
  start->call = std::move(call);
  start->cancellation = options.cancellation;
  start->deadline = timing.deadline;
  start->now_nanos = now;
  start->stream_window = stream_window;
  start->hold = shared_from_this();
  RunTask(start);
  return id;
}

void ClientConnection::StartInDomain(StartRequest& start) {
  const CallClockScope clock(start.now_nanos);
  ClientCall& call = start.call;
  const char* method_name = call.method->full_name;
  BulkGate* const gate = call.gate.get();  // the call (in the table) keeps it alive
  auto fail = [&](absl::Status status) {
    if (start.buffer != nullptr) connection_->ReleaseSendBuffer(*start.buffer);
    std::free(std::exchange(start.waiting_body, nullptr));
    start.bulk.Reset();  // before done: the caller may reuse the bytes once it runs
    start.large_body.Reset();
    EndInDomain(std::move(call), std::move(status));
  };
  // OnClosed (in this domain) has failed every call in the table: one added now would never end.
  if (closed()) {
    // As the calls OnClosed failed: UNAVAILABLE, or CANCELLED when the channel is being destroyed.
    const absl::Status why = owner_.CloseStatus(
        connection_->peer_address(), absl::UnavailableError("the connection is closing"));
    return fail(absl::Status(why.code(), absl::StrCat(method_name, ": ", why.message())));
  }
  const uint16_t method_index = static_cast<uint16_t>(call.method->index);
  const bool pull_response = call.landing != nullptr;
  const bool sends_metadata = call.sends_metadata;
  const std::shared_ptr<StreamState> stream = call.stream;
  // A keepalive asks how long the server takes to answer, so its time counts from here, where it
  // is sent: a start left in the domain (the timer's, while another thread held it) waited for
  // that thread and then for the poller, time that says nothing about the server.
  const absl::Time deadline =
      start.service_id == kKeepaliveServiceId
          ? CallClockRefresh() + (start.deadline - absl::FromUnixNanos(start.now_nanos))
          : start.deadline;
  if (absl::Status inserted = calls_.Insert(start.id, std::move(call), deadline); !inserted.ok()) {
    return fail(absl::ResourceExhaustedError(
        absl::StrCat(method_name, ": ", inserted.message(), " (max_calls_per_connection)")));
  }
  if (deadline != absl::InfiniteFuture()) owner_.DeadlineAdded(deadline);
  const uint64_t id = start.id;
  RpcHeader request_header =
      start.stream_window > 0
          ? RpcHeader::StreamOpen(start.service_id, method_index, id, 0, start.stream_window)
          : RpcHeader::Request(start.service_id, method_index, id, 0);
  if (pull_response) request_header.flags |= kRpcFlagPullResponse;
  if (sends_metadata) request_header.flags |= kRpcFlagMetadata;
  absl::Status sent;
  if (start.buffer != nullptr) {
    // The remaining time goes on the wire as late as the RPC layer can set it: after staging.
    sent = SendMessage(*connection_, *start.buffer, request_header, start.body_size,
                       std::move(start.bulk), std::move(start.large_body), deadline, gate);
  } else {
    absl::MutexLock lock(&waiting_mu_);
    const size_t bytes = start.body_size + start.large_body.size();
    if (waiting_bytes_ + bytes > kMaxWaitingBytes) {
      sent = absl::ResourceExhaustedError(absl::StrCat(
          "the call waits for a send slot (every one is in flight, and a runtime thread does not "
          "wait), behind ",
          waiting_bytes_, " bytes of requests already waiting on this connection; at most ",
          kMaxWaitingBytes, " wait"));
    } else {
      waiting_.push_back(WaitingRequest{
          id, request_header, std::exchange(start.waiting_body, nullptr), start.body_size,
          std::move(start.large_body), std::move(start.bulk), deadline, gate, bytes});
      waiting_bytes_ += bytes;
      waiting_count_.store(waiting_.size(), std::memory_order_release);
      owner_.CountWaitedForSlot();
    }
    // Not queued: the call ends below, once its payloads are let go (its gate waits for them),
    // after this thread leaves the domain (StartCall::AfterExit, or the caller's objects that Begin
    // was given).
    if (!sent.ok()) std::free(std::exchange(start.waiting_body, nullptr));
  }
  if (sent.ok()) {
    // Its frames may follow now. On an application thread, after the exit: the stream's listener
    // may send at once, and wait for room to, which must not happen inside the domain.
    if (stream != nullptr) {
      if (start.open_after_exit != nullptr && !OnRuntimeThread()) {
        *start.open_after_exit = stream;
      } else {
        stream->MarkOpened();
      }
    }
    if (start.cancellation != nullptr) {
      // Set in the domain, after the call entered the table: a Cancel() that came first runs the
      // hook at once (here, so AbortCall ends the call at once too). A stale id makes a late
      // Cancel() harmless.
      std::weak_ptr<ClientConnection> weak = weak_from_this();
      start.cancellation->SetHook([weak, id] {
        if (std::shared_ptr<ClientConnection> self = weak.lock()) self->CancelCall(id);
      });
    }
    if (start.buffer == nullptr) {
      // The timer's pass is the fallback for a slot given back without a completion.
      connection_->NotifyWhenSendSlotFree();
      // Not SendWaiting here: it may end other calls, and this thread runs a callback.
      owner_.DeadlineAdded(MonotonicNow() + SlotRetry());
    }
    return;
  }
  // Not sent: the call ends here, unless something else took it from the table first (the
  // connection failing under the send, whose OnClosed comes in this domain too).
  if (CallTable<ClientCall>::Taken taken = calls_.Take(id)) {
    if (sent.code() == absl::StatusCode::kFailedPrecondition ||
        sent.code() == absl::StatusCode::kCancelled) {
      sent = absl::UnavailableError(sent.message());
    }
    EndInDomain(std::move(*taken),
                absl::Status(sent.code(), absl::StrCat(method_name, ": ", sent.message())));
  }
}

void ClientConnection::SendWaiting() {
  if (waiting_count_.load(std::memory_order_acquire) == 0) return;
  {
    absl::MutexLock lock(&waiting_mu_);
    // One thread sends at a time, so that requests leave in order; another that comes meanwhile
    // leaves the work to it (and never waits for it).
    if (sending_waiting_) {
      send_waiting_again_ = true;
      return;
    }
    sending_waiting_ = true;
  }
  bool sweep = true;
  for (;;) {
    std::vector<WaitingRequest> dropped;
    std::optional<WaitingRequest> next;
    transport::SendBuffer buffer;
    bool finished = false;
    {
      absl::MutexLock lock(&waiting_mu_);
      // This look covers what another thread asked for meanwhile.
      sweep = sweep || send_waiting_again_;
      send_waiting_again_ = false;
      // Those whose calls ended meanwhile (deadline, cancel) go first, wherever they wait: a call
      // with a payload ends only once its payload is released. The whole queue once per pass
      // (and again when another thread asked for a look), and otherwise up to the first live one,
      // so that a request whose call ended is never sent.
      for (auto it = waiting_.begin(); it != waiting_.end();) {
        if (calls_.Live(it->id)) {
          if (!sweep) break;
          ++it;
          continue;
        }
        waiting_bytes_ -= it->bytes;
        dropped.push_back(std::move(*it));
        it = waiting_.erase(it);
      }
      if (!waiting_.empty()) {
        absl::StatusOr<transport::SendBuffer> acquired = connection_->AcquireSendBuffer();
        if (acquired.ok()) {
          buffer = *acquired;
          next.emplace(std::move(waiting_.front()));
          waiting_.pop_front();
          waiting_bytes_ -= next->bytes;
        } else if (acquired.status().code() == absl::StatusCode::kResourceExhausted && open()) {
          connection_->NotifyWhenSendSlotFree();
          owner_.DeadlineAdded(MonotonicNow() + SlotRetry());
        }  // else closing: OnClosed drops the rest
      }
      waiting_count_.store(waiting_.size(), std::memory_order_release);
      sweep = false;
      if (!next) {
        finished = true;
        sending_waiting_ = false;
      }
    }
    // Outside the lock: a payload's release may end its call, whose callback may start another.
    for (WaitingRequest& request : dropped) request.Drop();
    if (finished) return;
    if (next->body_size > 0) std::memcpy(Body(buffer), next->body, next->body_size);
    std::free(std::exchange(next->body, nullptr));
    absl::Status sent =
        SendMessage(*connection_, buffer, next->header, next->body_size, std::move(next->bulk),
                    std::move(next->large_body), next->deadline, next->gate);
    if (sent.ok()) continue;
    if (CallTable<ClientCall>::Taken taken = calls_.Take(next->id)) {
      // As Start's: the connection closing (or closed) is UNAVAILABLE.
      const absl::StatusCode code = sent.code() == absl::StatusCode::kFailedPrecondition ||
                                            sent.code() == absl::StatusCode::kCancelled
                                        ? absl::StatusCode::kUnavailable
                                        : sent.code();
      const char* method_name = taken->method->full_name;
      EndInDomain(std::move(*taken),
                  absl::Status(code, absl::StrCat(method_name, ": ", sent.message())));
    }
  }
}

void ClientConnection::DropWaitingCall(uint64_t id) {
  if (waiting_count_.load(std::memory_order_acquire) == 0) return;
  std::optional<WaitingRequest> dropped;
  {
    absl::MutexLock lock(&waiting_mu_);
    for (auto it = waiting_.begin(); it != waiting_.end(); ++it) {
      if (it->id != id) continue;
      waiting_bytes_ -= it->bytes;
      dropped.emplace(std::move(*it));
      waiting_.erase(it);
      waiting_count_.store(waiting_.size(), std::memory_order_release);
      break;
    }
  }
  if (!dropped) return;
  dropped->Drop();
}

void ClientConnection::DropWaiting() {
  std::deque<WaitingRequest> dropped;
  {
    absl::MutexLock lock(&waiting_mu_);
    dropped.swap(waiting_);
    waiting_bytes_ = 0;
    waiting_count_.store(0, std::memory_order_release);
  }
  for (WaitingRequest& request : dropped) request.Drop();
}

void ClientConnection::OnSendSlotFree(transport::Connection& connection) {
  // Unary requests queued for a slot go first, in order; then cancels, then the streams' pumps.
  SendWaiting();
  if (cancels_pending_.load(std::memory_order_acquire)) FlushCancels();
  RpcConnection::OnSendSlotFree(connection);
}

void ClientConnection::CancelCall(uint64_t id) {
  AbortCall(id, absl::CancelledError("cancelled by the caller"));
}

void ClientConnection::AbortCall(uint64_t id, absl::Status status) {
  if (connection_->InDomain()) return AbortInDomain(id, std::move(status), /*tell_server=*/true);
  auto* task = new EndCall(shared_from_this(), id, std::move(status), /*tell_server=*/true);
  // A runtime thread may wait for the call's end right after (a stream destroyed in a
  // done-callback waits for it): left, the task would go to this connection's poller, perhaps
  // this very thread.
  if (OnRuntimeThread()) return connection_->RunInDomainNow(*task);
  RunTask(task);
}

void ClientConnection::AbortInDomain(uint64_t id, absl::Status status, bool tell_server) {
  CallTable<ClientCall>::Taken call = calls_.Take(id);
  if (!call) return;
  if (tell_server) {
    if (call->gate) Withdraw(*connection_, id, *call->gate);
    DropWaitingCall(id);  // never sent now; its payload (if any) released, which may end it
    SendCancel(id);
  }
  const char* method_name = call->method->full_name;
  EndInDomain(std::move(*call),
              absl::Status(status.code(), absl::StrCat(method_name, ": ", status.message())));
}

bool ClientConnection::SendOnStream(uint64_t id, const RpcHeader& header,
                                    const google::protobuf::MessageLite* message,
                                    StreamState& stream, bool quota_taken, bool* no_slot,
                                    OutgoingBulk* bulk) {
  if (!stream.opened()) {
    // The opening request was left in the domain and has not gone yet: nothing may overtake it.
    if (OnRuntimeThread()) {
      if (no_slot != nullptr) {
        *no_slot = true;  // the pump tries again (it hears of the opening, or the timer's pass)
        return false;
      }
    } else if (!stream.WaitOpened()) {
      return false;  // ended before it opened: its end says why
    }
  }
  const absl::Status sent = SendStreamFrame(
      *connection_, header, message, message == nullptr ? 0 : message->ByteSizeLong(),
      [&stream] { return stream.sends_over(); }, 0, quota_taken, no_slot, bulk);
  if (sent.ok()) return true;
  if ((no_slot != nullptr && *no_slot) || sent.code() == absl::StatusCode::kCancelled) {
    return false;  // tried again later; or the stream ended, and its end says why
  }
  AbortCall(id, sent);
  return false;
}

bool ClientConnection::WindowHeld(bool arena_counts) {
  if (Transferring()) return true;  // a large payload moves: pings would queue behind it
  // The timer does not wait for the domain: a user's callback on the poller may hold it for as
  // long as it runs, and every deadline of the channel would wait with it. Held, it counts as a
  // held window (the NIC is asked instead, without waiting), since this side is busy.
  const std::optional<transport::ConnectionStats> stats = connection_->TryStats();
  if (!stats) return true;
  // A bulk WRITE or READ still moving (64 MiB took 2 s under emulation) holds the send queue:
  // a ping posted now waits behind it.
  return stats->waiting > 0 || (arena_counts && stats->arena_in_use > 0) ||
         stats->transfer_bytes_in_flight > 0;
}

bool ClientConnection::Busy() {
  // Calls that timed out since the last pass left no trace in the table: a server that hangs
  // while its NIC still acks would look idle between calls that each time out in under a pass.
  const uint64_t expired = expired_.load(std::memory_order_relaxed);
  const bool expired_since = expired != expired_at_last_pass_;
  expired_at_last_pass_ = expired;
  return expired_since || calls_in_flight() > 0 ||
         waiting_count_.load(std::memory_order_acquire) > 0 ||
         cancels_pending_.load(std::memory_order_acquire) ||
         exposed_entries_.load(std::memory_order_relaxed) > 0 || Transferring();
}

void ClientConnection::Keepalive(KeepalivePass& pass) {
  const bool ping_out = ping_out_.load(std::memory_order_acquire);
  const bool busy = Busy();
  if (!keepalive_.Due(
          pass, received_.load(std::memory_order_relaxed), busy, ping_out || closed(),
          absl::Milliseconds(server_idle_interval_ms_.load(std::memory_order_relaxed)))) {
    return;
  }
  // An idle connection is pinged even while its application holds received payloads (no answer
  // of the server's can wait for that arena space behind the ping when no call is in flight; a
  // late answer to a timed-out call might, and then a ping that times out probes instead of
  // closing: OnPingDone): a ping is a word the server hears, and spares it probing this side.
  if (WindowHeld(/*arena_counts=*/busy)) {
    // A ping would wait behind the held window (see the top of client_connection.h).
    static_cast<void>(connection_->Probe());
    return;
  }
  if (ping_out_.exchange(true, std::memory_order_acq_rel)) return;
  absl::StatusOr<transport::SendBuffer> buffer = connection_->AcquireSendBuffer();
  if (!buffer.ok()) {
    ping_out_.store(false, std::memory_order_release);
    keepalive_.NotChecked(pass);
    return;  // every slot is in flight: traffic is moving or about to fail on its own
  }
  const absl::Duration timeout = pass.timeout;
  ClientCall ping;
  ping.method = &kKeepalivePing;
  ping.metrics = pass.metrics;
  ping.response = &ping_reply_;
  std::weak_ptr<ClientConnection> weak = weak_from_this();
  ping.done = [weak, timeout](absl::Status status) {
    if (std::shared_ptr<ClientConnection> self = weak.lock()) self->OnPingDone(status, timeout);
  };
  const CallOptions options = CallOptions::Timeout(timeout);
  Start(kKeepaliveServiceId, *buffer, 0, OutgoingBulk(), OutgoingBulk(), std::move(ping), options,
        StartTiming(options));
}

void ClientConnection::OnPingDone(const absl::Status& status, absl::Duration timeout) {
  if (status.ok()) {
    server_idle_interval_ms_.store(ping_reply_.value(), std::memory_order_relaxed);
  }
  ping_out_.store(false, std::memory_order_release);
  if (status.code() != absl::StatusCode::kDeadlineExceeded) return;
  if (WindowHeld()) {
    // The window filled while the ping was out, so it may be waiting behind it: not proof of a
    // dead server. The NIC is asked instead.
    static_cast<void>(connection_->Probe());
    return;
  }
  // The flow-control state says whether the connection was stalled or the server silent.
  Close(absl::StrCat("keepalive: no answer from the server within ", absl::FormatDuration(timeout),
                     " (", connection_->DebugString(), ")"));
}

void ClientConnection::Close(absl::string_view reason) {
  {
    absl::MutexLock lock(&reason_mu_);
    if (close_reason_.empty()) close_reason_ = std::string(reason);
  }
  ZRPC_LOG(kWarning, "client", "closing the connection to ", connection_->peer_address(), ": ",
           reason);
  connection_->Close();
}

bool ClientConnection::PrepareExposure(uint64_t call_id, BulkGate& gate) {
  // May run on any thread (a payload deferred for staging quota goes from whichever thread
  // gives quota back), so not the table's business: a call that has ended shows in its gate
  // (SetRetire below refuses, and the entry goes again).
  std::shared_ptr<BulkGate> held = gate.shared_from_this();
  {
    absl::MutexLock lock(&exposed_mu_);
    if (closed()) return false;
    exposed_requests_[call_id] = ExposedRequest{std::move(held)};
    exposed_entries_.store(exposed_requests_.size(), std::memory_order_relaxed);
  }
  std::weak_ptr<ClientConnection> weak = weak_from_this();
  const bool hooked = gate.SetRetire([weak, call_id](BulkGate& ended, bool exposed) {
    if (std::shared_ptr<ClientConnection> self = weak.lock()) {
      self->CallEnded(call_id, ended, exposed);
    } else if (exposed) {
      ended.Withdraw(/*orphan=*/true);  // nobody pulls it from a connection that is gone
    }
  });
  if (!hooked) ServerPulled(call_id);  // ended meanwhile: the entry goes, nothing is exposed
  return hooked;
}

void ClientConnection::CallEnded(uint64_t call_id, BulkGate& gate, bool exposed) {
  std::shared_ptr<BulkGate> dropped;  // released outside the lock
  bool withdraw = false;
  const absl::Time until = MonotonicNow() + pull_grace_;
  {
    absl::MutexLock lock(&exposed_mu_);
    auto it = exposed_requests_.find(call_id);
    if (exposed && it != exposed_requests_.end() && !closed()) {
      it->second.until = until;  // the timer withdraws it then at the latest
    } else {
      // Nothing exposed, or nobody left to pull it (the server said pulled, or answered, or the
      // connection closed): no entry any more, and a payload still exposed goes now.
      if (it != exposed_requests_.end()) {
        dropped = std::move(it->second.gate);
        exposed_requests_.erase(it);
        exposed_entries_.store(exposed_requests_.size(), std::memory_order_relaxed);
      }
      withdraw = exposed;
    }
  }
  if (withdraw) {
    gate.Withdraw();
  } else if (exposed) {
    owner_.DeadlineAdded(until);
  }
}

void ClientConnection::SendCancel(uint64_t id) {
  if (!cancels_pending_.load(std::memory_order_acquire)) {
    const absl::Status sent = SendHeaderOnly(*connection_, RpcHeader::Cancel(id));
    // Closed or closing: the server ends the call itself when the connection goes.
    if (sent.code() != absl::StatusCode::kResourceExhausted || !open()) return;
  }
  bool dropped = false;
  {
    absl::MutexLock lock(&cancels_mu_);
    if (pending_cancels_.size() >= max_pending_cancels_) {
      pending_cancels_.pop_front();
      dropped = true;
    }
    pending_cancels_.push_back(id);
    cancels_pending_.store(true, std::memory_order_release);
  }
  if (dropped) {
    ZRPC_LOG(kWarning, "client", max_pending_cancels_, " cancels to ", connection_->peer_address(),
             " wait for a send slot; the oldest is dropped");
  }
  // Sent when a send completion frees a slot (OnSendSlotFree), or by the timer's pass (Expire)
  // for a slot given back without one.
  connection_->NotifyWhenSendSlotFree();
  owner_.DeadlineAdded(MonotonicNow() + SlotRetry());
}

void ClientConnection::WaitForSlot(std::weak_ptr<StreamListener> waiter) {
  WaitForSendSlot(*connection_, std::move(waiter));
  owner_.DeadlineAdded(MonotonicNow() + SlotRetry());
}

void ClientConnection::FlushCancels() {
  absl::MutexLock lock(&cancels_mu_);
  while (!pending_cancels_.empty()) {
    const absl::Status sent =
        SendHeaderOnly(*connection_, RpcHeader::Cancel(pending_cancels_.front()));
    if (sent.code() == absl::StatusCode::kResourceExhausted && open()) return;  // next pass
    pending_cancels_.pop_front();
  }
  cancels_pending_.store(false, std::memory_order_release);
}

absl::Time ClientConnection::NextDeadline() {
  // While the table's part of a pass waits in the domain, the published deadline is the one it
  // is about to take care of (already passed): look again shortly instead.
  absl::Time next = expire_.pending.load(std::memory_order_acquire)
                        ? MonotonicNow() + kSlotRetry
                        : calls_.published_next_deadline();
  if (cancels_pending_.load(std::memory_order_acquire) || slot_waiters_pending() ||
      waiting_count_.load(std::memory_order_acquire) > 0) {
    next = std::min(next, MonotonicNow() + SlotRetry());
  }
  // Most connections expose nothing: no lock for them (the timer looks at every connection on
  // every pass). One exposed meanwhile has no time limit until its call ends, and CallEnded tells
  // the timer of the limit it sets then.
  if (exposed_entries_.load(std::memory_order_relaxed) == 0) return next;
  absl::MutexLock lock(&exposed_mu_);
  for (const auto& [id, request] : exposed_requests_) next = std::min(next, request.until);
  return next;
}

void ClientConnection::ServerPulled(uint64_t call_id) {
  if (exposed_entries_.load(std::memory_order_relaxed) == 0) return;  // the common case
  std::shared_ptr<BulkGate> gate;
  {
    absl::MutexLock lock(&exposed_mu_);
    auto it = exposed_requests_.find(call_id);
    if (it == exposed_requests_.end()) return;
    gate = std::move(it->second.gate);
    exposed_requests_.erase(it);
    exposed_entries_.store(exposed_requests_.size(), std::memory_order_relaxed);
  }
  // Outside the lock: the payload's release may end the call, whose callback may do anything.
  gate->Withdraw();
}

void ClientConnection::Expire(absl::Time now) {
  // Pulled words that found no send slot, should no completion have freed one since (a slot
  // given back unused raises no notice). A load while there are none.
  SendPulledBacklog(*connection_);
  std::vector<std::shared_ptr<BulkGate>> overdue;
  // As in NextDeadline: nothing exposed, no lock (an idle connection's pass is a few loads).
  if (exposed_entries_.load(std::memory_order_relaxed) > 0) {
    absl::MutexLock lock(&exposed_mu_);
    for (auto it = exposed_requests_.begin(); it != exposed_requests_.end();) {
      if (it->second.until > now) {
        ++it;
        continue;
      }
      // The server neither pulled it nor answered within the grace: withdrawn, and a READ of
      // it still under way fails the server's connection.
      overdue.push_back(std::move(it->second.gate));
      exposed_requests_.erase(it++);
    }
    exposed_entries_.store(exposed_requests_.size(), std::memory_order_relaxed);
  }
  for (const std::shared_ptr<BulkGate>& gate : overdue) gate->Withdraw();
  if (cancels_pending_.load(std::memory_order_acquire)) FlushCancels();
  TellSlotWaiters();  // the fallback for a slot given back without a completion
  // The table's part, in the domain: only when a deadline may have passed or requests wait for
  // a slot, and not while an earlier pass's is still left there (it covers this one's, but for
  // deadlines passed since: the next pass takes those).
  if ((calls_.published_next_deadline() <= now ||
       waiting_count_.load(std::memory_order_acquire) > 0) &&
      !expire_.pending.exchange(true, std::memory_order_acq_rel)) {
    expire_.now = now;
    expire_.hold = shared_from_this();
    connection_->RunInDomain(expire_);
  }
}

void ClientConnection::ExpireCalls::RunInDomain(transport::Connection& connection) {
  std::vector<TakenCall<ClientCall>> expired = self.calls_.TakeExpired(now);
  for (TakenCall<ClientCall>& taken : expired) {
    if (taken.call.gate) self.Withdraw(connection, taken.id, *taken.call.gate);
    self.SendCancel(taken.id);
    const char* method_name = taken.call.method->full_name;
    self.EndInDomain(std::move(taken.call),
                     absl::DeadlineExceededError(absl::StrCat(method_name, ": deadline exceeded")));
  }
  if (!expired.empty()) {
    self.owner_.CountExpired(expired.size());
    // A ping of its own that timed out is no call of the application's: counted, it would make
    // the connection busy and pinged again at once (client_connection.h, Keepalive).
    size_t calls = 0;
    for (const TakenCall<ClientCall>& taken : expired) {
      calls += taken.call.method != &kKeepalivePing;
    }
    // One writer, the domain's holder.
    self.expired_.store(self.expired_.load(std::memory_order_relaxed) + calls,
                        std::memory_order_relaxed);
  }
  // After the expired calls left the table: their waiting requests are dropped, never sent.
  self.SendWaiting();
  connection.RunAfterExit(*this);
}

void ClientConnection::ExpireCalls::AfterExit() {
  // The last reference may be this one: nothing of the connection is touched after it goes.
  std::shared_ptr<ClientConnection> held = std::move(hold);
  pending.store(false, std::memory_order_release);
}

void ClientConnection::OnMessage(transport::Connection& connection,
                                 const transport::ReceivedMessage& message) {
  // One writer, the connection's poller (in its batch): a load and a store, no atomic add.
  received_.store(received_.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
  IncomingMessage incoming;
  if (!Receive(connection, message, &incoming)) return;
  const RpcKind kind = incoming.header.kind;
  if (kind == RpcKind::kPulled) {
    // The server has READ a stream message's payload, or the request's: no longer exposed.
    Discard(connection, incoming);
    if (!Unexpose(incoming.header.call_id, incoming.header.pulled_addr())) {
      ServerPulled(incoming.header.call_id);
    }
    return;
  }
  if (kind == RpcKind::kStreamMessage || kind == RpcKind::kStreamCredit) {
    return OnStreamFrame(connection, incoming);
  }
  if (kind != RpcKind::kResponse && kind != RpcKind::kError) {
    Discard(connection, incoming);
    return Violation(connection, absl::StrCat("a server sent message kind ", static_cast<int>(kind),
                                              "; a client takes responses, errors, pulled and "
                                              "stream messages and credits"));
  }
  if (ABSL_PREDICT_FALSE(stream_pulls_ > 0)) {
    // A stream's end must not overtake its messages still being pulled: held until they land.
    std::shared_ptr<StreamState> stream;
    calls_.Visit(incoming.header.call_id, [&](ClientCall& call) { stream = call.stream; });
    if (stream != nullptr && stream->pulling()) {
      if (held_ends_.emplace(incoming.header.call_id, incoming).second) return;
      Discard(connection, incoming);
      return Violation(connection,
                       absl::StrCat("call ", incoming.header.call_id, ": a second end"));
    }
  }
  OnAnswer(connection, incoming);
}

// Inlined into OnMessage: every unary answer comes this way, and a call of its own cost 30
// instructions a round trip (count_instructions).
ABSL_ATTRIBUTE_ALWAYS_INLINE inline void ClientConnection::OnAnswer(
    transport::Connection& connection, IncomingMessage& incoming) {
  // Answered: the server is done with the request's payload (it answers only after its READ,
  // or without one), whether the call is still waiting or not.
  ServerPulled(incoming.header.call_id);
  if (incoming.pulls()) {
    const uint64_t id = incoming.header.call_id;
    BulkDestination destination;
    std::shared_ptr<BulkGate> landing;
    const bool live = calls_.Visit(id, [&](ClientCall& call) {
      destination = call.destination;
      landing = call.landing;
    });
    if (!live || (landing && !landing->Begin())) {
      // Late: its call already ended (deadline, cancel). Nothing is pulled; the server stops
      // exposing it.
      owner_.CountLateResponse();
      Discard(connection, incoming);
      static_cast<void>(SendPulledWord(connection, incoming));
      return;
    }
    absl::Status pulling = limits().CheckMessage(incoming.body_size(), "response");
    if (pulling.ok() && landing && incoming.bulk_size() > destination.size()) {
      pulling = absl::ResourceExhaustedError(absl::StrCat(
          "a ", incoming.bulk_size(), "-byte payload does not fit the ", destination.size(),
          "-byte CallOptions::response_destination; nothing was written"));
    }
    if (!pulling.ok()) {
      if (landing) landing->Released();
    } else if (!landing) {
      pulling = StartPull(connection, incoming);
    } else {
      pulling = StartPullInto(connection, incoming, destination, landing);
    }
    if (!pulling.ok()) {
      Discard(connection, incoming);
      static_cast<void>(SendPulledWord(connection, incoming));
      if (CallTable<ClientCall>::Taken call = calls_.Take(id)) {
        call->End(absl::Status(pulling.code(), absl::StrCat(call->method->full_name,
                                                            ": response: ", pulling.message())));
      }
    }
    return;  // OnPulled goes on
  }
  Deliver(connection, incoming);
}

void ClientConnection::OnStreamFrame(transport::Connection& connection, IncomingMessage& message) {
  const uint64_t id = message.header.call_id;
  std::shared_ptr<StreamState> stream;
  bool live = false;
  bool bulk_allowed = false;
  calls_.Visit(id, [&](ClientCall& call) {
    live = true;
    stream = call.stream;
    bulk_allowed = call.method->response_bulk;
  });
  if (!live) {
    // Its call already ended (deadline, cancel): the server did not know yet.
    if (message.header.kind == RpcKind::kStreamMessage) owner_.CountLateResponse();
    return DiscardUnread(connection, message);
  }
  if (const char* wrong = StreamFrameError(stream != nullptr, bulk_allowed, message)) {
    Discard(connection, message);
    return Violation(connection, absl::StrCat("call ", id, ": ", wrong));
  }
  if (absl::Status fits = limits().CheckMessage(message.body_size(), "stream message");
      !fits.ok()) {
    DiscardUnread(connection, message);
    return AbortCall(id, fits);
  }
  if (message.header.kind == RpcKind::kStreamCredit) {
    Discard(connection, message);
    if (absl::Status s = stream->OnCredit(message.header.window); !s.ok()) {
      Violation(connection, absl::StrCat("call ", id, ": ", s.message()));
    }
    return;
  }
  absl::StatusOr<uint16_t> grant;
  if (message.pulls()) {
    // Larger than this side's arena: its place is kept in the stream (nothing behind it, the
    // call's end included, overtakes it) while it is pulled; StreamPulled fills it.
    bool wanted = false;
    grant = stream->OnPulling(&wanted);
    if (grant.ok() && wanted) {
      absl::Status pulling = StartPull(connection, message);
      if (pulling.ok()) {
        ++stream_pulls_;
        return;  // the pull has the message now
      }
      grant = absl::Status(pulling.code(), absl::StrCat("stream message: ", pulling.message()));
    }
    if (grant.status().code() != absl::StatusCode::kFailedPrecondition) {
      static_cast<void>(SendPulledWord(connection, message));  // not read: never will be
    }
  } else {
    // Parsed straight from the receive slot, which goes back right after (stream_state.h).
    grant = stream->OnMessage(message.body);
  }
  Discard(connection, message);
  if (!grant.ok()) {
    if (grant.status().code() == absl::StatusCode::kFailedPrecondition) {
      return Violation(connection, absl::StrCat("call ", id, ": ", grant.status().message()));
    }
    // A message that does not parse is the server's fault (INTERNAL); one that cannot be
    // pulled says why (RESOURCE_EXHAUSTED: a limit, memory).
    return AbortCall(id, grant.status().code() == absl::StatusCode::kInvalidArgument
                             ? absl::InternalError(grant.status().message())
                             : grant.status());
  }
  if (*grant > 0) {
    // The caller is finishing and no longer reads: what arrives is credited back at once.
    if (!SendHeaderOnly(connection, RpcHeader::StreamCredit(id, *grant)).ok()) {
      AbortCall(id, absl::ResourceExhaustedError(
                        "no send slot for a stream credit while the stream drained"));
    }
  }
}

void ClientConnection::OnPulled(transport::Connection& connection, IncomingMessage& message) {
  if (message.header.kind == RpcKind::kStreamMessage) return StreamPulled(connection, message);
  // The payload is here: the server may stop exposing it.
  static_cast<void>(SendPulledWord(connection, message));
  Deliver(connection, message);
}

void ClientConnection::StreamPulled(transport::Connection& connection, IncomingMessage& message) {
  static_cast<void>(SendPulledWord(connection, message));
  --stream_pulls_;
  const uint64_t id = message.header.call_id;
  std::shared_ptr<StreamState> stream;
  calls_.Visit(id, [&](ClientCall& call) { stream = call.stream; });
  absl::Status status;
  if (stream != nullptr) {
    status = stream->OnPulledMessage(message.body, RpcConnection::TakePulledBody(message),
                                     TakeBulk(connection, message));
  }
  Discard(connection, message);
  if (!status.ok()) AbortCall(id, absl::InternalError(status.message()));
  // The call's end, if it came meanwhile, goes once nothing before it is still being pulled;
  // a call that ended otherwise drops it.
  auto held = held_ends_.find(id);
  if (held == held_ends_.end()) return;
  if (stream != nullptr && status.ok() && stream->pulling()) return;
  IncomingMessage end = std::move(held->second);
  held_ends_.erase(held);
  if (stream == nullptr || !status.ok()) return DiscardUnread(connection, end);
  OnAnswer(connection, end);
}

void ClientConnection::Deliver(transport::Connection& connection, IncomingMessage& message) {
  CallTable<ClientCall>::Taken call = calls_.Take(message.header.call_id);
  if (!call) {
    // Its call already ended (deadline, failure) or never existed: give back what it holds now,
    // so the server's later messages and payloads do not queue behind it.
    owner_.CountLateResponse();
    Discard(connection, message);
    return;
  }
  Complete(connection, message, *call);
}

void ClientConnection::Complete(transport::Connection& connection, IncomingMessage& message,
                                ClientCall& call) {
  absl::Status status;
  bool violation = false;
  if (message.header.kind == RpcKind::kError) {
    absl::Status decoded = DecodeErrorBody(message.header, message.body, &status);
    if (!decoded.ok()) {
      violation = true;
      status = absl::InternalError(
          absl::StrCat("the server's error message is malformed: ", decoded.message()));
    }
  }
  if (!violation && !message.layout.metadata.empty()) {
    // Trailing metadata, and an error's status payloads (WIRE.md, "Metadata"): into the
    // caller's Metadata when it gave one, checked either way.
    Metadata trailing;
    absl::Status decoded =
        DecodeMetadataBlock(message.layout.metadata, &trailing, status.ok() ? nullptr : &status);
    if (!decoded.ok()) {
      violation = true;
      status = absl::InternalError(
          absl::StrCat("the server's trailing metadata is malformed: ", decoded.message()));
    } else if (call.trailing != nullptr) {
      *call.trailing = std::move(trailing);
    }
  }
  if (violation || message.header.kind == RpcKind::kError) {
    // decided above
  } else if (message.bulk && !call.method->response_bulk) {
    violation = true;
    status = absl::InternalError(absl::StrCat(call.method->full_name,
                                              ": the response carries a bulk payload the "
                                              "method does not have"));
  } else if (absl::Status fits = limits().CheckMessage(
                 message.body.size() + message.layout.metadata.size(), "response");
             !fits.ok()) {
    status = absl::Status(fits.code(), absl::StrCat(call.method->full_name, ": ", fits.message()));
  } else if (call.response == nullptr) {
    // A stream whose method has no single response (server streaming, bidirectional): its end
    // is an empty response.
    if (!message.body.empty() || message.bulk) {
      violation = true;
      status = absl::InternalError(
          absl::StrCat(call.method->full_name, ": the stream's final response is not empty"));
    }
  } else if (message.body.size() > static_cast<size_t>(std::numeric_limits<int>::max()) ||
             !call.response->ParseFromArray(message.body.data(),
                                            static_cast<int>(message.body.size()))) {
    status = absl::InternalError(absl::StrCat(call.method->full_name,
                                              ": malformed response: it does not parse as ",
                                              call.response->GetTypeName()));
  } else if (message.bulk) {
    *call.response_bulk =
        ReceiveReleaser::Wrap(*this, connection.shared_from_this(), *message.bulk);
    message.bulk.reset();  // the caller's now
  }
  if (call.metrics != nullptr && message.header.kind == RpcKind::kResponse) {
    call.metrics->AddMessageBytes(0, message.body.size());  // responses only, like the server
    if (call.response_bulk != nullptr) call.metrics->AddBulkBytes(0, call.response_bulk->size());
  }
  Discard(connection, message);
  if (violation) Violation(connection, status.message());
  call.End(std::move(status));
}

void ClientConnection::OnDeferredFailed(transport::Connection&, const RpcHeader& header,
                                        const absl::Status& status) {
  // A request whose payload waited for this connection's staging quota could not go when its
  // turn came: its call ends (unless its deadline or a cancel ended it first), in the domain;
  // this may be any thread that gave quota back.
  if (connection_->InDomain()) {
    return AbortInDomain(header.call_id, status, /*tell_server=*/false);
  }
  RunTask(new EndCall(shared_from_this(), header.call_id, status, /*tell_server=*/false));
}

void ClientConnection::OnClosed(transport::Connection& connection, const absl::Status& why) {
  std::shared_ptr<ClientConnection> self;  // may be the last reference: released on return
  {
    absl::MutexLock lock(&self_mu_);
    closed_.store(true, std::memory_order_release);
    self = std::move(self_);
  }
  DropPending(connection);
  DropWaiting();
  for (auto& [id, end] : held_ends_) Discard(connection, end);
  held_ends_.clear();
  absl::flat_hash_map<uint64_t, ExposedRequest> exposed;
  {
    absl::MutexLock lock(&exposed_mu_);  // closed_ is set: nothing is added any more
    exposed.swap(exposed_requests_);
    exposed_entries_.store(0, std::memory_order_relaxed);
  }
  // Nobody pulls them any more: withdrawn, so that their calls (ending below) can end.
  for (auto& [id, request] : exposed) request.gate->Withdraw();
  exposed.clear();
  absl::Status reason = why;
  {
    absl::MutexLock lock(&reason_mu_);
    if (!close_reason_.empty()) reason = absl::UnavailableError(close_reason_);
  }
  const absl::Status status = owner_.CloseStatus(connection.peer_address(), reason);
  // The channel hears first, so that a caller whose call fails below already sees the loss in
  // the channel's stats (and the timer no longer scans this connection).
  owner_.ConnectionClosed(this, violations() > 0);
  for (TakenCall<ClientCall>& taken : calls_.TakeAll()) {
    taken.call.End(absl::Status(
        status.code(), absl::StrCat(taken.call.method->full_name, ": ", status.message())));
  }
}

}  // namespace zrpc::internal
