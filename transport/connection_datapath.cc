// The connection's datapath: posting sends and bulk writes, handling completions, credits,
// and the drain that fails outstanding work exactly once. Setup is in connection_setup.cc.
#include <arpa/inet.h>

#include <algorithm>
#include <iterator>
#include <memory>
#include <thread>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "transport/connection.h"
#include "transport/log.h"
#include "transport/poller.h"
#include "transport/steady_clock.h"
#include "transport/verbs_error.h"
#include "transport/work_request_id.h"

namespace zrpc::transport {
namespace {

// Handles of bulk payloads carry this bit; handles of messages are receive indices.
constexpr uint64_t kBulkHandle = uint64_t{1} << 63;

// The connection whose completion batch this thread is dispatching, holding its domain
// (DispatchBatchLocked), if any.
thread_local const Connection* batch_connection = nullptr;
// The connection whose domain this thread holds to run a task (RunTaskLocked).
thread_local const Connection* task_connection = nullptr;

absl::Status Closed(const std::string& peer) {
  return absl::UnavailableError(absl::StrCat("connection to ", peer, " is closed"));
}

}  // namespace

bool Connection::open() const { return (gate_.load(std::memory_order_acquire) & kGateOpen) != 0; }

void Connection::SetStateLocked(State state) {
  if (state == State::kOpen) {
    gate_.fetch_or(kGateOpen, std::memory_order_release);
  } else if (state_ == State::kOpen) {
    gate_.fetch_and(~kGateOpen, std::memory_order_release);
  }
  state_ = state;
}

bool Connection::InBatch() const { return batch_connection == this; }

bool Connection::InDomain() const { return batch_connection == this || task_connection == this; }

void Connection::RunInDomain(DomainTask& task) {
  if (InDomain()) {
    domain_.AssertHeld();
    task.RunInDomain(*this);
    return;
  }
  if (!domain_.TryEnter()) {
    if (domain_.LeaveOrEnter(&task)) return;  // for the poller (RunBatchLocked, ExitLocked)
  }
  RunTaskLocked(task);
  ExitLocked();
}

void Connection::RunInDomainNow(DomainTask& task) {
  if (InDomain()) {
    domain_.AssertHeld();
    task.RunInDomain(*this);
    return;
  }
  EnterWaiting();
  RunTaskLocked(task);
  ExitLocked();
}

void Connection::DropAfterExit(std::shared_ptr<Connection> reference) {
  domain_.AssertHeld();
  drops_.push_back(std::move(reference));
}

void Connection::RunTaskLocked(DomainTask& task) {
  const Connection* outer = task_connection;  // a task of another connection's, running this
  task_connection = this;
  task.RunInDomain(*this);
  task_connection = outer;
}

void Connection::RunAfterExit(ExitTask& task) {
  domain_.AssertHeld();
  task.next_exit_ = nullptr;
  if (exits_tail_ == nullptr) {
    exits_head_ = &task;
  } else {
    exits_tail_->next_exit_ = &task;
  }
  exits_tail_ = &task;
}

void Connection::TakeDropsLocked(std::vector<std::shared_ptr<Connection>>& drops,
                                 ExitTask*& exits) {
  for (auto& reference : drops_) drops.push_back(std::move(reference));
  drops_.clear();
  if (exits_head_ == nullptr) return;
  ExitTask** end = &exits;
  while (*end != nullptr) end = &(*end)->next_exit_;
  *end = exits_head_;
  exits_head_ = exits_tail_ = nullptr;
}

void Connection::RunExits(ExitTask* exits) {
  while (exits != nullptr) {
    ExitTask* next = exits->next_exit_;
    exits->AfterExit();  // may free it
    exits = next;
  }
}

void Connection::RunTasksLocked() {
  while (tasks_head_ != nullptr) {
    DomainOp* op = tasks_head_;
    tasks_head_ = op->next;
    if (tasks_head_ == nullptr) tasks_tail_ = nullptr;
    RunTaskLocked(*static_cast<DomainTask*>(op));  // may free `op`
  }
}

void Connection::EnterWaiting() const {
  while (!domain_.TryEnter()) std::this_thread::yield();
}

Connection::LeftOp* Connection::NewLeftOp(LeftOp::Kind kind) {
  constexpr uint64_t kIndex = 0xffffffff;
  LeftOp* pool = op_pool_.load(std::memory_order_acquire);
  if (pool == nullptr) {
    // First contention on this connection: make the pool, linked as the free list, and publish
    // it. Idle connections never pay for one.
    const uint32_t size = options_.max_send_slots + options_.recv_credits;
    auto* fresh = new LeftOp[size];
    for (uint32_t i = 0; i < size; ++i) {
      fresh[i].pool_slot = i + 1;
      fresh[i].pool_next.store(i + 1 < size ? i + 2 : 0, std::memory_order_relaxed);
    }
    if (op_pool_.compare_exchange_strong(pool, fresh, std::memory_order_acq_rel)) {
      pool = fresh;
      op_free_.store(1, std::memory_order_release);
    } else {
      delete[] fresh;  // another thread made it first (`pool` is its)
    }
  }
  LeftOp* op = nullptr;
  uint64_t head = op_free_.load(std::memory_order_acquire);
  while ((head & kIndex) != 0) {
    LeftOp& top = pool[(head & kIndex) - 1];
    const uint64_t next = ((head >> 32) + 1) << 32 | top.pool_next.load(std::memory_order_relaxed);
    if (op_free_.compare_exchange_weak(head, next, std::memory_order_acquire,
                                       std::memory_order_acquire)) {
      op = &top;
      break;
    }
  }
  if (op == nullptr) op = new LeftOp;  // all in use (bulk releases, probes): rare
  op->kind = kind;
  op->has_release = false;
  op->release = 0;
  op->token = 0;
  op->ops.clear();
  return op;
}

void Connection::FreeLeftOp(LeftOp* op) {
  if (op->pool_slot == 0) {
    delete op;
    return;
  }
  uint64_t head = op_free_.load(std::memory_order_relaxed);
  uint64_t next;
  do {
    op->pool_next.store(static_cast<uint32_t>(head & 0xffffffff), std::memory_order_relaxed);
    next = ((head >> 32) + 1) << 32 | op->pool_slot;
  } while (!op_free_.compare_exchange_weak(head, next, std::memory_order_release,
                                           std::memory_order_relaxed));
}

bool Connection::AcceptLeft() {
  if ((gate_.load(std::memory_order_relaxed) & kGateOpen) == 0) return false;
  if ((gate_.fetch_add(kLeftOne, std::memory_order_acq_rel) & kGateOpen) != 0) return true;
  // It closed in between: counted for nothing. A drain that waited for the count to fall may be
  // complete now, and whoever holds the domain may have looked before it fell: an empty operation
  // left to the holder makes it look again (its exit fails, and it runs what was left), or, with
  // the domain free, this thread enters and looks (ExitLocked).
  if (gate_.fetch_sub(kLeftOne, std::memory_order_acq_rel) == kLeftOne) {
    LeftOp* look = NewLeftOp(LeftOp::kLook);
    if (!domain_.LeaveOrEnter(look)) {
      FreeLeftOp(look);
      ExitLocked();
    }
  }
  return false;
}

template <typename Run, typename Make>
absl::Status Connection::Submit(bool gated, Run run, Make make) {
  if (InDomain()) {
    domain_.AssertHeld();
    // Operations take effect in the order they were asked for: one another thread left during
    // this batch (a stream's earlier message, sent from the sweeper) goes before this one.
    if (domain_.HasLeft()) RunLeftInBatchLocked();
    return run();
  }
  if (domain_.TryEnter()) {
    absl::Status s = run();
    ExitLocked();
    return s;
  }
  if (gated && !AcceptLeft()) return Closed(peer_address_);
  LeftOp* op = make();
  if (domain_.LeaveOrEnter(op)) return absl::OkStatus();  // the holder runs and frees it
  // Free after all: carried out here, as if entered at once.
  FreeLeftOp(op);
  if (gated) LeftDone();
  absl::Status s = run();
  ExitLocked();
  return s;
}

void Connection::ExitLocked() {
  std::vector<std::shared_ptr<Connection>> drops;  // dropped after the exit (DropAfterExit)
  ExitTask* exits = nullptr;                       // run after the exit (RunAfterExit)
  Events events;
  bool changed = false;
  for (;;) {
    if (DomainOp* left = domain_.TakeLeft()) {
      RunLeftLocked(left, events);
      changed = true;
      continue;
    }
    // Left tasks are the poller's (RunInDomain): this thread may be inside an operation of the
    // layer above that holds its locks. Unless no loop is left to run them.
    if (tasks_head_ != nullptr && poller_.loop_ended()) {
      RunTasksLocked();
      changed = true;
      continue;
    }
    if (state_ != State::kConnecting && (!early_.empty() || early_shared_ > 0)) {
      HandleEarlyLocked(events);
      changed = true;
    }
    if (changed) {
      AfterChangeLocked(events);
      changed = false;
    } else if (state_ == State::kDraining && DrainedLocked()) {
      // An operation that was counted for the drain (AcceptLeft) and then entered a free domain
      // (Submit) counted itself out in here: the marker may have come back while it counted,
      // and no completion will come to look again.
      FinishDrainLocked(events);
    }
    // Only the poller dispatches (ConnectionHandler): what was produced here goes to it.
    for (Event& e : events) pending_events_.push_back(std::move(e));
    events.clear();
    const bool for_poller = !pending_events_.empty() || tasks_head_ != nullptr;
    if (!drops_.empty() || exits_head_ != nullptr) TakeDropsLocked(drops, exits);
    if (!RecvChainPostedLocked()) continue;  // failed: its events and drops
    if (domain_.TryExit()) {
      // With no loop left, the tasks run here after all (ReplayEarly takes the domain again).
      if (for_poller && !poller_.Defer(shared_from_this())) ReplayEarly();
      RunExits(exits);  // before `drops` go: the connection is alive meanwhile
      return;
    }
  }
}

void Connection::RunBatchLocked(absl::Span<const ibv_wc> wcs) {
  std::vector<std::shared_ptr<Connection>> drops;  // dropped after the exit (DropAfterExit)
  ExitTask* exits = nullptr;                       // run after the exit (RunAfterExit)
  Events events;
  if (!pending_events_.empty()) events.swap(pending_events_);  // older: first
  if (state_ != State::kConnecting && (!early_.empty() || early_shared_ > 0)) {
    HandleEarlyLocked(events);
  }
  for (const ibv_wc& wc : wcs) {
    if (state_ == State::kConnecting && shared_receives_ && IsSharedReceiveId(wc.wr_id) &&
        ++early_shared_ > initial_window()) {
      // Past its window before the handshake ended: the shared queue's receives are every
      // connection's, and this peer's are not kept while nothing checks its credits. The
      // connection fails once the handshake is done (HandleEarlyLocked).
      GiveSlot(WorkRequestIndex(wc.wr_id));
      continue;
    }
    if (state_ == State::kConnecting || !early_.empty()) {
      early_.push_back(wc);  // handled in order once the handshake is done
    } else {
      HandleCompletionLocked(wc, events);
    }
  }
  AfterChangeLocked(events);  // credits, arena space or send-queue entries may have come back
  for (;;) {
    if (!events.empty()) {
      DispatchBatchLocked(events);
      events.clear();
    }
    if (!pending_events_.empty()) {
      events.swap(pending_events_);  // a withdrawal's report, made while dispatching
      continue;
    }
    if (DomainOp* left = domain_.TakeLeft()) {
      RunLeftLocked(left, events);
      AfterChangeLocked(events);
      continue;
    }
    if (tasks_head_ != nullptr) {
      RunTasksLocked();
      AfterChangeLocked(events);
      continue;
    }
    if (!drops_.empty() || exits_head_ != nullptr) TakeDropsLocked(drops, exits);
    if (!RecvChainPostedLocked()) continue;  // failed: its events and drops
    if (domain_.TryExit()) {
      RunExits(exits);  // before `drops` go: the connection is alive meanwhile
      return;
    }
  }
}

void Connection::AfterChangeLocked(Events& events) {
  PumpLocked();
  // Another connection on the poller waits for completion-queue entries: an idle one's go back.
  // (Once unregistered it has none: Unregister took them.)
  if (in_flight_.empty() && cq_granted_.load(std::memory_order_relaxed) != 0 &&
      poller_.cq_short()) {
    GiveBackCqLocked(0);
  }
  if (slot_notice_wanted_.load(std::memory_order_acquire) && state_ == State::kOpen &&
      SendSlotsHeld() < options_.max_send_slots &&
      slot_notice_wanted_.exchange(false, std::memory_order_acq_rel)) {
    events.push_back(Event(Event::kSendSlotFree));
  }
  if (state_ == State::kDraining && DrainedLocked()) FinishDrainLocked(events);
}

void Connection::RunLeftInBatchLocked() {
  Events events;
  RunLeftLocked(domain_.TakeLeft(), events);
  // One of them may have been the last operation the drain waited for (as in ExitLocked).
  if (state_ == State::kDraining && DrainedLocked()) FinishDrainLocked(events);
  // Dispatched by the batch, after the events it is dispatching (RunBatchLocked's loop).
  for (Event& e : events) pending_events_.push_back(std::move(e));
}

void Connection::RunLeftLocked(DomainOp* left, Events& events) {
  while (left != nullptr) {
    DomainOp* const current = left;
    left = left->next;
    if (current->task) {
      // Run by the holder's loop, on its own (a task may send, which would nest here).
      current->next = nullptr;
      if (tasks_tail_ == nullptr) {
        tasks_head_ = current;
      } else {
        tasks_tail_->next = current;
      }
      tasks_tail_ = current;
      continue;
    }
    LeftOp* op = static_cast<LeftOp*>(current);
    switch (op->kind) {
      case LeftOp::kEnqueue:
        if (op->has_release) static_cast<void>(ReleaseLocked(op->release));
        EnqueueAcceptedLocked(op->ops, events);
        LeftDone();
        break;
      case LeftOp::kRelease:
        if (absl::Status s = ReleaseLocked(op->release);
            !s.ok() && s.code() == absl::StatusCode::kFailedPrecondition) {
          // Release said OK already: a handle given back twice shows here.
          ZRPC_LOG(kError, "transport", "connection to ", peer_address_, ": ", s.message());
        }
        break;
      case LeftOp::kWithdraw:
        WithdrawLocked(op->token);
        break;
      case LeftOp::kEndExposure:
        EndExposureLocked(op->token);
        break;
      case LeftOp::kProbe:
      case LeftOp::kFlush:
        // Accepted: a failure shows as the connection's (OnClosed).
        static_cast<void>(PostTailSignalLocked(op->kind == LeftOp::kProbe));
        break;
      case LeftOp::kClose:
        FailLocked(absl::CancelledError("connection closed by this side"));
        break;
      case LeftOp::kCmEvent:
        CmEventLocked(op->cm_event);
        break;
      case LeftOp::kDeviceEvent:
        DeviceEventLocked(op->device_event);
        break;
      case LeftOp::kLook:
        break;  // the holder's AfterChangeLocked looks at the drain
    }
    FreeLeftOp(op);
  }
}

void Connection::EnqueueAcceptedLocked(absl::Span<const Waiting> ops, Events& events) {
  if (state_ == State::kClosed) {
    // Not reached: the drain waits for accepted operations (DrainedLocked). Reported anyway.
    for (const Waiting& op : ops) {
      if (op.kind == Waiting::kMessage) FreeSendSlotLocked(op.slot);
      if (!op.report) continue;
      Event e(Event::kSendDone);
      e.handle_or_token = op.token;
      e.status = error_;
      events.push_back(std::move(e));
    }
    return;
  }
  // Open, or draining (the drain reports what waits): past max_waiting if need be, as it was
  // accepted already.
  for (const Waiting& op : ops) waiting_.push_back(op);
  if (state_ == State::kOpen) {
    PumpLocked();
    if (!CorkedLocked() && !waiting_.empty()) ++stats_.waited;
  }
}

ConnectionStats Connection::StatsLocked() const {
  ConnectionStats stats = stats_;
  stats.arena_in_use = arena_reader_.in_use();
  stats.arena_lent = arena_piece_ != kNoPiece;
  stats.sends_outstanding = static_cast<uint32_t>(waiting_.size() + in_flight_.size());
  stats.waiting = static_cast<uint32_t>(waiting_.size());
  stats.transfer_bytes_in_flight = transfer_bytes_in_flight_;
  stats.cq_entries_granted = cq_granted_.load(std::memory_order_relaxed);
  stats.recv_window = credits_.window();
  stats.max_recv_window = credits_.max_window();
  stats.window_parked = credits_.parked();
  stats.bytes_sent -= bytes_read_;
  stats.bytes_received += bytes_read_;
  const SlotPool& pool = device_.slots();
  uint64_t slots = 1 + SendSlotsHeld();  // the control slot, and the sends'
  slots += shared_receives_ ? recv_slots_.size() - recv_free_.size() : recv_slots_.size();
  stats.registered_bytes = slots * pool.slot_size();
  if (arena_mr_ != nullptr) stats.registered_bytes += options_.arena_size;
  if (arena_piece_ != kNoPiece) stats.registered_bytes += poller_.arena_pool()->piece_size();
  return stats;
}

ConnectionStats Connection::stats() const {
  if (std::optional<ConnectionStats> stats = TryStats()) return *stats;
  EnterWaiting();
  ConnectionStats stats = StatsLocked();
  const_cast<Connection*>(this)->ExitLocked();
  return stats;
}

std::optional<ConnectionStats> Connection::TryStats() const {
  if (InDomain()) {
    domain_.AssertHeld();
    return StatsLocked();
  }
  if (!domain_.TryEnter()) return std::nullopt;
  ConnectionStats stats = StatsLocked();
  const_cast<Connection*>(this)->ExitLocked();
  return stats;
}

std::string Connection::DebugString() const {
  const bool held = InDomain();
  if (!held) EnterWaiting();
  std::string text = DebugStringLocked();
  if (!held) const_cast<Connection*>(this)->ExitLocked();
  return text;
}

std::string Connection::TryDebugString() const {
  if (InDomain()) return DebugStringLocked();
  if (!domain_.TryEnter()) return "its domain held by another thread";
  std::string text = DebugStringLocked();
  const_cast<Connection*>(this)->ExitLocked();
  return text;
}

std::string Connection::DebugStringLocked(bool query_qp) const {
  std::string text = absl::StrCat(
      "state ", static_cast<int>(state_), ", credits available ", credits_.available(), " of ",
      peer_.recv_credits, ", owed ", credits_.owed(), ", waiting ", waiting_.size(), ", in flight ",
      in_flight_.size(), " (oldest ", in_flight_.empty() ? 0 : in_flight_.front().sequence,
      ", next ", next_sequence_, "), recvs posted ", recvs_posted_, ", early ", early_.size(),
      ", left in the domain ", LeftPending(), ", events pending ", pending_events_.size(),
      state_ == State::kDraining && sq_drained_ ? ", send queue drained" : "",
      state_ == State::kDraining && awaits_last_wqe_ && !last_wqe_reached_
          ? ", awaiting the last-WQE event"
          : "",
      ", arena in use ", arena_writer_.in_use(), " (peer) / ", arena_reader_.in_use(), " (own)");
  if (arena_reader_.on_demand() || arena_writer_.on_demand()) {
    absl::StrAppend(
        &text, ", loans: own ", arena_reader_.loan(), " state ",
        static_cast<int>(arena_reader_.loan_state()), arena_reader_.ask_waiting() ? " asked" : "",
        arena_waiting_ ? " waiting" : "", ", peer's ", arena_writer_.loan(),
        arena_writer_.held() ? " held" : "", ", owed", arena_owed_ & kOweLend ? " lend" : "",
        arena_owed_ & kOweRecall ? " recall" : "", arena_owed_ & kOweReturned ? " returned" : "",
        arena_owed_ & kOweAsk ? " ask" : "");
  }
  if (!query_qp) return text;
  // The queue pair as the device sees it: a transfer that never completes shows whether the
  // device still thinks the queue pair can send.
  ibv_qp_attr attr{};
  ibv_qp_init_attr init{};
  const int rc = ibv_query_qp(
      qp_->qp, &attr,
      IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC,
      &init);
  absl::StrAppend(&text, rc != 0
                             ? absl::StrCat(", ibv_query_qp failed (", rc, ")")
                             : absl::StrCat(", qp state ", attr.qp_state, " timeout ", attr.timeout,
                                            " retry ", attr.retry_cnt, " rnr retry ",
                                            attr.rnr_retry, " reads ", attr.max_rd_atomic));
  return text;
}

absl::StatusOr<SendBuffer> Connection::AcquireSendBuffer(uint32_t leave_free) {
  // The per-connection quota comes first: a peer that stops returning credits makes messages
  // wait, each in a slot of the device-wide pool, and must not drain it for everyone else.
  const uint32_t limit =
      options_.max_send_slots - std::min(leave_free, options_.max_send_slots - 1);
  // In the domain (a handler or task of this connection's) the holder's own count moves with a
  // load and a store; elsewhere the other count, with a read-modify-write (connection.h,
  // send_slots_in_domain_).
  const bool in_domain = InDomain();
  std::atomic<int32_t>& count = in_domain ? send_slots_in_domain_ : send_slots_outside_;
  const int32_t other =
      (in_domain ? send_slots_outside_ : send_slots_in_domain_).load(std::memory_order_relaxed);
  const int32_t mine = in_domain ? count.load(std::memory_order_relaxed)
                                 : count.fetch_add(1, std::memory_order_relaxed);
  if (mine + other >= static_cast<int32_t>(limit)) {
    if (!in_domain) count.fetch_sub(1, std::memory_order_relaxed);
    return absl::ResourceExhaustedError(absl::StrCat(
        "the connection to ", peer_address_, " already holds ", limit,
        " messages being built, waiting for credits or in flight (max_send_slots ",
        options_.max_send_slots,
        limit < options_.max_send_slots
            ? absl::StrCat(", less ", options_.max_send_slots - limit, " kept for other messages)")
            : std::string(")")));
  }
  uint32_t slot = TakeSlot();
  if (slot == SlotPool::kNoSlot) {
    if (!in_domain) count.fetch_sub(1, std::memory_order_relaxed);
    return device_.slots().ExhaustedError("for a message");
  }
  if (in_domain) count.store(mine + 1, std::memory_order_relaxed);
  return SendBuffer{device_.slots().data(slot) + FrameHeader::kSize, max_message_, slot};
}

void Connection::ReleaseSendBuffer(const SendBuffer& buffer) { FreeSendSlot(buffer.slot); }

void Connection::FreeSendSlot(uint32_t slot) {
  if (InDomain()) return FreeSendSlotLocked(slot);
  GiveSlot(slot);
  send_slots_outside_.fetch_sub(1, std::memory_order_relaxed);
}

void Connection::FreeSendSlotLocked(uint32_t slot) {
  GiveSlot(slot);
  send_slots_in_domain_.store(send_slots_in_domain_.load(std::memory_order_relaxed) - 1,
                              std::memory_order_relaxed);
}

uint32_t Connection::TakeSlot() {
  if (Poller::Current() == &poller_) return poller_.slot_cache().Allocate();
  return device_.slots().Allocate();
}

void Connection::GiveSlot(uint32_t slot) {
  if (Poller::Current() == &poller_) {
    static_cast<void>(poller_.slot_cache().Free(slot));
  } else {
    static_cast<void>(device_.slots().Free(slot));
  }
}

namespace {
absl::Status TooLong(uint32_t length, uint32_t max) {
  return absl::InvalidArgumentError(
      absl::StrCat("a ", length, "-byte message exceeds the ", max, " bytes a SEND carries here"));
}
}  // namespace

Connection::Waiting Connection::Unreported(const SendBuffer& buffer, uint32_t length) {
  Waiting op{Waiting::kMessage, buffer.slot, length, {}, 0};
  op.report = false;
  return op;
}

Connection::LeftOp* Connection::LeftEnqueue(absl::Span<const Waiting> ops) {
  LeftOp* op = NewLeftOp(LeftOp::kEnqueue);
  op->ops.assign(ops.begin(), ops.end());
  return op;
}

absl::Status Connection::Send(const SendBuffer& buffer, uint32_t length, uint64_t token) {
  if (length > max_message_) {
    ReleaseSendBuffer(buffer);
    return TooLong(length, max_message_);
  }
  const Waiting op{Waiting::kMessage, buffer.slot, length, {}, token};
  absl::Status s = Submit(
      true, [&] { return EnqueueLocked(op); },
      [&] {
        return LeftEnqueue({&op, 1});
      });
  if (!s.ok()) ReleaseSendBuffer(buffer);
  return s;
}

absl::Status Connection::Send(const SendBuffer& buffer, uint32_t length) {
  if (length > max_message_) {
    ReleaseSendBuffer(buffer);
    return TooLong(length, max_message_);
  }
  const Waiting op = Unreported(buffer, length);
  absl::Status s = Submit(
      true, [&] { return EnqueueLocked(op); },
      [&] {
        return LeftEnqueue({&op, 1});
      });
  if (!s.ok()) ReleaseSendBuffer(buffer);
  return s;
}

absl::Status Connection::WriteBulk(const BulkSource& source, uint64_t token) {
  if (!open()) return Closed(peer_address_);
  // The arena's size is fixed once open: this check needs no domain.
  if (auto s = arena_writer_.CheckFits(source.size); !s.ok()) return s;
  const Waiting op{Waiting::kWrite, SlotPool::kNoSlot, 0, source, token};
  return Submit(
      true, [&] { return EnqueueLocked(op); },
      [&] {
        return LeftEnqueue({&op, 1});
      });
}

absl::Status Connection::WriteBulkThenSend(const BulkSource& source, uint64_t token,
                                           const SendBuffer& buffer, uint32_t length) {
  if (length > max_message_) return TooLong(length, max_message_);
  if (!open()) return Closed(peer_address_);
  if (auto s = arena_writer_.CheckFits(source.size); !s.ok()) return s;
  const Waiting ops[2] = {Waiting{Waiting::kWrite, SlotPool::kNoSlot, 0, source, token},
                          Unreported(buffer, length)};
  return Submit(
      true,
      [&] {
        if (absl::Status s = CanEnqueueLocked(); !s.ok()) return s;
        // Both or neither: pushed together in the domain, nothing can come between them; the
        // second push may pass max_waiting by one.
        waiting_.push_back(ops[0]);
        return EnqueueLocked(ops[1], /*checked=*/true);
      },
      [&] { return LeftEnqueue(ops); });
}

absl::Status Connection::ReadBulk(absl::Span<const ReadPart> parts, uint64_t token) {
  size_t last = parts.size();  // the part whose last piece reports
  for (size_t i = 0; i < parts.size(); ++i) {
    if (parts[i].sink.size > 0) last = i;
  }
  if (last == parts.size()) return absl::InvalidArgumentError("ReadBulk: an empty sink");
  const uint32_t piece = std::max<uint32_t>(device_.selection().max_msg_size, 1u << 16);
  absl::InlinedVector<Waiting, 2> ops;
  for (size_t i = 0; i <= last; ++i) {
    const BulkSource& sink = parts[i].sink;
    for (uint32_t offset = 0; offset < sink.size; offset += piece) {
      const uint32_t length = std::min(piece, sink.size - offset);
      const bool final_piece = length == sink.size - offset;
      Waiting op{Waiting::kRead, SlotPool::kNoSlot, 0,
                 BulkSource{static_cast<const uint8_t*>(sink.data) + offset, length, sink.lkey},
                 token};
      op.remote = RemoteRange{parts[i].remote.addr + offset, parts[i].remote.rkey};
      op.report = final_piece && i == last;
      ops.push_back(op);
      if (final_piece) break;  // offset + piece may wrap past 4 GiB
    }
  }
  return Submit(
      true,
      [&] {
        // One operation however many pieces it takes (they cannot outnumber its bytes by much).
        if (absl::Status s = CanEnqueueLocked(); !s.ok()) return s;
        for (const Waiting& op : ops) waiting_.push_back(op);
        PumpLocked();
        return absl::OkStatus();
      },
      [&] { return LeftEnqueue(ops); });
}

void Connection::WithdrawBulk(uint64_t token) {
  static_cast<void>(Submit(
      false,
      [&] {
        WithdrawLocked(token);
        return absl::OkStatus();
      },
      [&] {
        LeftOp* op = NewLeftOp(LeftOp::kWithdraw);
        op->token = token;
        return op;
      }));
}

absl::StatusOr<ExposureKeys> Connection::Expose(absl::Span<const ExposedRange> ranges,
                                                uint64_t token) {
  if (!device_.has_windows()) {
    return absl::UnimplementedError(absl::StrCat(
        device_.selection().device, " has no type-2 memory windows to expose through"));
  }
  if (!open()) return Closed(peer_address_);
  return exposures_.Reserve(ranges, token, options_.max_exposures);
}

absl::Status Connection::SendExposing(const ExposureKeys& keys, const SendBuffer& buffer,
                                      uint32_t length) {
  if (length > max_message_) {
    ReleaseSendBuffer(buffer);
    return TooLong(length, max_message_);
  }
  if (keys.count < 1 || keys.count > ExposureKeys::kMaxRanges) {
    ReleaseSendBuffer(buffer);
    return absl::InvalidArgumentError("SendExposing: an exposure of 1 or 2 ranges");
  }
  Waiting ops[ExposureKeys::kMaxRanges + 1];
  for (int i = 0; i < keys.count; ++i) {
    ops[i] = Waiting{Waiting::kBind, SlotPool::kNoSlot, static_cast<uint32_t>(i), {}, keys.id};
    ops[i].report = false;
  }
  ops[keys.count] = Unreported(buffer, length);
  const auto all = absl::MakeConstSpan(ops, keys.count + 1);
  absl::Status s = Submit(
      true,
      [&] {
        if (absl::Status s = CanEnqueueLocked(); !s.ok()) return s;
        // All or none, pushed together: no other message comes between the binds and the SEND
        // that names their keys. The last push may pass max_waiting by two.
        for (int i = 0; i < keys.count; ++i) waiting_.push_back(ops[i]);
        return EnqueueLocked(ops[keys.count], /*checked=*/true);
      },
      [&] { return LeftEnqueue(all); });
  if (!s.ok()) ReleaseSendBuffer(buffer);
  return s;
}

absl::Status Connection::SendInvalidating(const SendBuffer& buffer, uint32_t length,
                                          uint32_t rkey) {
  if (length > max_message_) {
    ReleaseSendBuffer(buffer);
    return TooLong(length, max_message_);
  }
  Waiting op = Unreported(buffer, length);
  op.invalidates = true;
  op.remote.rkey = rkey;
  absl::Status s = Submit(
      true, [&] { return EnqueueLocked(op); },
      [&] {
        return LeftEnqueue({&op, 1});
      });
  if (!s.ok()) ReleaseSendBuffer(buffer);
  return s;
}

void Connection::EndExposure(uint64_t id) {
  static_cast<void>(Submit(
      false,
      [&] {
        EndExposureLocked(id);
        return absl::OkStatus();
      },
      [&] {
        LeftOp* op = NewLeftOp(LeftOp::kEndExposure);
        op->token = id;
        return op;
      }));
}

void Connection::EndExposureLocked(uint64_t id) {
  // Closed: the drain reported it already (EndAll), or reports it now.
  std::optional<uint64_t> token = exposures_.End(id);
  if (!token) return;
  Event e(Event::kSendDone);
  e.handle_or_token = *token;
  e.status = absl::CancelledError("exposure ended before the peer said it was done");
  pending_events_.push_back(std::move(e));  // the poller reports it (RunBatchLocked, ExitLocked)
}

void Connection::BindExposureLocked(const Waiting& op) {
  ibv_send_wr bind;
  if (!exposures_.TakeBind(op.token, static_cast<int>(op.length), &bind)) return;
  AppendBindLocked(bind);
  PostChainLocked();
  exposures_.Posted();
}

bool Connection::QuietLocked() {
  // Quiet: nothing in flight, or only the run of binds just appended (the last thing appended was
  // a bind, and the run began on an empty queue: nothing else goes behind binds in flight,
  // BindsPendingLocked). rxe retires a bind at the head of its send queue before it looks at any
  // acknowledgement, so a retransmission goes back to the work after the run at the earliest,
  // never into it (device.h, binds_survive_retry).
  if (quiet_binds_ && !in_flight_.empty() && next_sequence_ != bind_run_end_) {
    if (!bind_waits_) {
      bind_waits_ = true;
      ++stats_.binds_waited;
    }
    // Its completion retires everything before it, and the pump that follows (AfterChangeLocked)
    // comes back here. A tail signalled already, or a full queue (which holds one), needs none.
    static_cast<void>(PostTailSignalLocked(/*probe=*/false));
    return false;
  }
  bind_waits_ = false;
  return true;
}

void Connection::AppendBindLocked(const ibv_send_wr& bind) {
  bind_run_end_ = next_sequence_ + 1;  // the run of binds QuietLocked allowed goes on to here
  const uint32_t i = chain_length_++;
  chain_wrs_[i] = bind;
  chain_wrs_[i].wr_id = next_sequence_++;
  chain_wrs_[i].next = nullptr;
  if (i > 0) chain_wrs_[i - 1].next = &chain_wrs_[i];
  in_flight_.push_back(InFlight{chain_wrs_[i].wr_id, SlotPool::kNoSlot, 0, false, 0, false});
  if (ABSL_PREDICT_FALSE(quiet_binds_)) {
    // Retired by its own completion before anything goes behind it (BindsPendingLocked).
    chain_wrs_[i].send_flags |= IBV_SEND_SIGNALED;
    unsignaled_ = 0;
    owe_signal_ = false;
    ++stats_.signalled;
  } else {
    unsignaled_ += 1;
  }
  ++stats_.work_requests;
}

absl::Status Connection::OnInvalidatedLocked(uint32_t rkey, Events& events) {
  absl::StatusOr<uint64_t> token = exposures_.Invalidated(rkey);
  if (!token.ok()) return token.status();
  // Before the message that carried it: the exposure is over when the peer says so.
  Event e(Event::kSendDone);
  e.handle_or_token = *token;
  events.push_back(std::move(e));
  return absl::OkStatus();
}

void Connection::WithdrawLocked(uint64_t token) {
  // Not open: the drain reports the write (flushed) if it is still here.
  if (state_ != State::kOpen) return;
  for (size_t i = 0; i < waiting_.size(); ++i) {
    if (waiting_[i].kind != Waiting::kWrite || waiting_[i].token != token) continue;
    size_t end = i + 1;
    if (end < waiting_.size() && waiting_[end].kind == Waiting::kMessage) {
      FreeSendSlotLocked(waiting_[end].slot);
      ++end;
    }
    waiting_.erase(i, end);
    Event e(Event::kSendDone);
    e.handle_or_token = token;
    e.status = absl::CancelledError("withdrawn before it was posted");
    pending_events_.push_back(std::move(e));  // the poller reports it (RunBatchLocked, ExitLocked)
    PumpLocked();                             // what waited behind it may go now
    return;
  }
}

absl::Status Connection::CanEnqueueLocked() const {
  if (state_ != State::kOpen) {
    return absl::UnavailableError(absl::StrCat("connection to ", peer_address_, " is closed",
                                               error_.ok() ? "" : ": ", error_.message()));
  }
  if (waiting_.size() >= options_.max_waiting) {
    return absl::ResourceExhaustedError(absl::StrCat(
        options_.max_waiting, " operations already wait for credits on this connection"));
  }
  return absl::OkStatus();
}

absl::Status Connection::EnqueueLocked(const Waiting& op, bool checked) {
  if (!checked) {
    if (absl::Status s = CanEnqueueLocked(); !s.ok()) return s;
  }
  waiting_.push_back(op);
  if (CorkedLocked()) {
    if (!cork_opens_) {
      cork_pending_ = true;  // posted with the others later in the batch (DispatchCorked)
      return absl::OkStatus();
    }
    // The batch's last handler sends: what the others held goes with it, at once, and what
    // this handler sends next goes as it comes.
    cork_open_ = true;
    cork_pending_ = false;
  }
  PumpLocked();
  if (!waiting_.empty()) ++stats_.waited;  // this one could not go at once
  return absl::OkStatus();
}

static_assert(kCqGrantChunk >= kSignalInterval,
              "a full grant must hold a signalled work request (completion_budget.h)");

bool Connection::GrowCqGrantLocked() {
  const uint32_t granted = cq_granted_.load(std::memory_order_relaxed);
  const uint32_t more = std::min(kCqGrantChunk, options_.send_queue_depth - granted);
  // While others wait, a connection that holds entries already does not grow past them: what
  // the holders give back goes to the waiters. (One busy without a pause still keeps its grant:
  // poller.h, "Capacity".)
  if ((granted == 0 || !poller_.cq_short()) && poller_.TakeCqEntries(more)) {
    cq_granted_.store(granted + more, std::memory_order_relaxed);
    return true;
  }
  // None free: the poller asks the holders back and gives this connection a pass then
  // (OnCqRequestLocked). Its operations wait meanwhile, as for credits.
  if (!cq_waiting_) {
    cq_waiting_ = true;
    ++stats_.cq_waits;
    poller_.WaitForCqEntries(shared_from_this());
  }
  return false;
}

void Connection::GiveBackCqLocked(uint32_t keep) {
  // A compare-and-swap, not a store: Unregister may take what is left from another thread (a
  // poller's Shutdown clearing connections that did not drain), and then nothing is left here.
  uint32_t granted = cq_granted_.load(std::memory_order_relaxed);
  while (granted > keep) {
    if (cq_granted_.compare_exchange_weak(granted, keep, std::memory_order_acq_rel)) {
      poller_.GiveCqEntries(granted - keep);
      return;
    }
  }
}

void Connection::AskForCqEntries() {
  if (cq_request_queued_.exchange(true, std::memory_order_acq_rel)) return;  // not run yet
  RunInDomain(cq_request_);
}

void Connection::CqRequest::RunInDomain(Connection& connection) {
  connection.cq_request_queued_.store(false, std::memory_order_release);
  connection.domain_.AssertHeld();
  connection.OnCqRequestLocked();
}

void Connection::OnCqRequestLocked() {
  if (state_ != State::kOpen) {
    cq_waiting_ = false;
    return;
  }
  if (cq_waiting_) {
    cq_waiting_ = false;
    PumpLocked();  // waits again if there is still none
    if (probe_owed_) static_cast<void>(PostTailSignalLocked(/*probe=*/true));
    return;
  }
  // What it does not use goes back at once: it keeps whole grants covering what is in flight (a
  // full grant of at least kCqGrantChunk holds a signalled work request, so it never stalls on
  // its own), and none once nothing is.
  const auto in_flight = static_cast<uint32_t>(in_flight_.size());
  GiveBackCqLocked((in_flight + kCqGrantChunk - 1) / kCqGrantChunk * kCqGrantChunk);
  // What is in flight may stay there, unsignalled, until the next send: a signal at its tail
  // brings its completion, after which the rest goes back (AfterChangeLocked, while short). Only
  // within the grant kept, which must not grow for it; a full grant holds a signalled one anyway.
  if (in_flight > 0 && in_flight < cq_granted_.load(std::memory_order_relaxed)) {
    static_cast<void>(PostTailSignalLocked(/*probe=*/false));
  }
}

bool Connection::CorkedLocked() const { return InBatch() && !cork_open_; }

// Posts waiting operations in order while credits, arena space and send-queue entries last, as
// one chain (one doorbell per kPostBatch work requests).
void Connection::PumpLocked() {
  if (CorkedLocked()) {
    // Only when there is something to post: a Release during the batch usually has nothing
    // (its credit rides on the next data frame), and then the batch's end takes no lock.
    if (!waiting_.empty() || credits_.ShouldSendUpdate() || arena_reader_.ShouldReport() ||
        ArenaOwedLocked() || ParkWorkLocked()) {
      cork_pending_ = true;
    }
    return;
  }
  while (!waiting_.empty() && state_ == State::kOpen) {
    Waiting& op = waiting_.front();
    // Where binds wait for a quiet send queue: a loan's bind that waits holds back everything
    // behind it, or a busy connection would never be quiet (MaybeSendArenaFramesLocked posts it);
    // and nothing but another bind goes behind binds still in flight (BindsPendingLocked).
    if (ABSL_PREDICT_FALSE(quiet_binds_) &&
        (LendWaitsLocked() || (op.kind != Waiting::kBind && BindsPendingLocked()))) {
      break;
    }
    // The last credit is for credit frames. Checked before the room, so that a connection the
    // peer holds back takes no completion-queue entries meanwhile.
    // Messages and writes take a credit; reads and binds do not (kinds in that order).
    if (op.kind <= Waiting::kWrite && !credits_.CanSpendForData()) break;
    if (!SendRoomLocked()) break;
    if (op.kind == Waiting::kRead) {
      PostReadLocked(op);  // no credit: the peer's NIC answers, nothing is received
    } else if (op.kind == Waiting::kBind) {
      // No credit either: the bind runs on this side's NIC. Not bound when its exposure ended
      // meanwhile (EndExposure): the message behind it then names a dead key.
      // Posted at once, so that the window's key can be updated after its post (Posted) with no
      // test on every other post: an exposure is for a large transfer, a doorbell more is nothing.
      if (ABSL_PREDICT_FALSE(!QuietLocked())) break;  // everything behind it waits too
      BindExposureLocked(op);
      if (state_ != State::kOpen) return;
    } else if (op.kind == Waiting::kWrite) {
      std::optional<ArenaSpot> spot = arena_writer_.TryReserve(op.source.size);  // WriteBulk
      if (!spot) {  // checked CheckFits: full, or (on demand) not lent
        if (arena_writer_.ShouldAsk()) {
          arena_writer_.Asked();
          arena_owed_ |= kOweAsk;
        }
        break;
      }
      credits_.TrySpendForData();
      PostBulkLocked(op.source, *spot, op.token);
    } else {
      credits_.TrySpendForData();
      // A completion is wanted when something waits on it (OnSendDone, or the slot of a message
      // too long to inline) and the next operation might not follow at once (nothing waits, or
      // it may lack a credit, a queue entry or arena space): an unsignalled work request with
      // nothing behind it would leave that waiting on future traffic. Otherwise only the
      // interval asks for one, to keep the send queue retiring.
      // An earlier message left unsignalled because this one followed hands its obligation on
      // (owe_signal_): the completion that retires it must come from here or later.
      const bool inlined = FrameHeader::kSize + op.length <= max_inline_;
      const bool awaited = op.report || !inlined || owe_signal_;
      const bool next_may_stall =
          waiting_.size() == 1 || waiting_[1].kind != Waiting::kMessage ||
          !credits_.CanSpendForData() ||
          in_flight_.size() + 1 >= cq_granted_.load(std::memory_order_relaxed);
      const bool signal = unsignaled_ + 1 >= kSignalInterval || (awaited && next_may_stall);
      owe_signal_ = awaited && !signal;
      if (ABSL_PREDICT_FALSE(op.invalidates)) {
        // The template just for this one: every other message and frame is a plain SEND.
        send_wr_.opcode = IBV_WR_SEND_WITH_INV;
        send_wr_.invalidate_rkey = op.remote.rkey;
        PostMessageLocked(op.slot, op.length, FrameKind::kData, op.token, op.report, signal);
        send_wr_.opcode = IBV_WR_SEND;
      } else {
        PostMessageLocked(op.slot, op.length, FrameKind::kData, op.token, op.report, signal);
      }
    }
    waiting_.pop_front();
    if (chain_length_ == kPostBatch) {
      PostChainLocked();
      if (state_ != State::kOpen) return;
    }
  }
  if (ABSL_PREDICT_FALSE(ArenaOwedLocked())) MaybeSendArenaFramesLocked();
  if (ABSL_PREDICT_FALSE(ParkWorkLocked())) MaybeSendParkFramesLocked();
  MaybeSendCreditFrameLocked();
  PostChainLocked();
}

void Connection::PostMessageLocked(uint32_t slot, uint32_t length, FrameKind kind, uint64_t token,
                                   bool report, bool signal) {
  const bool control = kind != FrameKind::kData;  // in the connection's own control slot
  uint8_t* frame = device_.slots().data(slot);
  FrameHeader header;
  header.arena_released = arena_reader_.released_total();
  header.credits = credits_.TakeOwed();
  header.kind = kind;
  EncodeFrameHeader(header, frame);
  arena_reader_.MarkReported();
  uint32_t total = FrameHeader::kSize + length;
  ibv_sge sge{reinterpret_cast<uintptr_t>(frame), total, device_.slots().lkey(slot)};
  // Inline: the bytes are copied into the work request when it is posted, and the slot is free
  // then (PostChainLocked). The control slot is the connection's own: never freed.
  const bool inlined = total <= max_inline_;
  send_wr_.send_flags = (signal ? IBV_SEND_SIGNALED : 0) | (inlined ? IBV_SEND_INLINE : 0);
  AppendLocked(send_wr_, sge, control ? SlotPool::kNoSlot : slot, token, report,
               inlined && !control);
  if (control) {
    control_busy_ = !inlined;  // until its completion retires it
    control_sequence_ = next_sequence_ - 1;
    if (kind == FrameKind::kCredit) ++stats_.credit_frames_sent;
  } else {
    ++stats_.messages_sent;
  }
}

void Connection::PostBulkLocked(const BulkSource& source, const ArenaSpot& spot, uint64_t token) {
  write_wr_.imm_data = htonl(spot.imm);
  write_wr_.wr.rdma.remote_addr = peer_.arena_addr + spot.offset;
  AppendLocked(write_wr_,
               ibv_sge{reinterpret_cast<uintptr_t>(source.data), source.size, source.lkey},
               SlotPool::kNoSlot, token, true, false);
  ++stats_.bulk_sent;
}

void Connection::PostReadLocked(const Waiting& op) {
  read_wr_.wr.rdma.remote_addr = op.remote.addr;
  read_wr_.wr.rdma.rkey = op.remote.rkey;
  // Signalled when it reports (the destination is the caller's once it completes), and on the
  // usual interval so the send queue keeps freeing.
  const bool signal = op.report || unsignaled_ + 1 >= kSignalInterval;
  read_wr_.send_flags = signal ? IBV_SEND_SIGNALED : 0;
  bytes_read_ += op.source.size;
  AppendLocked(read_wr_,
               ibv_sge{reinterpret_cast<uintptr_t>(op.source.data), op.source.size, op.source.lkey},
               SlotPool::kNoSlot, op.token, op.report, false);
}

void Connection::AppendLocked(const ibv_send_wr& wr, const ibv_sge& sge, uint32_t slot,
                              uint64_t token, bool report, bool inlined) {
  const uint32_t i = chain_length_++;
  chain_sges_[i] = sge;
  ibv_send_wr& link = chain_wrs_[i];
  link = wr;
  link.wr_id = next_sequence_++;
  link.sg_list = &chain_sges_[i];
  link.num_sge = 1;
  link.next = nullptr;
  if (i > 0) chain_wrs_[i - 1].next = &link;
  const bool transfer = wr.opcode == IBV_WR_RDMA_WRITE_WITH_IMM || wr.opcode == IBV_WR_RDMA_READ;
  const uint32_t bytes = transfer ? sge.length : 0;
  in_flight_.push_back(InFlight{link.wr_id, slot, token, report, bytes, inlined});
  transfer_bytes_in_flight_ += bytes;
  const bool signalled = (wr.send_flags & IBV_SEND_SIGNALED) != 0;
  unsignaled_ = signalled ? 0 : unsignaled_ + 1;
  if (signalled) owe_signal_ = false;  // it retires everything before it
  ++stats_.work_requests;
  stats_.bytes_sent += sge.length;  // a READ's taken back out in StatsLocked
  if (signalled) ++stats_.signalled;
  stats_.max_credits_in_use = std::max(stats_.max_credits_in_use, credits_.in_flight());
}

void Connection::PostChainLocked() {
  // First the receives: this chain may carry the credits they back.
  if (!RecvChainPostedLocked()) {
    chain_length_ = 0;  // not posted: they stay in flight, reported by the drain
    return;
  }
  const uint32_t length = chain_length_;
  if (length == 0) return;
  chain_length_ = 0;
  ibv_send_wr* bad = nullptr;
  const int rc = ibv_post_send(qp_->qp, &chain_wrs_[0], &bad);
  ++stats_.doorbells;
  // Work requests before `bad` were posted; from it on, none was (they stay in flight, with their
  // slots, until the drain reports them with the error).
  uint32_t posted = length;
  if (rc != 0) posted = bad == nullptr ? 0 : static_cast<uint32_t>(bad - &chain_wrs_[0]);
  // The chain's entries are the last `length` of in_flight_; the inlined ones free their slots.
  const size_t first = in_flight_.size() - length;
  for (uint32_t i = 0; i < posted; ++i) {
    InFlight& entry = in_flight_[first + i];
    if (!entry.inlined) continue;
    FreeSendSlotLocked(entry.slot);
    entry.slot = SlotPool::kNoSlot;
    entry.inlined = false;
  }
  if (rc != 0) FailLocked(VerbsError("ibv_post_send", rc));
}

// An explicit credit frame, when credits or arena space are owed and no data frame carried them.
void Connection::MaybeSendCreditFrameLocked() {
  if (state_ != State::kOpen) {
    // The client's kAuth, its first frame, alone (connection_auth.cc).
    if (ABSL_PREDICT_FALSE(auth_frame_owed_) && state_ == State::kVerifying && !control_busy_ &&
        SendRoomLocked() && credits_.TrySpendForUpdate()) {
      SendAuthFrameLocked();
    }
    return;
  }
  credits_.RetryGrowth();  // a peer left short while the budget was dry (credits.h)
  // Arena releases alone never spend the reserved credit (credits.h).
  bool report_arena = arena_reader_.ShouldReport() && credits_.CanSpendForData();
  if (!credits_.ShouldSendUpdate() && !report_arena) return;
  if (ABSL_PREDICT_FALSE(quiet_binds_) && HoldsFramesLocked()) return;  // sent once the bind went
  // Retried on the next completion if the send queue is full or the last credit frame (when the
  // device cannot inline it) is still in flight. Credit frames never take a slot from the pool:
  // a pool emptied by waiting messages must not stop credits from coming back.
  if (control_busy_ || credits_.available() < 1 || !SendRoomLocked()) return;
  if (!credits_.TrySpendForUpdate()) return;
  // The server's kAuthOk carries what a credit frame would (the whole window, owed).
  if (ABSL_PREDICT_FALSE(auth_frame_owed_)) return SendAuthFrameLocked();
  PostMessageLocked(control_slot_, 0, FrameKind::kCredit, 0, false, /*signal=*/true);
}

// Receives go back in chains: the releases of a batch (or of one application thread's stay in the
// domain) become one ibv_post_recv, one doorbell and one pass through the provider's lock. The
// chain is posted before any send, since a send may carry the credits these receives back (the
// peer must find them posted), and before the holder lets go of the domain.
void Connection::RepostRecvLocked(uint32_t index) {
  if (state_ == State::kDraining || state_ == State::kClosed) {
    // Into a queue pair in the error state it would never come back flushed (rxe), and the
    // drain waits for every posted RECV: the slot waits for the destructor instead.
    recv_state_[index] = RecvState::kIdle;
    return;
  }
  const uint32_t i = recv_chain_length_++;
  ibv_recv_wr& wr = recv_chain_[i];
  wr.wr_id = kRecvBit | index;
  wr.sg_list = &recv_sges_[index];
  wr.num_sge = 1;
  wr.next = nullptr;
  if (i > 0) recv_chain_[i - 1].next = &wr;
  recv_state_[index] = RecvState::kPosted;
}

absl::Status Connection::PostRecvChainNowLocked() {
  const uint32_t length = recv_chain_length_;
  recv_chain_length_ = 0;
  uint32_t posted = 0;
  int rc = 0;
  // Failing since they were chained: as in RepostRecvLocked, they wait for the destructor.
  if (state_ != State::kDraining && state_ != State::kClosed) {
    ibv_recv_wr* bad = nullptr;
    rc = ibv_post_recv(qp_->qp, recv_chain_.data(), &bad);
    // Those before `bad` were posted; from it on, none was.
    posted = rc == 0          ? length
             : bad == nullptr ? 0
                              : static_cast<uint32_t>(bad - recv_chain_.data());
    recvs_posted_ += posted;
    stats_.recvs_posted += posted;
    ++stats_.recv_doorbells;
  }
  for (uint32_t i = posted; i < length; ++i) {
    recv_state_[recv_chain_[i].wr_id & ~kRecvBit] = RecvState::kIdle;
  }
  return rc == 0 ? absl::OkStatus() : VerbsError("ibv_post_recv", rc);
}

absl::Status Connection::Release(uint64_t handle) {
  return Submit(
      false,
      [&] {
        absl::Status s = ReleaseLocked(handle);
        // The release rides on waiting data, or goes in a credit frame (corked in a batch: with
        // the batch's next send, or at its end).
        if (state_ == State::kOpen) PumpLocked();
        return s;
      },
      [&] {
        LeftOp* op = NewLeftOp(LeftOp::kRelease);
        op->release = handle;
        return op;
      });
}

absl::Status Connection::ReleaseAndSend(uint64_t handle, const SendBuffer& buffer,
                                        uint32_t length) {
  if (length > max_message_) {
    ReleaseSendBuffer(buffer);
    static_cast<void>(Release(handle));  // the credit goes alone
    return TooLong(length, max_message_);
  }
  const Waiting op = Unreported(buffer, length);
  bool released = false;
  absl::Status s = Submit(
      true,
      [&] {
        // First the release, so that the message carries the credit it returns.
        static_cast<void>(ReleaseLocked(handle));
        released = true;
        absl::Status s = EnqueueLocked(op);
        if (!s.ok() && state_ == State::kOpen) PumpLocked();  // the credit goes alone
        return s;
      },
      [&] {
        LeftOp* left = LeftEnqueue({&op, 1});
        left->has_release = true;
        left->release = handle;
        released = true;  // by the holder
        return left;
      });
  if (!s.ok()) {
    ReleaseSendBuffer(buffer);
    // Refused before the domain was reached (closed): the receive still goes back.
    if (!released) static_cast<void>(Release(handle));
  }
  return s;
}

absl::Status Connection::ReleaseLocked(uint64_t handle) {
  if (handle & kBulkHandle) {
    absl::Status s = arena_reader_.Release(handle & ~kBulkHandle);
    // The last payload of a loan given back: the loan's piece can go (on a closed connection, its
    // window went at the close).
    if (s.ok() && arena_reader_.in_use() == 0) {
      if (arena_reader_.Reclaimable()) {
        ReclaimArenaLocked();
      } else if (state_ == State::kClosed && arena_piece_ != kNoPiece) {
        GivePieceBackLocked();
      }
    }
    return s;
  }
  if (handle >= recv_slots_.size() || recv_state_[handle] != RecvState::kHeld) {
    return absl::FailedPreconditionError(
        absl::StrCat("message ", handle, " released twice or never delivered"));
  }
  auto index = static_cast<uint32_t>(handle);
  recv_state_[index] = RecvState::kIdle;
  if (shared_receives_) {
    // The slot goes back: the shared queue was refilled when it arrived.
    GiveSlot(recv_slots_[index]);
    recv_slots_[index] = SlotPool::kNoSlot;
    recv_free_.push_back(index);
    if (state_ == State::kOpen) credits_.OnRecvReposted();
    return absl::OkStatus();
  }
  if (state_ != State::kOpen) return absl::OkStatus();  // the slot waits for the destructor
  RepostRecvLocked(index);
  credits_.OnRecvReposted();
  return absl::OkStatus();
}

absl::Status Connection::Probe() {
  if (!open()) return Closed(peer_address_);
  return Submit(
      false, [&] { return PostTailSignalLocked(/*probe=*/true); },
      [&] { return NewLeftOp(LeftOp::kProbe); });
}

absl::Status Connection::Flush() {
  if (!open()) return Closed(peer_address_);
  return Submit(
      false, [&] { return PostTailSignalLocked(/*probe=*/false); },
      [&] { return NewLeftOp(LeftOp::kFlush); });
}

absl::Status Connection::PostTailSignalLocked(bool probe) {
  if (state_ != State::kOpen) {
    return absl::UnavailableError(absl::StrCat("connection to ", peer_address_, " is closed"));
  }
  // A signalled work request at the tail will complete or fail: it is the probe, and it retires
  // everything before it. An unsignalled one may have completed silently already. With nothing
  // in flight, a probe posts and a flush has nothing to do.
  if (in_flight_.empty() ? !probe : unsignaled_ == 0) return absl::OkStatus();
  // The send queue (or the completion-queue entries granted) is full: its signalled entries will
  // make room, and the next pump signals. With nothing in flight, the poller had no entry to
  // grant: a probe goes when it gives this connection its pass (OnCqRequestLocked).
  if (!SendRoomLocked()) {
    if (probe && in_flight_.empty()) probe_owed_ = true;
    return absl::OkStatus();
  }
  if (probe) probe_owed_ = false;
  // Zero bytes at the base of the peer's arena: nothing is written. IB C9-88 lets a zero-length
  // WRITE skip the key check (rxe does, and ConnectX): an arena lent on demand has no address or
  // key before its first loan, and a dead one after a recall.
  ibv_send_wr wr{};
  wr.opcode = IBV_WR_RDMA_WRITE;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.wr.rdma.remote_addr = peer_.arena_addr;
  wr.wr.rdma.rkey = peer_.arena_rkey;
  AppendLocked(wr, ibv_sge{}, SlotPool::kNoSlot, 0, /*report=*/false, false);
  chain_wrs_[chain_length_ - 1].num_sge = 0;
  PostChainLocked();
  if (state_ != State::kOpen) return error_;
  if (probe) ++stats_.probes_sent;
  return absl::OkStatus();
}

void Connection::Close() {
  // Closed for every caller from now on, even when the close itself is left to the domain's
  // holder: an operation after Close() is refused at once, as it always was.
  gate_.fetch_and(~kGateOpen, std::memory_order_acq_rel);
  static_cast<void>(Submit(
      false,
      [&] {
        FailLocked(absl::CancelledError("connection closed by this side"));
        return absl::OkStatus();
      },
      [&] { return NewLeftOp(LeftOp::kClose); }));
}

bool Connection::OnCompletions(absl::Span<const ibv_wc> wcs) {
  if (stash_.empty() && domain_.TryEnter()) {
    RunBatchLocked(wcs);
    return true;
  }
  // Another thread is in the domain for a moment (one operation of its own, no user code): the
  // poller does not wait for it. The completions wait here, after any kept before, and the
  // poller tries again on its next pass (RetryStashed). Reserved once: a connection has at most
  // cq_entries() completions outstanding, and with a shared receive queue at most its window of
  // receives besides, so this never grows in steady state.
  if (stash_.capacity() == 0) {
    stash_.reserve(cq_entries() + (shared_receives_ ? options_.recv_credits : 0));
  }
  stash_.insert(stash_.end(), wcs.begin(), wcs.end());
  return RetryStashed();
}

bool Connection::RetryStashed() {
  if (!domain_.TryEnter()) return false;
  // Handled in the order they came, before anything the poller reads later.
  std::vector<ibv_wc> stash;
  stash.swap(stash_);
  RunBatchLocked(stash);
  stash.clear();
  if (stash_.empty()) stash_.swap(stash);  // keep the reserved buffer
  return true;
}

// Sends of the batch's handlers are held until the last message's (or payload's) handler sends
// its first: then all go as one chain. Holding them to the end of the batch instead would add the
// last handler's remaining work (releases, metrics) to every round trip, even a batch of one.
void Connection::DispatchBatchLocked(Events& events) {
  size_t last = events.size();  // the last message or payload
  for (size_t i = 0; i < events.size(); ++i) {
    if (events[i].kind == Event::kMessage || events[i].kind == Event::kBulk) last = i;
  }
  const Connection* outer = batch_connection;  // a handler of another connection's batch
  batch_connection = this;
  cork_open_ = false;
  cork_opens_ = false;
  for (size_t i = 0; i < events.size(); ++i) {
    cork_opens_ = i == last;
    DispatchOne(events[i]);
  }
  batch_connection = outer;
  if (!cork_pending_) return;
  cork_pending_ = false;
  PumpLocked();
  if (!waiting_.empty()) ++stats_.waited;
}

void Connection::ReplayEarly() {
  // Held by another thread: it hands the poller what is for it when it lets go (ExitLocked).
  if (domain_.TryEnter()) RunBatchLocked({});
}

void Connection::HandleEarlyLocked(Events& events) {
  if (early_shared_ > initial_window()) {
    FailLocked(absl::FailedPreconditionError(
        absl::StrCat("peer sent beyond its credits (", early_shared_, " frames for ",
                     initial_window(), " credits) before the handshake ended")));
  }
  early_shared_ = 0;  // counted before the handshake only
  while (!early_.empty()) {
    const ibv_wc wc = early_.front();
    early_.pop_front();
    HandleCompletionLocked(wc, events);
  }
}

void Connection::HandleCompletionLocked(const ibv_wc& wc, Events& events) {
  const bool recv = (wc.wr_id & kRecvBit) != 0;
  const bool marker = (wc.wr_id & kMarkerBit) != 0;
  if (wc.status != IBV_WC_SUCCESS || marker) {
    // The first real failure breaks the connection; the flushes that follow it are expected.
    // (FailLocked ignores it while draining: the error text is built only when it counts.)
    if (!marker &&
        (state_ == State::kOpen || state_ == State::kConnecting || state_ == State::kVerifying)) {
      FailLocked(CompletionError(wc));
    }
    if (recv && (wc.wr_id & kSharedBit) != 0) {
      // The shared queue's slot it arrived in is this connection's now: back to the pool.
      GiveSlot(WorkRequestIndex(wc.wr_id));
    } else if (recv) {
      recv_state_[wc.wr_id & ~kRecvBit] = RecvState::kIdle;
      --recvs_posted_;
    } else {
      RetireLocked(marker ? ~uint64_t{0} : wc.wr_id, error_, events);
      if (marker) sq_drained_ = true;
    }
    if (DrainedLocked()) FinishDrainLocked(events);
    return;
  }
  if (recv) {
    HandleRecvLocked(wc, events);
  } else {
    RetireLocked(wc.wr_id, absl::OkStatus(), events);
  }
  if (state_ == State::kDraining && DrainedLocked()) FinishDrainLocked(events);
}

void Connection::HandleRecvLocked(const ibv_wc& wc, Events& events) {
  // A receive of this connection's own: its index in the table. One of the poller's shared
  // queue: the pool slot it arrived in, which is this connection's now (the poller posted the
  // queue's entry again with another).
  const bool shared = (wc.wr_id & kSharedBit) != 0;
  const auto id = WorkRequestIndex(wc.wr_id);
  if (!shared) --recvs_posted_;
  const uint32_t slot = shared ? id : recv_slots_[id];
  // The buffer is done with: a receive of its own is posted again (`repost`) or, failing, waits
  // for the destructor; a shared queue's slot goes back to the pool.
  auto give_back = [&](bool repost) {
    if (shared) {
      GiveSlot(slot);
    } else if (repost) {
      RepostRecvLocked(id);
    } else {
      recv_state_[id] = RecvState::kIdle;
    }
  };
  // Failing: what arrived is dropped -- unless the peer hung up in order. Then every RECV that
  // completed before the flush holds a whole message the peer sent before its disconnect (RC
  // delivers in order), such as a server's last answers at its graceful Shutdown, which this
  // side may simply have polled after the disconnect event: they are delivered. (No RECV is
  // reposted while failing: RepostRecvLocked.)
  if (state_ != State::kOpen && !(state_ == State::kDraining && IsPeerDisconnect(error_))) {
    if (state_ == State::kVerifying) {
      // The handshake's frame (connection_auth.cc): its receive is owed back once verified.
      stats_.bytes_received += wc.byte_len;  // as its sender counted it
      const bool verified = VerifyPeerLocked(wc, device_.slots().data(slot));
      give_back(verified);
      if (verified) credits_.OnRecvReposted();
      return;
    }
    return give_back(false);
  }
  absl::Status s = credits_.OnConsumed();
  if (!s.ok()) {
    give_back(false);
    return FailLocked(s);
  }
  park_used_ = true;  // not idle since the poller's last look (OnParkRequestLocked)
  stats_.bytes_received += wc.byte_len;
  if (wc.opcode == IBV_WC_RECV_RDMA_WITH_IMM) {
    // A bulk payload: the RECV only carried the immediate, so it goes straight back.
    uint32_t imm = ntohl(wc.imm_data);
    absl::StatusOr<uint64_t> sequence = arena_reader_.OnArrival(imm, wc.byte_len);
    give_back(sequence.ok());
    if (!sequence.ok()) return FailLocked(sequence.status());
    credits_.OnRecvReposted();
    if (ABSL_PREDICT_FALSE(credits_.parking()) && credits_.MaybeParked()) NoteParkedLocked();
    ++stats_.bulk_received;
    arena_used_ = true;
    Event e(Event::kBulk);
    e.data = arena_base_ + ArenaReader::offset(imm);
    e.size = wc.byte_len;
    e.handle_or_token = *sequence | kBulkHandle;
    events.push_back(std::move(e));
    return;
  }
  if (wc.opcode != IBV_WC_RECV) {
    give_back(false);
    return FailLocked(absl::InternalError(absl::StrCat("unexpected receive opcode ", wc.opcode)));
  }
  const uint8_t* frame = device_.slots().data(slot);
  absl::StatusOr<FrameHeader> header = DecodeFrameHeader(absl::MakeConstSpan(frame, wc.byte_len));
  if (!header.ok()) {
    give_back(false);
    return FailLocked(header.status());
  }
  if (s = credits_.OnReturned(header->credits); !s.ok()) {
    give_back(false);
    return FailLocked(s);
  }
  if (ABSL_PREDICT_FALSE(knocked_) && credits_.OnGrantArrived()) knocked_ = false;
  if (ABSL_PREDICT_FALSE((wc.wc_flags & invalidated_flags_) != 0)) {
    // The peer ended one of this side's exposures (Expose): only a data frame may.
    if (header->kind != FrameKind::kData) {
      give_back(false);
      return FailLocked(absl::FailedPreconditionError(
          "peer sent a frame other than a message as a SEND_WITH_INV"));
    }
    if (s = OnInvalidatedLocked(wc.invalidated_rkey, events); !s.ok()) {
      give_back(false);
      return FailLocked(s);
    }
  }
  if (s = arena_writer_.OnReleased(header->arena_released); !s.ok()) {
    give_back(false);
    return FailLocked(s);
  }
  // A peer asked to park whose last credit went into this frame (a credit frame, or any frame of
  // a peer that ignores the rules) holds none now: parked. A kParked says so itself.
  if (ABSL_PREDICT_FALSE(credits_.parking()) && header->kind != FrameKind::kParked &&
      credits_.MaybeParked()) {
    NoteParkedLocked();
  }
  if (header->kind == FrameKind::kCredit) {
    give_back(true);
    credits_.OnRecvReposted();
    return;
  }
  if (ABSL_PREDICT_FALSE(header->kind >= FrameKind::kPark)) {
    give_back(true);
    credits_.OnRecvReposted();
    if (header->kind == FrameKind::kAuth || header->kind == FrameKind::kAuthOk) {
      return FailLocked(
          absl::FailedPreconditionError("peer sent an authentication frame outside the handshake"));
    }
    if (header->kind == FrameKind::kParked) {
      if (s = credits_.OnParked(); !s.ok()) return FailLocked(s);
      return NoteParkedLocked();
    }
    if ((peer_.flags & kHelloParks) == 0) {
      return FailLocked(
          absl::FailedPreconditionError("peer sent kPark, but its Hello did not say it parks"));
    }
    if (s = credits_.OnParkAsked(); !s.ok()) return FailLocked(s);
    knocked_ = false;  // a new park: the next wish to send knocks again
    ++stats_.parks_answered;
    return;
  }
  if (header->kind == FrameKind::kArena) {
    // Handled here and done with, as a credit frame is: its receive is owed back at once.
    absl::StatusOr<ArenaMessage> message =
        DecodeArenaMessage(absl::MakeConstSpan(frame + FrameHeader::kSize, ArenaMessage::kSize));
    give_back(true);
    credits_.OnRecvReposted();
    if (!message.ok()) return FailLocked(message.status());
    if (s = HandleArenaMessageLocked(*message); !s.ok()) return FailLocked(s);
    return;
  }
  // The message is held until its Release. A shared queue's slot takes a free index of the
  // table: one is there, since each held message took a credit (OnConsumed) and a credit comes
  // back only with its message's Release, so at most recv_credits are held.
  uint32_t index = id;
  if (shared) {
    index = recv_free_.front();
    recv_free_.pop_front();
    recv_slots_[index] = slot;
  }
  recv_state_[index] = RecvState::kHeld;
  ++stats_.messages_received;
  Event e(Event::kMessage);
  e.data = frame + FrameHeader::kSize;
  e.size = wc.byte_len - static_cast<uint32_t>(FrameHeader::kSize);
  e.handle_or_token = index;
  events.push_back(std::move(e));
}

void Connection::RetireLocked(uint64_t up_to, const absl::Status& status, Events& events) {
  while (!in_flight_.empty() && in_flight_.front().sequence <= up_to) {
    const InFlight& f = in_flight_.front();
    if (f.sequence == control_sequence_) control_busy_ = false;
    if (f.slot != SlotPool::kNoSlot) FreeSendSlotLocked(f.slot);
    transfer_bytes_in_flight_ -= f.transfer;
    if (f.report) {
      Event e(Event::kSendDone);
      e.handle_or_token = f.token;
      e.status = status;
      events.push_back(std::move(e));
    }
    in_flight_.pop_front();
  }
}

// Enters the error state: hangs up (the kernel moves the QP to the error state and tells the
// peer) and posts a marker to each queue; once both come back flushed, every earlier work
// request has completed, and FinishDrainLocked reports what is left.
void Connection::FailLocked(absl::Status why) {
  if (state_ == State::kDraining || state_ == State::kClosed) return;
  // Before the peer is verified the failure is the handshake's outcome (connection_auth.cc).
  if (ABSL_PREDICT_FALSE(auth_ != nullptr) && !auth_->finished()) auth_->Finish(why);
  error_ = std::move(why);
  SetStateLocked(State::kDraining);
  rdma_disconnect(id_.get());
  ibv_qp_attr attr{};
  attr.qp_state = IBV_QPS_ERR;
  ibv_modify_qp(qp_->qp, &attr, IBV_QP_STATE);  // in case the disconnect did not (no peer)
  // The send queue's marker: once it completes (flushed), every earlier work request has. The
  // receive queue needs none: it is drained when every posted RECV has come back flushed (rxe on
  // Linux 6.1 never flushes a RECV posted after the error, so a receive marker would hang). A
  // marker that cannot be posted is replaced by a flushed completion made up here.
  ibv_send_wr marker{};
  marker.wr_id = kMarkerBit;
  marker.opcode = IBV_WR_SEND;
  marker.send_flags = IBV_SEND_SIGNALED;
  ibv_send_wr* bad = nullptr;
  bool defer = false;
  if (ibv_post_send(qp_->qp, &marker, &bad) != 0) {
    MakeUpMarkerLocked();
    defer = true;
  }
  draining_since_ns_.store(SteadyNanos(), std::memory_order_relaxed);
  if (poller_.draining_.fetch_add(1, std::memory_order_acq_rel) == 0) poller_.WakeCm();
  if (defer) poller_.Defer(shared_from_this());
}

void Connection::MakeUpMarkerLocked() {
  ibv_wc flushed{};
  flushed.wr_id = kMarkerBit;
  flushed.status = IBV_WC_WR_FLUSH_ERR;
  flushed.qp_num = qp_num_;
  early_.push_back(flushed);
}

void Connection::LeaveDrainWatch() {
  if (draining_since_ns_.exchange(0, std::memory_order_relaxed) != 0) {
    poller_.draining_.fetch_sub(1, std::memory_order_acq_rel);
  }
}

void Connection::GiveUpOnDrain() {
  if (!domain_.TryEnter()) return;
  if (state_ == State::kDraining && !drain_given_up_) {
    drain_given_up_ = true;
    ZRPC_LOG(kWarning, "transport", "the connection to ", peer_address_, " did not drain within ",
             absl::FormatDuration(Poller::kDrainGiveUp), " of its failure (",
             DebugStringLocked(/*query_qp=*/false), "): what it had posted is given up");
    // In the error state the device moves no data for the queue pair. Without a shared receive
    // queue it also goes to reset, which drops what was posted for good (its own receives
    // included, which rxe never flushes). Not with one: a provider may then clean the queue
    // pair's unpolled completions from the CQ (mlx5 does) and hand their shared receives back
    // to the queue behind the poller's count of what is posted.
    if (!shared_receives_) {
      ibv_qp_attr attr{};
      attr.qp_state = IBV_QPS_RESET;
      ibv_modify_qp(qp_->qp, &attr, IBV_QP_STATE);
    }
    if (!sq_drained_) MakeUpMarkerLocked();
    last_wqe_reached_ = true;  // not coming either
    for (RecvState& state : recv_state_) {
      if (state == RecvState::kPosted) state = RecvState::kIdle;
    }
    recvs_posted_ = 0;
  }
  ExitLocked();  // handles the marker from early_: the drain ends there
}

void Connection::FinishDrainLocked(Events& events) {
  if (state_ == State::kClosed) return;
  SetStateLocked(State::kClosed);
  LeaveDrainWatch();
  // A loan ends with the connection: its window goes now (nothing arrives any more, and the key
  // must die), its piece once the application has released every payload in it.
  if (arena_piece_ != kNoPiece) {
    arena_window_.reset();
    if (arena_reader_.in_use() == 0) GivePieceBackLocked();
  }
  // Exposures end with it too, their windows deallocated (a LOCAL_INV would be flushed unrun).
  for (uint64_t token : exposures_.EndAll()) {
    Event e(Event::kSendDone);
    e.handle_or_token = token;
    e.status = error_;
    events.push_back(std::move(e));
  }
  RetireLocked(~uint64_t{0}, error_, events);
  for (size_t i = 0; i < waiting_.size(); ++i) {
    const Waiting& op = waiting_[i];
    if (op.kind == Waiting::kMessage) FreeSendSlotLocked(op.slot);
    if (!op.report) continue;  // sent without a token, or a READ whose last piece reports
    Event e(Event::kSendDone);
    e.handle_or_token = op.token;
    e.status = error_;
    events.push_back(std::move(e));
  }
  waiting_.clear();
  Event closed(Event::kClosed);
  closed.status = error_;
  events.push_back(std::move(closed));
}

namespace {
// Marks the close reason of a peer's disconnect (IsPeerDisconnect).
constexpr absl::string_view kPeerDisconnect = "zrpc.transport/peer-disconnect";
}  // namespace

bool IsPeerDisconnect(const absl::Status& why) {
  return why.GetPayload(kPeerDisconnect).has_value();
}

void Connection::OnCmEvent(rdma_cm_event_type type) {
  static_cast<void>(Submit(
      false,
      [&] {
        CmEventLocked(type);
        return absl::OkStatus();
      },
      [&] {
        LeftOp* op = NewLeftOp(LeftOp::kCmEvent);
        op->cm_event = type;
        return op;
      }));
}

void Connection::CmEventLocked(rdma_cm_event_type type) {
  switch (type) {
    case RDMA_CM_EVENT_DISCONNECTED: {
      absl::Status why = absl::UnavailableError(
          absl::StrCat("the peer at ", peer_address_, " disconnected (or its process died)"));
      why.SetPayload(kPeerDisconnect, absl::Cord());
      FailLocked(std::move(why));
      break;
    }
    case RDMA_CM_EVENT_DEVICE_REMOVAL:
      FailLocked(absl::UnavailableError("the RDMA device was removed"));
      break;
    default:  // TIMEWAIT_EXIT and the like need nothing
      break;
  }
}

void Connection::OnDeviceEvent(ibv_event_type type) {
  static_cast<void>(Submit(
      false,
      [&] {
        DeviceEventLocked(type);
        return absl::OkStatus();
      },
      [&] {
        LeftOp* op = NewLeftOp(LeftOp::kDeviceEvent);
        op->device_event = type;
        return op;
      }));
}

void Connection::DeviceEventLocked(ibv_event_type type) {
  if (type == IBV_EVENT_QP_LAST_WQE_REACHED) {
    // No receive of the shared queue can complete for this queue pair any more, and the poller
    // polled its completion queue empty before passing the event on (Poller::RunQueuedEvents):
    // the drain may end (the domain's exit looks).
    last_wqe_reached_ = true;
    return;
  }
  if (state_ == State::kDraining || state_ == State::kClosed) return;  // failing already
  ZRPC_LOG(kError, "transport", "connection to ", peer_address_, ": the device reported ",
           ibv_event_type_str(type), " on its queue pair ", qp_num_);
  FailLocked(absl::UnavailableError(absl::StrCat(
      "the RDMA device failed this connection's queue pair (", ibv_event_type_str(type), ")")));
}

void Connection::RunOnClosed() {
  if (on_closed_ == nullptr) return;
  std::function<void()> hook = std::move(on_closed_);
  on_closed_ = nullptr;
  hook();
}

void Connection::DispatchOne(Event& e) {
  switch (e.kind) {
    case Event::kMessage:
      handler_->OnMessage(*this, ReceivedMessage{e.data, e.size, e.handle_or_token});
      break;
    case Event::kBulk:
      handler_->OnBulk(*this, ReceivedBulk{e.data, e.size, e.handle_or_token});
      break;
    case Event::kSendDone:
      handler_->OnSendDone(*this, e.handle_or_token, e.status);
      break;
    case Event::kSendSlotFree:
      handler_->OnSendSlotFree(*this);
      break;
    case Event::kClosed:
      // A connection whose peer was never verified was never the handler's (connection_auth.cc).
      if (ABSL_PREDICT_TRUE(auth_ == nullptr) || auth_->verified()) {
        handler_->OnClosed(*this, e.status);
      } else {
        auth_->Finish(e.status);
      }
      RunOnClosed();
      poller_.Unregister(qp_num_);
      break;
  }
}

}  // namespace zrpc::transport

namespace zrpc::transport {

// ---- Arenas lent on demand (arena.h, "Loans").

void Connection::AskForArena() {
  if (arena_request_queued_.exchange(true, std::memory_order_acq_rel)) return;  // not run yet
  RunInDomain(arena_request_);
}

void Connection::ArenaRequest::RunInDomain(Connection& connection) {
  connection.arena_request_queued_.store(false, std::memory_order_release);
  connection.domain_.AssertHeld();
  connection.OnArenaRequestLocked();
}

void Connection::OnArenaRequestLocked() {
  const bool waiting = arena_waiting_;
  arena_waiting_ = false;
  if (state_ != State::kOpen) return;
  if (waiting) TryLendLocked();
  switch (arena_reader_.loan_state()) {
    case ArenaReader::Loan::kLent: {
      // Used since the last look: it keeps the loan until the next (a second chance, so a
      // connection in the middle of a transfer is not made to ask again at once), unless it
      // has had its turn: a peer writing a payload every few milliseconds would otherwise keep
      // the piece while others wait, and one client could hold a poller's whole pool so. Nor is
      // a loan recalled before its lend has gone (the peer would hear of a loan it does not
      // hold), or while the application holds payloads in it: its piece could not go back
      // before they are released, and the peer's next write would wait for them too.
      const bool turn_over = SteadyNanos() - arena_lent_ns_ >= absl::ToInt64Nanoseconds(kLoanTurn);
      if ((arena_used_ && !turn_over) || (arena_owed_ & kOweLend) != 0 ||
          arena_reader_.in_use() != 0) {
        arena_used_ = false;
        break;
      }
      arena_reader_.Recall();
      arena_owed_ |= kOweRecall;
      arena_recalled_ns_ = 0;  // the give-up counts from the recall's post
      ++stats_.arena_recalls;
      break;
    }
    case ArenaReader::Loan::kRecalled:
      // A peer that keeps what it was asked to give back holds a piece every other connection of
      // the poller may be waiting for: it loses its connection.
      if (arena_recalled_ns_ != 0 &&
          SteadyNanos() - arena_recalled_ns_ > absl::ToInt64Nanoseconds(kRecallGiveUp)) {
        FailLocked(absl::ResourceExhaustedError(absl::StrCat(
            "the peer did not return its arena loan ", arena_reader_.loan(), " within ",
            absl::FormatDuration(kRecallGiveUp), " of its recall while others waited for one")));
        return;
      }
      break;
    default:
      break;
  }
  PumpLocked();
}

void Connection::TryLendLocked() {
  if (state_ != State::kOpen || !arena_reader_.Lendable()) return;
  ArenaPool* pool = poller_.arena_pool();
  std::optional<uint32_t> piece = pool->Take();
  if (!piece) {
    // No piece could ever be made (registration refused: RLIMIT_MEMLOCK): waiting would be for
    // good.
    if (pool->made() == 0 && !pool->last_error().ok()) {
      FailLocked(absl::ResourceExhaustedError(
          absl::StrCat("cannot lend the arena: ", pool->last_error().message())));
      return;
    }
    if (!arena_waiting_) {
      arena_waiting_ = true;
      ++stats_.arena_waits;
      poller_.WaitForArena(shared_from_this());
    }
    return;
  }
  absl::StatusOr<std::unique_ptr<MemoryWindow>> window = MemoryWindow::Allocate(device_.pd());
  if (!window.ok()) {
    poller_.GiveArenaPiece(*piece);
    FailLocked(absl::Status(window.status().code(),
                            absl::StrCat("cannot lend the arena: ", window.status().message())));
    return;
  }
  arena_window_ = *std::move(window);
  arena_piece_ = *piece;
  arena_base_ = pool->data(*piece);
  arena_lent_.store(true, std::memory_order_relaxed);
  arena_reader_.Lend();
  arena_used_ = true;  // a fresh loan is not recalled at the next look
  arena_lent_ns_ = SteadyNanos();
  arena_owed_ |= kOweLend;
  lend_bound_ = false;
  ++stats_.arena_loans;
}

void Connection::ReclaimArenaLocked() {
  // Deallocating the window invalidates its key on the NIC before the piece can be lent through
  // another window to another peer.
  arena_window_.reset();
  GivePieceBackLocked();
  arena_reader_.Reclaimed();
  TryLendLocked();  // an ask that came meanwhile
}

void Connection::GivePieceBackLocked() {
  // Nothing owed of the loan is sent any more (a peer that returned a loan before its recall
  // went, say).
  arena_owed_ &= ~(kOweLend | kOweRecall);
  lend_bound_ = false;
  poller_.GiveArenaPiece(arena_piece_);
  arena_piece_ = kNoPiece;
  arena_base_ = nullptr;
  arena_lent_.store(false, std::memory_order_relaxed);
}

absl::Status Connection::HandleArenaMessageLocked(const ArenaMessage& m) {
  switch (m.op) {
    case ArenaOp::kAsk: {
      if (absl::Status s = arena_reader_.OnAsk(); !s.ok()) return s;
      TryLendLocked();
      return absl::OkStatus();
    }
    case ArenaOp::kLend: {
      if (absl::Status s = arena_writer_.OnLend(m.loan, m.size); !s.ok()) return s;
      peer_.arena_addr = m.addr;
      peer_.arena_rkey = m.rkey;
      write_wr_.wr.rdma.rkey = m.rkey;
      return absl::OkStatus();
    }
    case ArenaOp::kRecall: {
      if (absl::Status s = arena_writer_.OnRecall(m.loan); !s.ok()) return s;
      arena_owed_ |= kOweReturned;
      return absl::OkStatus();
    }
    case ArenaOp::kReturned: {
      if (absl::Status s = arena_reader_.OnReturned(m.loan); !s.ok()) return s;
      if (arena_reader_.Reclaimable()) ReclaimArenaLocked();
      return absl::OkStatus();
    }
  }
  return absl::InternalError("unreachable arena op");
}

void Connection::MaybeSendArenaFramesLocked() {
  while (state_ == State::kOpen && ArenaOwedLocked()) {
    // Nothing behind binds in flight, a loan's lend neither.
    if (ABSL_PREDICT_FALSE(quiet_binds_) && BindsPendingLocked()) return;
    // One frame at a time in the control slot, posted at once (below): a credit frame after it
    // in this pass would write the same slot before the chain is posted.
    if (control_busy_ || !credits_.CanSpendForData()) return;
    if (chain_length_ + 2 > kPostBatch) {
      PostChainLocked();
      if (state_ != State::kOpen) return;
    }
    ArenaMessage m;
    if (arena_owed_ & kOweReturned) {
      // Behind every WRITE into the loan this side posted: they land before it does.
      m.op = ArenaOp::kReturned;
      m.loan = arena_writer_.loan();
    } else if (arena_owed_ & kOweAsk) {
      m.op = ArenaOp::kAsk;
    } else if ((arena_owed_ & kOweLend) == 0) {
      // A recall goes after its loan's lend (never owed together: OnArenaRequestLocked).
      m.op = ArenaOp::kRecall;
      m.loan = arena_reader_.loan();
    } else {
      if (!lend_bound_) {
        if (!SendRoomLocked() || !QuietLocked()) return;
        ibv_send_wr bind{};
        const ArenaPool& pool = *poller_.arena_pool();
        lend_rkey_ = arena_window_->PrepareBind(
            pool.mr(arena_piece_), reinterpret_cast<uintptr_t>(arena_base_), pool.piece_size(),
            IBV_ACCESS_REMOTE_WRITE, 0, &bind);
        // A window is bound once (a new one per loan), so its key in ibv_mw needs no update.
        AppendBindLocked(bind);
        lend_bound_ = true;
        if (BindsPendingLocked()) {  // the lend goes once the bind's completion came back
          PostChainLocked();
          return;
        }
      }
      m.op = ArenaOp::kLend;
      m.loan = arena_reader_.loan();
      m.addr = reinterpret_cast<uintptr_t>(arena_base_);
      m.rkey = lend_rkey_;
      m.size = poller_.arena_pool()->piece_size();
    }
    if (!SendRoomLocked()) return;
    credits_.TrySpendForData();
    EncodeArenaMessage(m, device_.slots().data(control_slot_) + FrameHeader::kSize);
    PostMessageLocked(control_slot_, ArenaMessage::kSize, FrameKind::kArena, 0, false,
                      /*signal=*/true);
    switch (m.op) {
      case ArenaOp::kReturned:
        arena_owed_ &= ~kOweReturned;
        break;
      case ArenaOp::kAsk:
        arena_owed_ &= ~kOweAsk;
        ++stats_.arena_asks;
        break;
      case ArenaOp::kRecall:
        arena_owed_ &= ~kOweRecall;
        arena_recalled_ns_ = SteadyNanos();
        break;
      case ArenaOp::kLend:
        arena_owed_ &= ~kOweLend;
        break;
    }
    PostChainLocked();
  }
}

}  // namespace zrpc::transport
