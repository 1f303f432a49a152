// Credit flow control for one connection: never more SENDs in flight than RECVs the peer posted.
//
// A credit is one RECV the peer has posted that this side has not consumed yet. The peer's Hello
// grants `recv_credits` of them (its receive window W), and says how many it may ever grant at
// once (`max_recv_credits`). Every SEND and every WRITE_WITH_IMM consumes one at the peer, so each
// spends one here. When the peer's application is done with a received message, the peer
// re-posts the RECV and owes this side a credit; it returns owed credits in the `credits` field
// of the next frame it sends (wire.h), so in steady two-way traffic credits cost nothing extra. A
// side that has nothing to send returns them in an explicit credit frame once it owes T =
// max(2, W/2), counting the RECVs that data and credit frames consumed alike.
//
// Elastic windows. With a poller's shared receive queue, W is not fixed: the receiver holds a
// claim of W receives on the queue's budget (receive_budget.h), starting at a floor F
// (ConnectionOptions::idle_recv_credits). When a message leaves the peer with fewer than two
// credits it could spend on data, the receiver takes a quarter of W more (at least one, up to
// recv_credits) from the budget's growth and owes them, in a credit frame at once if nothing else
// carries them (the peer may be waiting for them); a growth that found the budget dry is tried
// again before each look for a credit frame to send. When a released RECV finds the peer holding
// two credits plus half the window or more unused, or growth low, the receiver keeps that credit
// back and gives the receive to the budget instead (W shrinks by one, never below F). The gap
// between the two keeps a steady flow from growing and shrinking in turn: a connection with k
// messages in flight settles between about k + 2 and 2k + 4 (one message at a time: F to F + 2,
// as answers, if any, go before or after the requests' release), and any window comes back to
// F as its messages are released while growth is low. The window counts the peer's credits (in
// its hands or on the wire), the messages this side holds and the credits it owes, so the budget
// backs every credit the peer can spend, and held messages are bounded by W too. A window
// shrinks only as its peer's messages come and go: one that went quiet large keeps its claim
// until it is used again or closed (taking credits back from a silent peer would need it to
// answer), which is why growth has a pool of its own.
//
// Deadlock freedom. A credit frame itself consumes a RECV, so two rules keep credits from
// running out on both sides at once:
//  - the last credit is reserved for credit frames: data needs two available, a credit frame one;
//  - a RECV consumed by a credit frame is owed like any other (a side that only writes bulk
//    payloads sends no data frames, so without this it would never return the credits its reader
//    spends on credit frames). A credit frame returns T >= 2 or more and creates one owed credit at
//    the other side, so an exchange of credit frames between idle peers loses at least one owed
//    credit per frame and stops, instead of bouncing forever.
// Then once this side's application has released what it holds, its peer holds W - owed credits
// with owed < T (else a credit frame is due); for W >= 3 (DecodeHello insists, and F >= 3) that
// is two or more, enough for data. A side stuck with one credit thus waits only for its peer's
// application (legitimate back-pressure) or for a credit frame the peer has a credit to send:
// two sides cannot both be stuck, since each one's last credit went into a credit frame that
// returned two or more to the other. Shrinking keeps W >= F >= 3 and growth only adds owed
// credits, so the argument holds at every W. tests/transport/credits_test runs pairs of peers
// through these rules, fixed and elastic, over one budget, and checks that they finish.
// Arena-release reports (arena.h) ride on credit frames only while two credits are available, so
// they never spend the reserved one.
//
// Parked windows. A poller whose floors are all claimed may park an idle connection's window to
// lend its floor to another (receive_budget.h): a receiver that parks (`OwnWindow::parks`; its
// Hello says kHelloParks) sends a kPark frame, which spends a data credit so that its reserved
// one stays, and from then on returns no credit. The sender answers with a kParked frame, its
// last credit spent on it and every other it held given up; or, holding none (its last went into
// a credit frame), with nothing. The receiver knows the window parked when the kParked frame
// arrives, or when the peer has consumed every credit granted (it holds none, and none is on the
// wire: the frames it sent before the kPark came arrive before anything it sends after). Either
// way every credit granted is then spent or given up, so the receiver gives back to the budget
// all its window but the messages it holds, each of them at its release, and what it owed (the
// peer never hears of it). A parked sender knocks on its door (wire.h, ParkDoor: an RDMA WRITE,
// which consumes no receive) when it has something to send; the poller sees the knock, and the
// receiver takes a floor from the budget and grants it in a credit frame, with its reserved
// credit (the one exchange where a credit frame may return fewer than T: the sender knocked
// because it wanted to send, and what it sends next returns what it owes, so the exchange goes
// on). A parked receiver sends data frames with credits left, never a credit frame, so that
// reserved credit is there when the knock comes. A sender counts any returned credit while
// parked as its grant: the receiver returns none between its kPark and that grant.
//
// Not thread-safe: the connection calls it under its lock. The host tests drive it directly.
#ifndef ZRPC_TRANSPORT_CREDITS_H_
#define ZRPC_TRANSPORT_CREDITS_H_

#include <algorithm>
#include <cstdint>

#include "absl/base/attributes.h"
#include "absl/base/optimization.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "transport/receive_budget.h"

namespace zrpc::transport {

// The smallest receive window that keeps the credit scheme deadlock-free (see above).
inline constexpr uint32_t kMinCredits = 3;
// The largest window a peer may claim: what a frame's 16-bit credit field can return at once.
// A peer that claims more RECVs than it posts only hurts its own connection: this side's SENDs
// meet receiver-not-ready and the connection fails after a bounded number of retries (cm_util).
inline constexpr uint32_t kMaxCredits = 65535;

// This side's receive window: fixed (`initial` receives of its own, or of a shared queue's
// budget it never changes) or elastic (`share` set: from `initial`, its floor, up to `max`).
struct OwnWindow {
  uint32_t initial = kMinCredits;
  uint32_t max = kMinCredits;
  ReceiveShare* share = nullptr;  // holds `initial` already (nothing when parked); null: fixed
  bool parks = false;             // elastic only: the window may be parked (above)
  bool parked = false;            // it starts parked: the peer's Hello offers no credit
  // The window is provisional (an accepting side that authenticates, auth.h): the peer's Hello
  // offers one credit, for its kAuth frame, and the rest of the window is owed from the start,
  // returned in the kAuthOk frame once the peer is verified (Confirm). Not with `parked`.
  bool provisional = false;
};

class CreditAccount {
 public:
  // Fixed windows both ways. `peer_window`: the peer's Hello.recv_credits. `own_window`: RECVs
  // this side posts.
  CreditAccount(uint32_t peer_window, uint32_t own_window)
      : CreditAccount(peer_window, peer_window, OwnWindow{own_window, own_window, nullptr}) {}
  // `peer_window` and `peer_max`: the peer's Hello.recv_credits and max_recv_credits.
  CreditAccount(uint32_t peer_window, uint32_t peer_max, OwnWindow own)
      : peer_max_(peer_max),
        available_(peer_window),
        floor_(own.initial),
        max_(own.share != nullptr ? own.max : own.initial),
        window_(own.parked ? 0 : own.initial),
        threshold_(ThresholdFor(own.initial)),
        parks_(own.share != nullptr && own.parks),
        park_(own.parked && parks_             ? Park::kParked
              : own.provisional && !own.parked ? Park::kProvisional
                                               : Park::kNone),
        work_(peer_window == 0 ? kSenderParked : 0),
        share_(own.share),
        owed_(park_ == Park::kProvisional ? window_ - 1 : 0),
        granted_(park_ == Park::kProvisional ? 1 : window_) {}

  // ---- Sending: credits for the peer's receives.

  // A data SEND or WRITE_WITH_IMM may go: two credits are left (the last is for credit frames).
  bool CanSpendForData() const { return available_ >= 2; }
  // Spends a credit for a data SEND or a WRITE_WITH_IMM; false if fewer than two are available.
  bool TrySpendForData() {
    if (!CanSpendForData()) return false;
    --available_;
    ++in_use_;
    return true;
  }
  // Spends a credit for a credit frame; false if none is available.
  bool TrySpendForUpdate() {
    if (available_ < 1) return false;
    --available_;
    ++in_use_;
    return true;
  }

  // The peer returned `n` credits. A protocol error if that would leave this side more than the
  // peer's Hello said it may ever grant.
  absl::Status OnReturned(uint32_t n) {
    if (ABSL_PREDICT_FALSE(n > peer_max_ - available_)) return ReturnedTooMany(n);
    available_ += n;
    in_use_ = n < in_use_ ? in_use_ - n : 0;
    return absl::OkStatus();
  }

  // ---- Sending, parked (above).

  // Something for the park exchange to send (a kPark, a kParked answer or a knock): one load,
  // which the connection's send path makes on every pass.
  bool park_work() const { return work_ != 0; }

  // The peer's kPark came: this side is parked from now on, at once, so that credits the peer
  // returns later are a grant. Holding credits, it owes a kParked frame, whose credit is spent
  // here and the rest given up; holding none, nothing. A protocol error when it is parked
  // already (and was not granted credits since).
  absl::Status OnParkAsked() {
    OnGrantArrived();
    if ((work_ & kSenderParked) != 0) {
      return absl::FailedPreconditionError("peer asked a parked window to park");
    }
    work_ |= kSenderParked;
    if (available_ > 0) {
      in_use_ += 1;
      available_ = 0;
      work_ |= kAnswerOwed;
    }
    return absl::OkStatus();
  }
  // A kParked frame is owed, its credit spent already (OnParkAsked).
  bool park_answer_owed() const { return (work_ & kAnswerOwed) != 0; }
  void AnsweredPark() { work_ &= static_cast<uint8_t>(~kAnswerOwed); }
  // This side may not send until the peer grants credits again; it knocks when it wants to.
  bool sender_parked() const { return (work_ & kSenderParked) != 0; }
  // After credits came back to a parked sender (the peer returns none between its kPark and its
  // grant, and grants after a knock, so the connection asks while it has knocked, and before it
  // knocks or answers a kPark: a window opened by another's knock, park_doors.h): whether they
  // were the grant, which unparks it.
  bool OnGrantArrived() {
    if ((work_ & kSenderParked) == 0 || available_ == 0) return false;
    work_ &= static_cast<uint8_t>(~kSenderParked);
    return true;
  }
  // Something is waiting for credits here besides data: credits owed (or grown) to return.
  bool WantsToReturn() const { return owed_ >= threshold_ || grew_; }

  // ---- Receiving: the peer's credits for this side's receives.

  // The peer's frame or bulk WRITE consumed one of this side's RECVs. A protocol error when the
  // peer had no credit for it: it may spend the window it started with plus the credits returned
  // to it (TakeOwed), never more. Without this check a peer could keep sending into RECVs
  // re-posted before their credit went back, and hold this side to no window at all. An elastic
  // window grows here when the peer is left unable to send data.
  absl::Status OnConsumed() {
    if (ABSL_PREDICT_FALSE(++consumed_ > granted_)) return ConsumedTooMany();
    if (share_ != nullptr && PeerShort() && park_ == Park::kNone) Grow();
    return absl::OkStatus();
  }

  // ---- Receiving, provisional (OwnWindow::provisional).

  // The peer's Hello offered one credit and the rest waits for Confirm. Meanwhile the window
  // neither grows nor shrinks nor parks (the peer has spent its one credit on its kAuth frame, and
  // the rest of its window is owed already), and nothing should be sent but that frame's answer.
  bool provisional() const { return park_ == Park::kProvisional; }
  // The peer is verified: the window is this side's as any other (what it owes, the window but
  // the one credit granted, goes in the next frame: TakeOwed).
  void Confirm() {
    if (park_ == Park::kProvisional) park_ = Park::kNone;
  }

  // ---- Receiving, parked (above).

  bool parks() const { return parks_; }
  bool parked() const { return park_ == Park::kParked; }
  bool parking() const { return park_ == Park::kAsked; }
  // Messages this side holds (consumed, not yet released).
  uint32_t held() const {
    return window_ - static_cast<uint32_t>(granted_ - consumed_) - static_cast<uint32_t>(owed_) -
           withheld_;
  }
  // The poller asked this window to park (the connection's look found it idle): a kPark to send.
  void OweParkAsk() { work_ |= kAskOwed; }
  bool park_ask_owed() const { return (work_ & kAskOwed) != 0; }
  void DropParkAsk() { work_ &= static_cast<uint8_t>(~kAskOwed); }
  // The window may be asked to park now: it parks, is open, holds no message, and a kPark frame
  // may spend a data credit.
  bool CanAskPark() const {
    return parks_ && park_ == Park::kNone && held() == 0 && available_ >= 2;
  }
  // A kPark frame went (its header took what was owed, its credit spent by the caller): no credit
  // returns from now on. True when the window parked at once (the peer held none).
  bool AskedPark() {
    DropParkAsk();
    park_ = Park::kAsked;
    return MaybeParked();
  }
  // The peer's kParked frame, consumed (OnConsumed) before this: the window is parked. A
  // protocol error when it was not asked to.
  absl::Status OnParked() {
    if (park_ != Park::kAsked) {
      return absl::FailedPreconditionError("peer sent kParked unasked");
    }
    CompletePark();
    return absl::OkStatus();
  }
  // After a consumption while asked: whether the peer has spent every credit, which parks the
  // window too (above). True when it parked now.
  bool MaybeParked() {
    if (park_ != Park::kAsked || granted_ != consumed_) return false;
    CompletePark();
    return true;
  }
  // The peer knocked: a floor from the budget opens the window again, its credits owed (and sent
  // with the reserved credit if need be). False when no floor is free (or not parked).
  bool Unpark() {
    if (park_ != Park::kParked || !share_->TakeFloor(floor_)) return false;
    park_ = Park::kNone;
    window_ += floor_;
    max_window_ = std::max(max_window_, window_);
    threshold_ = ThresholdFor(window_);
    owed_ += floor_;
    grew_ = true;
    grant_ = true;
    return true;
  }

  // This side re-posted (or, with a shared queue, released) a RECV that a data frame, a bulk
  // WRITE or a credit frame consumed: the three count alike. Owed to the peer, unless an elastic
  // window keeps the credit back: the peer's credits, in its hands or on the wire, beyond the two
  // it needs for data, are half the window (the margin keeps this apart from growth, which starts
  // below two, so a steady flow settles instead of growing and shrinking in turn), or growth is
  // low.
  void OnRecvReposted() {
    if (share_ != nullptr) {
      if (ABSL_PREDICT_FALSE(park_ != Park::kNone)) return ParkedRelease();
      if (window_ > floor_ && (2 * (granted_ - consumed_) >= window_ + 4 || share_->low()) &&
          Shrink()) {
        return;
      }
    }
    ++owed_;
  }

  // Tries again to grow a window whose peer is left without credits for data, after a growth
  // found the budget dry: receives may have come back since (the connection calls it before it
  // looks for a credit frame to send).
  void RetryGrowth() {
    if (ABSL_PREDICT_TRUE(!starved_) || park_ != Park::kNone) return;
    if (PeerShort()) {
      Grow();
    } else {
      starved_ = false;  // the peer has credits again (or the window reached its ceiling)
    }
  }

  // Whether an explicit credit frame is due (and one credit is there to send it): T owed, or
  // credits the window just grew by, which the peer is waiting for (not with the reserved credit:
  // that one only goes into frames returning T or more, as the deadlock argument needs).
  // (While parking or parked nothing is owed or grown: see ParkedRelease.)
  bool ShouldSendUpdate() const {
    return (owed_ >= threshold_ && available_ >= 1) || (grew_ && available_ >= (grant_ ? 1 : 2));
  }

  // Credits to put in the frame being sent now (at most what the 16-bit field holds); what is
  // taken is no longer owed.
  uint16_t TakeOwed() {
    const auto total = static_cast<uint32_t>(std::min<uint64_t>(owed_, UINT16_MAX));
    owed_ -= total;
    granted_ += total;
    grew_ = false;
    grant_ = false;
    return static_cast<uint16_t>(total);
  }

  uint32_t available() const { return available_; }
  // Credits spent and not yet returned (a peer growing its window returns more than were spent).
  uint32_t in_flight() const { return in_use_; }
  uint64_t owed() const { return owed_; }
  // Receives released while this window was being parked, whose credits never go back.
  uint32_t withheld() const { return withheld_; }
  // This side's window: the receives its peer may hold credits for, the messages it holds and
  // what it owes.
  uint32_t window() const { return window_; }
  // Times this side's window parked.
  uint64_t parks_done() const { return parks_done_; }
  uint32_t max_window() const { return max_window_; }

 private:
  static uint32_t ThresholdFor(uint32_t window) { return std::max<uint32_t>(2, window / 2); }
  // The peer has fewer than two credits for data (in its hands or on the wire), and the window
  // may still grow.
  bool PeerShort() const { return granted_ - consumed_ < 2 && window_ < max_; }
  // The rare paths, out of line so that the common ones stay small enough to inline.
  ABSL_ATTRIBUTE_NOINLINE absl::Status ReturnedTooMany(uint32_t n) const {
    return absl::FailedPreconditionError(
        absl::StrCat("peer returned ", n, " credits while this side held ", available_, " of the ",
                     peer_max_, " its window may reach"));
  }
  ABSL_ATTRIBUTE_NOINLINE absl::Status ConsumedTooMany() const {
    return absl::FailedPreconditionError(absl::StrCat("peer sent beyond its credits (", consumed_,
                                                      " frames for ", granted_, " credits)"));
  }
  ABSL_ATTRIBUTE_NOINLINE void Grow() {
    const uint32_t more =
        share_->Grow(std::min(std::max<uint32_t>(1, window_ / 4), max_ - window_));
    window_ += more;
    max_window_ = std::max(max_window_, window_);
    threshold_ = ThresholdFor(window_);
    owed_ += more;
    if (more > 0) grew_ = true;
    starved_ = more == 0;
  }
  // Gives the released receive back to the budget instead of owing it; false once the share is
  // closed.
  // A receive released while parking is withheld (the kPark's header took what was owed, so
  // nothing is owed from then on and nothing returns); once parked it goes to the budget.
  ABSL_ATTRIBUTE_NOINLINE void ParkedRelease() {
    if (park_ == Park::kAsked) {
      ++withheld_;
      return;
    }
    share_->GiveBack(1);
    --window_;
  }
  // Every credit granted is spent or given up: the window keeps only the messages held.
  ABSL_ATTRIBUTE_NOINLINE void CompletePark() {
    const uint32_t keep = held();
    share_->GiveBack(window_ - keep);
    window_ = keep;
    granted_ = consumed_;
    owed_ = 0;
    withheld_ = 0;
    grew_ = false;
    grant_ = false;
    starved_ = false;
    park_ = Park::kParked;
    ++parks_done_;
  }
  ABSL_ATTRIBUTE_NOINLINE bool Shrink() {
    // Growth first; a window opened again after a park may hold floor receives beyond its floor
    // (the messages it kept, then a floor on top), which go back too.
    if (share_->GiveBack(1) == 0) return false;
    --window_;
    threshold_ = ThresholdFor(window_);
    return true;
  }

  uint32_t peer_max_;
  uint32_t available_;
  uint32_t in_use_ = 0;
  uint32_t floor_;
  uint32_t max_;
  uint32_t window_;
  uint32_t max_window_ = window_;
  uint32_t threshold_;
  bool grew_ = false;     // owed_ holds credits the window grew by, not sent yet
  bool starved_ = false;  // the last growth found the budget dry (RetryGrowth)
  bool grant_ = false;    // owed_ holds a parked window's grant: the reserved credit may carry it
  // kProvisional: not parked, but not open for growth or parking either (provisional()).
  enum class Park : uint8_t { kNone, kAsked, kParked, kProvisional };
  bool parks_;
  Park park_;
  // Park work (park_work()): bits of what the connection's send path has to do.
  static constexpr uint8_t kAnswerOwed = 1;    // a kPark came: kParked (or nothing) answers it
  static constexpr uint8_t kSenderParked = 2;  // this side's sending is parked: it knocks
  static constexpr uint8_t kAskOwed = 4;       // this side's window is to be asked to park
  uint8_t work_;
  uint32_t withheld_ = 0;  // receives released while parking (ParkedRelease)
  uint64_t parks_done_ = 0;
  ReceiveShare* share_;
  uint64_t owed_;
  // Credits given to the peer (its initial window plus every credit returned in a frame) and
  // RECVs its traffic consumed; consumed_ <= granted_ for a peer that keeps to its credits.
  uint64_t granted_;
  uint64_t consumed_ = 0;
};

}  // namespace zrpc::transport

#endif  // ZRPC_TRANSPORT_CREDITS_H_
