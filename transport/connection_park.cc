// Parked windows (credits.h, "Parked windows"): the connection's side of the exchange. A window
// that parks (a server's, on a poller with ParkDoors) is asked to by its poller while others wait
// for floors, sends kPark, parks when the peer answers, and opens again with a floor when the
// poller hears its peer knock. A sending side that is parked answers kPark and knocks.

#include <algorithm>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "transport/byte_order.h"
#include "transport/connection.h"
#include "transport/poller.h"
#include "transport/steady_clock.h"

namespace zrpc::transport {
namespace {

// Where a knock's 8 bytes wait in the control slot while its WRITE is posted: past anything a
// control frame writes there (a header and an ArenaMessage), and 8-aligned.
constexpr size_t kKnockOffset = 64;

}  // namespace

void Connection::AskForPark() {
  if (park_request_queued_.exchange(true, std::memory_order_acq_rel)) return;  // not run yet
  RunInDomain(park_request_);
}

void Connection::KnockHeard() {
  knock_heard_.store(true, std::memory_order_release);
  AskForPark();
}

void Connection::ParkRequest::RunInDomain(Connection& connection) {
  connection.park_request_queued_.store(false, std::memory_order_release);
  connection.domain_.AssertHeld();
  connection.OnParkRequestLocked();
}

void Connection::OnParkRequestLocked() {
  // Off the poller's list of waiters now: a waiter that still finds no floor goes back on it.
  floor_waiting_ = false;
  // A knock heard before the handshake ended on this side (the client's ended first, and it
  // sent at once) is kept for OnEstablished, which asks again. Nor is a window asked to park
  // before the kAuthOk has told the client where to knock (connection_auth.cc).
  if (state_ != State::kOpen || !credits_.parks() || auth_frame_owed_) return;
  if (knock_heard_.exchange(false, std::memory_order_acquire)) knock_pending_ = true;
  if (credits_.parked()) {
    if (knock_pending_) TryUnparkLocked();
  } else if (credits_.parking()) {
    // A peer that keeps the credits it was asked to give up holds a floor others wait for.
    if (SteadyNanos() - park_asked_ns_ > absl::ToInt64Nanoseconds(kParkGiveUp)) {
      FailLocked(absl::ResourceExhaustedError(absl::StrCat(
          "the peer did not give up its credits within ", absl::FormatDuration(kParkGiveUp),
          " of a kPark while others waited for a floor")));
      return;
    }
  } else {
    // Used since the last look: a second chance, unless it has had its turn (kParkTurn) -- a
    // peer that keeps sending would otherwise keep its floor while others wait for one. It
    // knocks again, behind them.
    const bool turn_over = SteadyNanos() - window_opened_ns_ >= absl::ToInt64Nanoseconds(kParkTurn);
    const bool used = std::exchange(park_used_, false);
    if ((!used || turn_over) && credits_.CanAskPark()) credits_.OweParkAsk();
  }
  PumpLocked();
}

void Connection::TryUnparkLocked() {
  if (credits_.Unpark()) {
    knock_pending_ = false;
    window_parked_.store(false, std::memory_order_relaxed);
    park_used_ = true;  // just opened: not taken back at the next look
    window_opened_ns_ = SteadyNanos();
    ++stats_.park_grants;
    return;  // the pump sends the grant (ShouldSendUpdate)
  }
  if (!floor_waiting_) {
    floor_waiting_ = true;
    poller_.WaitForFloor(shared_from_this());
  }
}

void Connection::NoteParkedLocked() {
  ++stats_.parks;
  knock_pending_ = false;
  window_parked_.store(true, std::memory_order_relaxed);
  poller_.WatchDoor(qp_num_, door_->index, door_->token);
  poller_.FloorGivenBack();
}

void Connection::MaybeSendParkFramesLocked() {
  if (state_ != State::kOpen) return;
  if (ABSL_PREDICT_FALSE(quiet_binds_) && HoldsFramesLocked()) return;  // sent once the bind went
  if (credits_.park_ask_owed()) {
    // A message came since the look and is held: not idle after all.
    if (!credits_.CanAskPark()) {
      credits_.DropParkAsk();
    } else if (!control_busy_ && SendRoomLocked()) {
      credits_.TrySpendForData();
      PostMessageLocked(control_slot_, 0, FrameKind::kPark, 0, false, /*signal=*/true);
      park_asked_ns_ = SteadyNanos();
      ++stats_.park_asks;
      if (credits_.AskedPark()) NoteParkedLocked();  // the peer held no credit
      PostChainLocked();  // the control slot is written again by the next frame
      if (state_ != State::kOpen) return;
    }
  }
  if (credits_.park_answer_owed()) {
    // Its credit was spent when the kPark came (CreditAccount::OnParkAsked).
    if (control_busy_ || !SendRoomLocked()) return;
    credits_.AnsweredPark();
    PostMessageLocked(control_slot_, 0, FrameKind::kParked, 0, false, /*signal=*/true);
    PostChainLocked();
    if (state_ != State::kOpen) return;
  }
  // Parked, with something to send: a knock, once per park (the grant ends it). Credits that
  // came without a knock (a window opened by another peer's write on its door) unpark too.
  if (credits_.sender_parked() && credits_.OnGrantArrived()) knocked_ = false;
  if (credits_.sender_parked() && !knocked_ &&
      (!waiting_.empty() || credits_.WantsToReturn() || ArenaOwedLocked())) {
    if (!SendRoomLocked()) return;
    uint8_t* value = device_.slots().data(control_slot_) + kKnockOffset;
    if (++knocks_ == 0) knocks_ = 1;
    PutLe<uint64_t>(value, KnockValue(peer_door_.token, knocks_));
    ibv_send_wr wr{};
    wr.opcode = IBV_WR_RDMA_WRITE;
    wr.send_flags = IBV_SEND_SIGNALED | (max_inline_ >= 8 ? IBV_SEND_INLINE : 0);
    wr.wr.rdma.remote_addr = peer_door_.addr;
    wr.wr.rdma.rkey = peer_door_.rkey;
    AppendLocked(
        wr, ibv_sge{reinterpret_cast<uintptr_t>(value), 8, device_.slots().lkey(control_slot_)},
        SlotPool::kNoSlot, 0, /*report=*/false, false);
    knocked_ = true;
    ++stats_.knocks;
    PostChainLocked();
  }
}

}  // namespace zrpc::transport
