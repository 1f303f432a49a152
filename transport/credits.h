// Credit flow control for one connection: never more SENDs in flight than RECVs the peer posted.
//
// A credit is one RECV the peer has posted that this side has not consumed yet. The peer's Hello
// grants `recv_credits` of them (its receive window W). Every SEND and every WRITE_WITH_IMM
// consumes one at the peer, so each spends one here. When the peer's application is done with a
// received message, the peer re-posts the RECV and owes this side a credit; it returns owed
// credits in the `credits` field of the next frame it sends (wire.h), so in steady two-way
// traffic credits cost nothing extra. A side that has nothing to send returns them in an explicit
// credit frame once it owes T = W/2 for data it received.
//
// Deadlock freedom. A credit frame itself consumes a RECV, so two rules keep credits from
// running out on both sides at once:
//  - the last credit is reserved for credit frames: data needs two available, a credit frame one;
//  - a RECV consumed by a credit frame is owed like any other, and T of them make a credit frame
//    due too (a side that only writes bulk payloads sends no data frames, so without this it
//    would never return the credits its reader spends on credit frames). One credit frame per T
//    received means an exchange of credit frames between idle peers shrinks by a factor of T each
//    round and stops, instead of bouncing forever.
// Then a side stuck with one credit has W-1 credits at its peer, held by the peer's application
// (legitimate back-pressure) or owed. The peer owes at most T-1 for data and T-1 for credit
// frames (else it sends a credit frame, for which it has a credit unless it is stuck too, and two
// sides cannot both be stuck: each one's last credit went into a credit frame that returned T or
// more to the other). With W >= 4 (DecodeHello insists), 2(T-1) < W-1, so someone can move.
// Arena-release reports (arena.h) ride on credit frames only while two credits are available, so
// they never spend the reserved one.
//
// Not thread-safe: the connection calls it under its lock. The host tests drive it directly.
#ifndef ZRPC_TRANSPORT_CREDITS_H_
#define ZRPC_TRANSPORT_CREDITS_H_

#include <algorithm>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace zrpc::transport {

// The smallest receive window that keeps the credit scheme deadlock-free (see above).
inline constexpr uint32_t kMinCredits = 4;
// The largest window a peer may claim: what a frame's 16-bit credit field can return at once.
// A peer that claims more RECVs than it posts only hurts its own connection: this side's SENDs
// meet receiver-not-ready and the connection fails after a bounded number of retries (cm_util).
inline constexpr uint32_t kMaxCredits = 65535;

class CreditAccount {
 public:
  // `peer_window`: the peer's Hello.recv_credits. `own_window`: RECVs this side posts.
  CreditAccount(uint32_t peer_window, uint32_t own_window)
      : peer_window_(peer_window),
        available_(peer_window),
        threshold_(std::max<uint32_t>(1, own_window / 2)),
        granted_(own_window) {}

  // A data SEND or WRITE_WITH_IMM may go: two credits are left (the last is for credit frames).
  bool CanSpendForData() const { return available_ >= 2; }
  // Spends a credit for a data SEND or a WRITE_WITH_IMM; false if fewer than two are available.
  bool TrySpendForData() {
    if (!CanSpendForData()) return false;
    --available_;
    return true;
  }
  // Spends a credit for a credit frame; false if none is available.
  bool TrySpendForUpdate() {
    if (available_ < 1) return false;
    --available_;
    return true;
  }

  // The peer returned `n` credits. A protocol error if that is more than were spent.
  absl::Status OnReturned(uint32_t n) {
    if (n > peer_window_ - available_) {
      return absl::FailedPreconditionError(absl::StrCat("peer returned ", n, " credits while only ",
                                                        peer_window_ - available_, " were in use"));
    }
    available_ += n;
    return absl::OkStatus();
  }

  // The peer's frame or bulk WRITE consumed one of this side's RECVs. A protocol error when the
  // peer had no credit for it: it may spend the own_window credits it started with plus those
  // returned to it (TakeOwed), never more. Without this check a peer could keep sending into
  // RECVs re-posted before their credit went back, and hold this side to no window at all.
  absl::Status OnConsumed() {
    if (++consumed_ > granted_) {
      return absl::FailedPreconditionError(absl::StrCat("peer sent beyond its credits (", consumed_,
                                                        " frames for ", granted_, " credits)"));
    }
    return absl::OkStatus();
  }

  // This side re-posted a RECV that a data frame or a bulk WRITE consumed / that a credit frame
  // consumed.
  void OnDataRecvReposted() { ++owed_data_; }
  void OnUpdateRecvReposted() { ++owed_update_; }

  // Whether an explicit credit frame is due (and one credit is there to send it).
  bool ShouldSendUpdate() const {
    return (owed_data_ >= threshold_ || owed_update_ >= threshold_) && available_ >= 1;
  }

  // Credits to put in the frame being sent now (at most what the 16-bit field holds); what is
  // taken is no longer owed.
  uint16_t TakeOwed() {
    uint32_t total = std::min<uint32_t>(owed_data_ + owed_update_, UINT16_MAX);
    uint32_t from_data = std::min(total, owed_data_);
    owed_data_ -= from_data;
    owed_update_ -= total - from_data;
    granted_ += total;
    return static_cast<uint16_t>(total);
  }

  uint32_t available() const { return available_; }
  uint32_t in_flight() const { return peer_window_ - available_; }
  uint32_t owed() const { return owed_data_ + owed_update_; }

 private:
  uint32_t peer_window_;
  uint32_t available_;
  uint32_t threshold_;
  uint32_t owed_data_ = 0;
  uint32_t owed_update_ = 0;
  // Credits given to the peer (its initial window plus every credit returned in a frame) and
  // RECVs its traffic consumed; consumed_ <= granted_ for a peer that keeps to its credits.
  uint64_t granted_;
  uint64_t consumed_ = 0;
};

}  // namespace zrpc::transport

#endif  // ZRPC_TRANSPORT_CREDITS_H_
