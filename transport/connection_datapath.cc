// The connection's datapath: posting sends and bulk writes, handling completions, credits,
// and the drain that fails outstanding work exactly once. Setup is in connection_setup.cc.
#include <arpa/inet.h>

#include <algorithm>
#include <iterator>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "transport/connection.h"
#include "transport/log.h"
#include "transport/poller.h"
#include "transport/verbs_error.h"

namespace zrpc::transport {
namespace {

// wr_id layout. Send-queue work requests carry their sequence number (below 2^62); receives
// carry kRecvBit | their index; the send queue's drain marker carries kMarkerBit. The bit is
// needed because a failed completion's opcode is undefined.
constexpr uint64_t kRecvBit = uint64_t{1} << 63;
constexpr uint64_t kMarkerBit = uint64_t{1} << 62;
// Handles of bulk payloads carry this bit; handles of messages are receive indices.
constexpr uint64_t kBulkHandle = uint64_t{1} << 63;

// The connection whose completion batch this thread is dispatching (DispatchCorked), if any.
thread_local const Connection* corked_connection = nullptr;

}  // namespace

bool Connection::open() const { return open_.load(std::memory_order_acquire); }

void Connection::SetStateLocked(State state) {
  state_ = state;
  open_.store(state == State::kOpen, std::memory_order_release);
}

ConnectionStats Connection::stats() const {
  absl::MutexLock lock(&mu_);
  ConnectionStats stats = stats_;
  stats.arena_in_use = arena_reader_.in_use();
  stats.sends_outstanding = static_cast<uint32_t>(waiting_.size() + in_flight_.size());
  stats.waiting = static_cast<uint32_t>(waiting_.size());
  stats.transfer_bytes_in_flight = transfer_bytes_in_flight_;
  return stats;
}

std::string Connection::DebugString() const {
  absl::MutexLock lock(&mu_);
  // The queue pair as the device sees it: a transfer that never completes shows whether the
  // device still thinks the queue pair can send.
  ibv_qp_attr attr{};
  ibv_qp_init_attr init{};
  const int rc = ibv_query_qp(
      qp_->qp, &attr,
      IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC,
      &init);
  return absl::StrCat(
      "state ", static_cast<int>(state_), ", credits available ", credits_.available(), " of ",
      peer_.recv_credits, ", owed ", credits_.owed(), ", waiting ", waiting_.size(), ", in flight ",
      in_flight_.size(), " (oldest ", in_flight_.empty() ? 0 : in_flight_.front().sequence,
      ", next ", next_sequence_, "), recvs posted ", recvs_posted_, ", early ", early_.size(),
      ", arena in use ", arena_writer_.in_use(), " (peer) / ", arena_reader_.in_use(), " (own)",
      rc != 0 ? absl::StrCat(", ibv_query_qp failed (", rc, ")")
              : absl::StrCat(", qp state ", attr.qp_state, " timeout ", attr.timeout, " retry ",
                             attr.retry_cnt, " rnr retry ", attr.rnr_retry, " reads ",
                             attr.max_rd_atomic));
}

absl::StatusOr<SendBuffer> Connection::AcquireSendBuffer(uint32_t leave_free) {
  // The per-connection quota comes first: a peer that stops returning credits makes messages
  // wait, each in a slot of the device-wide pool, and must not drain it for everyone else.
  const uint32_t limit =
      options_.max_send_slots - std::min(leave_free, options_.max_send_slots - 1);
  if (send_slots_held_.fetch_add(1, std::memory_order_relaxed) >= limit) {
    send_slots_held_.fetch_sub(1, std::memory_order_relaxed);
    return absl::ResourceExhaustedError(absl::StrCat(
        "the connection to ", peer_address_, " already holds ", limit,
        " messages being built, waiting for credits or in flight (max_send_slots ",
        options_.max_send_slots,
        limit < options_.max_send_slots
            ? absl::StrCat(", less ", options_.max_send_slots - limit, " kept for other messages)")
            : std::string(")")));
  }
  SlotPool& pool = device_.slots();
  uint32_t slot = pool.Allocate();
  if (slot == SlotPool::kNoSlot) {
    send_slots_held_.fetch_sub(1, std::memory_order_relaxed);
    return pool.ExhaustedError("for a message");
  }
  return SendBuffer{pool.data(slot) + FrameHeader::kSize, max_message_, slot};
}

void Connection::ReleaseSendBuffer(const SendBuffer& buffer) { FreeSendSlot(buffer.slot); }

void Connection::FreeSendSlot(uint32_t slot) {
  static_cast<void>(device_.slots().Free(slot));
  send_slots_held_.fetch_sub(1, std::memory_order_relaxed);
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

absl::Status Connection::Send(const SendBuffer& buffer, uint32_t length, uint64_t token) {
  if (length > max_message_) {
    ReleaseSendBuffer(buffer);
    return TooLong(length, max_message_);
  }
  absl::MutexLock lock(&mu_);
  absl::Status s = EnqueueLocked(Waiting{Waiting::kMessage, buffer.slot, length, {}, token});
  if (!s.ok()) ReleaseSendBuffer(buffer);
  return s;
}

absl::Status Connection::Send(const SendBuffer& buffer, uint32_t length) {
  if (length > max_message_) {
    ReleaseSendBuffer(buffer);
    return TooLong(length, max_message_);
  }
  absl::MutexLock lock(&mu_);
  absl::Status s = EnqueueLocked(Unreported(buffer, length));
  if (!s.ok()) ReleaseSendBuffer(buffer);
  return s;
}

absl::Status Connection::WriteBulk(const BulkSource& source, uint64_t token) {
  absl::MutexLock lock(&mu_);
  if (auto s = arena_writer_.CheckFits(source.size); !s.ok()) return s;
  return EnqueueLocked(Waiting{Waiting::kWrite, SlotPool::kNoSlot, 0, source, token});
}

absl::Status Connection::WriteBulkThenSend(const BulkSource& source, uint64_t token,
                                           const SendBuffer& buffer, uint32_t length) {
  if (length > max_message_) return TooLong(length, max_message_);
  absl::MutexLock lock(&mu_);
  if (auto s = arena_writer_.CheckFits(source.size); !s.ok()) return s;
  if (absl::Status s = CanEnqueueLocked(); !s.ok()) return s;
  // Both or neither: pushed together under the lock, nothing can come between them; the
  // second push may pass max_waiting by one.
  waiting_.push_back(Waiting{Waiting::kWrite, SlotPool::kNoSlot, 0, source, token});
  return EnqueueLocked(Unreported(buffer, length), /*checked=*/true);
}

absl::Status Connection::ReadBulk(absl::Span<const ReadPart> parts, uint64_t token) {
  size_t last = parts.size();  // the part whose last piece reports
  for (size_t i = 0; i < parts.size(); ++i) {
    if (parts[i].sink.size > 0) last = i;
  }
  if (last == parts.size()) return absl::InvalidArgumentError("ReadBulk: an empty sink");
  const uint32_t piece = std::max<uint32_t>(device_.selection().max_msg_size, 1u << 16);
  absl::MutexLock lock(&mu_);
  // One operation however many pieces it takes (they cannot outnumber its bytes by much).
  if (absl::Status s = CanEnqueueLocked(); !s.ok()) return s;
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
      waiting_.push_back(op);
      if (final_piece) break;  // offset + piece may wrap past 4 GiB
    }
  }
  PumpLocked();
  return absl::OkStatus();
}

bool Connection::WithdrawBulk(uint64_t token) {
  absl::MutexLock lock(&mu_);
  if (state_ != State::kOpen) return false;
  for (size_t i = 0; i < waiting_.size(); ++i) {
    if (waiting_[i].kind != Waiting::kWrite || waiting_[i].token != token) continue;
    size_t end = i + 1;
    if (end < waiting_.size() && waiting_[end].kind == Waiting::kMessage) {
      FreeSendSlot(waiting_[end].slot);
      ++end;
    }
    waiting_.erase(i, end);
    PumpLocked();  // what waited behind it may go now
    return true;
  }
  return false;
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

bool Connection::CorkedLocked() const { return corked_connection == this && !cork_open_; }

// Posts waiting operations in order while credits, arena space and send-queue entries last, as
// one chain (one doorbell per kPostBatch work requests).
void Connection::PumpLocked() {
  if (corked_connection == this && !deferred_releases_.empty()) ApplyDeferredReleasesLocked();
  if (CorkedLocked()) {
    // Only when there is something to post: a Release during the batch usually has nothing
    // (its credit rides on the next data frame), and then the batch's end takes no lock.
    if (!waiting_.empty() || credits_.ShouldSendUpdate() || arena_reader_.ShouldReport()) {
      cork_pending_ = true;
    }
    return;
  }
  while (!waiting_.empty() && state_ == State::kOpen) {
    if (in_flight_.size() >= options_.send_queue_depth) break;
    Waiting& op = waiting_.front();
    if (op.kind == Waiting::kRead) {
      PostReadLocked(op);  // no credit: the peer's NIC answers, nothing is received
    } else if (!credits_.CanSpendForData()) {
      break;  // the last credit is for credit frames
    } else if (op.kind == Waiting::kWrite) {
      std::optional<ArenaSpot> spot = arena_writer_.TryReserve(op.source.size);  // WriteBulk
      if (!spot) break;  // checked CheckFits
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
      const bool next_may_stall = waiting_.size() == 1 || waiting_[1].kind != Waiting::kMessage ||
                                  !credits_.CanSpendForData() ||
                                  in_flight_.size() + 1 >= options_.send_queue_depth;
      const bool signal = unsignaled_ + 1 >= kSignalInterval || (awaited && next_may_stall);
      owe_signal_ = awaited && !signal;
      PostMessageLocked(op.slot, op.length, FrameKind::kData, op.token, op.report, signal);
    }
    waiting_.pop_front();
    if (chain_length_ == kPostBatch) {
      PostChainLocked();
      if (state_ != State::kOpen) return;
    }
  }
  MaybeSendCreditFrameLocked();
  PostChainLocked();
}

void Connection::PostMessageLocked(uint32_t slot, uint32_t length, FrameKind kind, uint64_t token,
                                   bool report, bool signal) {
  const bool control = kind == FrameKind::kCredit;  // in the connection's own control slot
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
    ++stats_.credit_frames_sent;
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
  if (signalled) ++stats_.signalled;
  stats_.max_credits_in_use = std::max(stats_.max_credits_in_use, credits_.in_flight());
}

void Connection::PostChainLocked() {
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
    FreeSendSlot(entry.slot);
    entry.slot = SlotPool::kNoSlot;
    entry.inlined = false;
  }
  if (rc != 0) FailLocked(VerbsError("ibv_post_send", rc));
}

// An explicit credit frame, when credits or arena space are owed and no data frame carried them.
void Connection::MaybeSendCreditFrameLocked() {
  if (state_ != State::kOpen) return;
  // Arena releases alone never spend the reserved credit (credits.h).
  bool report_arena = arena_reader_.ShouldReport() && credits_.CanSpendForData();
  if (!credits_.ShouldSendUpdate() && !report_arena) return;
  // Retried on the next completion if the send queue is full or the last credit frame (when the
  // device cannot inline it) is still in flight. Credit frames never take a slot from the pool:
  // a pool emptied by waiting messages must not stop credits from coming back.
  if (in_flight_.size() >= options_.send_queue_depth || control_busy_) return;
  if (!credits_.TrySpendForUpdate()) return;
  PostMessageLocked(control_slot_, 0, FrameKind::kCredit, 0, false, /*signal=*/true);
}

absl::Status Connection::RepostRecvLocked(uint32_t index) {
  if (state_ == State::kDraining || state_ == State::kClosed) {
    // Into a queue pair in the error state it would never come back flushed (rxe), and the
    // drain waits for every posted RECV: the slot waits for the destructor instead.
    recv_state_[index] = RecvState::kIdle;
    return absl::OkStatus();
  }
  uint32_t slot = recv_slots_[index];
  recv_sge_.addr = reinterpret_cast<uintptr_t>(device_.slots().data(slot));
  recv_sge_.lkey = device_.slots().lkey(slot);
  recv_wr_.wr_id = kRecvBit | index;
  ibv_recv_wr* bad = nullptr;
  if (int rc = ibv_post_recv(qp_->qp, &recv_wr_, &bad); rc != 0) {
    return VerbsError("ibv_post_recv", rc);
  }
  recv_state_[index] = RecvState::kPosted;
  ++recvs_posted_;
  return absl::OkStatus();
}

absl::Status Connection::Release(uint64_t handle) {
  if (corked_connection == this && (handle & kBulkHandle) == 0 &&
      deferred_releases_.size() < deferred_releases_.capacity()) {
    // A handler of this connection's batch, on the poller thread: the slot goes back under the
    // lock the batch takes anyway, at its next send (which then carries the credit) or its end.
    deferred_releases_.push_back(handle);
    return absl::OkStatus();
  }
  absl::MutexLock lock(&mu_);
  absl::Status s = ReleaseLocked(handle);
  // The release rides on waiting data, or goes in a credit frame.
  if (state_ == State::kOpen) PumpLocked();
  return s;
}

absl::Status Connection::ReleaseAndSend(uint64_t handle, const SendBuffer& buffer,
                                        uint32_t length) {
  absl::MutexLock lock(&mu_);
  // First the release, so that the message carries the credit it returns.
  static_cast<void>(ReleaseLocked(handle));
  absl::Status s = length > max_message_ ? TooLong(length, max_message_)
                                         : EnqueueLocked(Unreported(buffer, length));
  if (!s.ok()) {
    ReleaseSendBuffer(buffer);
    if (state_ == State::kOpen) PumpLocked();  // the credit goes alone
  }
  return s;
}

void Connection::ApplyDeferredReleasesLocked() {
  // One at a time from the back, so that nothing depends on where the loop stood if a release
  // fails the connection (its state then stops every later pump).
  while (!deferred_releases_.empty()) {
    const uint64_t handle = deferred_releases_.back();
    deferred_releases_.pop_back();
    if (absl::Status s = ReleaseLocked(handle);
        !s.ok() && s.code() == absl::StatusCode::kFailedPrecondition) {
      // Release said OK already: a handle given back twice shows here.
      ZRPC_LOG(kError, "transport", "connection to ", peer_address_, ": ", s.message());
    }
  }
}

absl::Status Connection::ReleaseLocked(uint64_t handle) {
  if (handle & kBulkHandle) return arena_reader_.Release(handle & ~kBulkHandle);
  if (handle >= recv_slots_.size() || recv_state_[handle] != RecvState::kHeld) {
    return absl::FailedPreconditionError(
        absl::StrCat("message ", handle, " released twice or never delivered"));
  }
  auto index = static_cast<uint32_t>(handle);
  recv_state_[index] = RecvState::kIdle;
  if (state_ != State::kOpen) return absl::OkStatus();  // the slot waits for the destructor
  if (auto s = RepostRecvLocked(index); !s.ok()) {
    FailLocked(s);
    return s;
  }
  credits_.OnDataRecvReposted();
  return absl::OkStatus();
}

absl::Status Connection::Probe() {
  absl::MutexLock lock(&mu_);
  return PostTailSignalLocked(/*probe=*/true);
}

absl::Status Connection::Flush() {
  absl::MutexLock lock(&mu_);
  return PostTailSignalLocked(/*probe=*/false);
}

absl::Status Connection::PostTailSignalLocked(bool probe) {
  if (state_ != State::kOpen) {
    return absl::UnavailableError(absl::StrCat("connection to ", peer_address_, " is closed"));
  }
  // A signalled work request at the tail will complete or fail: it is the probe, and it retires
  // everything before it. An unsignalled one may have completed silently already. With nothing
  // in flight, a probe posts and a flush has nothing to do.
  if (in_flight_.empty() ? !probe : unsignaled_ == 0) return absl::OkStatus();
  // The send queue is full: its signalled entries will make room, and the next pump signals.
  if (in_flight_.size() >= options_.send_queue_depth) return absl::OkStatus();
  // Zero bytes at the base of the peer's arena: nothing is written, and the address and rkey
  // are valid anyway (IB C9-88 lets a zero-length WRITE skip the check; not every device does).
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
  absl::MutexLock lock(&mu_);
  FailLocked(absl::CancelledError("connection closed by this side"));
}

void Connection::OnCompletions(absl::Span<const ibv_wc> wcs) {
  Events events;
  {
    absl::MutexLock lock(&mu_);
    for (const ibv_wc& wc : wcs) {
      if (state_ == State::kConnecting || !early_.empty()) {
        early_.push_back(wc);  // ReplayEarly takes them in order once the handshake is done
      } else {
        HandleCompletionLocked(wc, events);
      }
    }
    PumpLocked();  // credits, arena space or send-queue entries may have come back
    if (slot_notice_wanted_.load(std::memory_order_acquire) && state_ == State::kOpen &&
        send_slots_held_.load(std::memory_order_relaxed) < options_.max_send_slots &&
        slot_notice_wanted_.exchange(false, std::memory_order_acq_rel)) {
      events.push_back(Event(Event::kSendSlotFree));
    }
  }
  if (!events.empty()) DispatchCorked(events);
}

// Sends of the batch's handlers are held until the last message's (or payload's) handler sends
// its first: then all go as one chain. Holding them to the end of the batch instead would add the
// last handler's remaining work (releases, metrics) to every round trip, even a batch of one.
void Connection::DispatchCorked(Events& events) {
  size_t last = events.size();  // the last message or payload
  for (size_t i = 0; i < events.size(); ++i) {
    if (events[i].kind == Event::kMessage || events[i].kind == Event::kBulk) last = i;
  }
  const Connection* outer = corked_connection;  // a handler of another connection's batch
  corked_connection = this;
  cork_open_ = false;
  cork_opens_ = false;
  for (size_t i = 0; i < events.size(); ++i) {
    cork_opens_ = i == last;
    DispatchOne(events[i]);
  }
  corked_connection = outer;
  const bool pending = cork_pending_;
  if (!pending && deferred_releases_.empty()) return;
  cork_pending_ = false;
  absl::MutexLock lock(&mu_);
  ApplyDeferredReleasesLocked();
  PumpLocked();
  if (pending && !waiting_.empty()) ++stats_.waited;
}

void Connection::ReplayEarly() {
  for (;;) {
    Events events;
    {
      absl::MutexLock lock(&mu_);
      if (early_.empty()) return;
      ibv_wc wc = early_.front();
      early_.pop_front();
      HandleCompletionLocked(wc, events);
      PumpLocked();
    }
    Dispatch(events);
  }
}

void Connection::HandleCompletionLocked(const ibv_wc& wc, Events& events) {
  const bool recv = (wc.wr_id & kRecvBit) != 0;
  const bool marker = (wc.wr_id & kMarkerBit) != 0;
  if (wc.status != IBV_WC_SUCCESS || marker) {
    // The first real failure breaks the connection; the flushes that follow it are expected.
    // (FailLocked ignores it while draining: the error text is built only when it counts.)
    if (!marker && (state_ == State::kOpen || state_ == State::kConnecting)) {
      FailLocked(CompletionError(wc));
    }
    if (recv) {
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
  auto index = static_cast<uint32_t>(wc.wr_id & ~kRecvBit);
  recv_state_[index] = RecvState::kHeld;
  --recvs_posted_;
  // Failing: what arrived is dropped -- unless the peer hung up in order. Then every RECV that
  // completed before the flush holds a whole message the peer sent before its disconnect (RC
  // delivers in order), such as a server's last answers at its graceful Shutdown, which this
  // side may simply have polled after the disconnect event: they are delivered. (No RECV is
  // reposted while failing: RepostRecvLocked.)
  if (state_ != State::kOpen && !(state_ == State::kDraining && IsPeerDisconnect(error_))) {
    recv_state_[index] = RecvState::kIdle;
    return;
  }
  absl::Status s = credits_.OnConsumed();
  if (!s.ok()) return FailLocked(s);
  if (wc.opcode == IBV_WC_RECV_RDMA_WITH_IMM) {
    // A bulk payload: the RECV only carried the immediate, so it goes straight back.
    uint32_t imm = ntohl(wc.imm_data);
    absl::StatusOr<uint64_t> sequence = arena_reader_.OnArrival(imm, wc.byte_len);
    if (!sequence.ok()) return FailLocked(sequence.status());
    if (s = RepostRecvLocked(index); !s.ok()) return FailLocked(s);
    credits_.OnDataRecvReposted();
    ++stats_.bulk_received;
    Event e(Event::kBulk);
    e.data = arena_.get() + ArenaReader::offset(imm);
    e.size = wc.byte_len;
    e.handle_or_token = *sequence | kBulkHandle;
    events.push_back(std::move(e));
    return;
  }
  if (wc.opcode != IBV_WC_RECV) {
    return FailLocked(absl::InternalError(absl::StrCat("unexpected receive opcode ", wc.opcode)));
  }
  const uint8_t* frame = device_.slots().data(recv_slots_[index]);
  absl::StatusOr<FrameHeader> header = DecodeFrameHeader(absl::MakeConstSpan(frame, wc.byte_len));
  if (!header.ok()) return FailLocked(header.status());
  if (s = credits_.OnReturned(header->credits); !s.ok()) return FailLocked(s);
  if (s = arena_writer_.OnReleased(header->arena_released); !s.ok()) return FailLocked(s);
  if (header->kind == FrameKind::kCredit) {
    if (s = RepostRecvLocked(index); !s.ok()) return FailLocked(s);
    credits_.OnUpdateRecvReposted();
    return;
  }
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
    if (f.slot != SlotPool::kNoSlot) FreeSendSlot(f.slot);
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
    ibv_wc flushed{};
    flushed.wr_id = kMarkerBit;
    flushed.status = IBV_WC_WR_FLUSH_ERR;
    flushed.qp_num = qp_num_;
    early_.push_back(flushed);
    defer = true;
  }
  if (defer) poller_.Defer(shared_from_this());
}

void Connection::FinishDrainLocked(Events& events) {
  if (state_ == State::kClosed) return;
  SetStateLocked(State::kClosed);
  RetireLocked(~uint64_t{0}, error_, events);
  for (size_t i = 0; i < waiting_.size(); ++i) {
    const Waiting& op = waiting_[i];
    if (op.kind == Waiting::kMessage) FreeSendSlot(op.slot);
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
  absl::MutexLock lock(&mu_);
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

void Connection::RunOnClosed() {
  if (on_closed_ == nullptr) return;
  std::function<void()> hook = std::move(on_closed_);
  on_closed_ = nullptr;
  hook();
}

void Connection::Dispatch(Events& events) {
  for (Event& e : events) DispatchOne(e);
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
      handler_->OnClosed(*this, e.status);
      RunOnClosed();
      poller_.Unregister(qp_num_);
      break;
  }
}

}  // namespace zrpc::transport
