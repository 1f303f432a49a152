#include "transport/arena.h"

#include "absl/strings/str_cat.h"

namespace zrpc::transport {
namespace {

uint32_t RoundUp(uint32_t length) {
  return static_cast<uint32_t>((uint64_t{length} + kArenaAlign - 1) / kArenaAlign * kArenaAlign);
}

absl::Status Violation(absl::string_view what) {
  return absl::FailedPreconditionError(absl::StrCat("peer broke the arena protocol: ", what));
}

}  // namespace

absl::Status ArenaWriter::CheckFits(uint32_t length) const {
  if (size_ == 0) {
    return absl::InvalidArgumentError("the peer has no receive arena: bulk payloads are disabled");
  }
  if (length == 0) return absl::InvalidArgumentError("an empty bulk payload has nothing to place");
  if (length > size_ || RoundUp(length) > size_) {
    return absl::InvalidArgumentError(absl::StrCat("a ", length,
                                                   "-byte bulk payload exceeds the peer's ", size_,
                                                   "-byte receive arena; split it"));
  }
  return absl::OkStatus();
}

absl::StatusOr<ArenaSpot> ArenaWriter::Reserve(uint32_t length) {
  if (auto s = CheckFits(length); !s.ok()) return s;
  std::optional<ArenaSpot> spot = TryReserve(length);
  if (!spot) {
    return absl::UnavailableError("the peer's receive arena is full until it releases payloads");
  }
  return *spot;
}

std::optional<ArenaSpot> ArenaWriter::TryReserve(uint32_t length) {
  if (on_demand_ && !held_) return std::nullopt;
  uint32_t rounded = RoundUp(length);
  ArenaSpot spot;
  bool restart = in_use() == 0 && tail_ != 0;
  if (restart) tail_ = 0;
  uint32_t need = rounded;
  if (uint64_t{tail_} + rounded <= size_) {
    spot.offset = tail_;
  } else {
    spot.offset = 0;
    need += size_ - tail_;  // the rest of the arena is skipped
  }
  if (uint64_t{in_use()} + need > size_) return std::nullopt;
  spot.imm = spot.offset | (restart ? kArenaRestartBit : 0);
  reserved_total_ += need;
  tail_ = spot.offset + rounded;
  if (tail_ == size_) tail_ = 0;
  return spot;
}

absl::Status ArenaWriter::OnReleased(uint32_t released_total) {
  uint32_t newly = released_total - released_total_;
  if (newly > in_use()) {
    return Violation(absl::StrCat("released ", newly, " bytes while ", in_use(), " were in use"));
  }
  released_total_ = released_total;
  return absl::OkStatus();
}

absl::Status ArenaWriter::OnLend(uint32_t loan, uint32_t size) {
  if (!on_demand_) return Violation("lent an arena it gave in its Hello");
  if (held_ || !asked_) return Violation(absl::StrCat("lent loan ", loan, " nobody asked for"));
  if (size != size_) {
    return Violation(absl::StrCat("lent ", size, " bytes where its Hello said ", size_));
  }
  if (loan <= loan_) {
    return Violation(absl::StrCat("lent loan ", loan, " after loan ", loan_));
  }
  if (in_use() != 0) {
    return Violation(absl::StrCat("lent loan ", loan, " while ", in_use(),
                                  " bytes of the last one are not reported released"));
  }
  held_ = true;
  asked_ = false;
  loan_ = loan;
  tail_ = 0;
  return absl::OkStatus();
}

absl::Status ArenaWriter::OnRecall(uint32_t loan) {
  if (!on_demand_ || !held_ || loan != loan_) {
    return Violation(absl::StrCat("recalled loan ", loan, ", not the one held"));
  }
  held_ = false;
  return absl::OkStatus();
}

absl::Status ArenaReader::OnAsk() {
  if (!on_demand_) return Violation("asked for an arena it was given in the Hello");
  if (ask_waiting_ || loan_state_ == Loan::kLent || loan_state_ == Loan::kRecalled) {
    return Violation("asked for an arena while holding one or asking already");
  }
  ask_waiting_ = true;
  return absl::OkStatus();
}

uint32_t ArenaReader::Lend() {
  ask_waiting_ = false;
  loan_state_ = Loan::kLent;
  expected_ = 0;
  return ++loan_;
}

void ArenaReader::Recall() { loan_state_ = Loan::kRecalled; }

absl::Status ArenaReader::OnReturned(uint32_t loan) {
  if (loan_state_ != Loan::kRecalled || loan != loan_) {
    return Violation(absl::StrCat("returned loan ", loan, ", not the one recalled"));
  }
  loan_state_ = Loan::kReturned;
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> ArenaReader::OnArrival(uint32_t imm, uint32_t length) {
  if (on_demand_ && loan_state_ != Loan::kLent && loan_state_ != Loan::kRecalled) {
    return Violation("wrote into an arena not lent to it");
  }
  const bool restart = (imm & kArenaRestartBit) != 0;
  const uint32_t at = offset(imm);
  if ((at & (1u << 30)) != 0) return Violation("reserved bit 30 of the immediate is set");
  if (length == 0) return Violation("an empty bulk WRITE");
  uint32_t rounded = RoundUp(length);
  if (length > size_ || rounded > size_) {
    return Violation(absl::StrCat("a ", length, "-byte WRITE into a ", size_, "-byte arena"));
  }
  if (restart) {
    if (in_use() != 0) {
      return Violation(absl::StrCat("restarted the ring while ", in_use(), " bytes are held"));
    }
    expected_ = 0;
  }
  uint32_t need = rounded;
  if (at == expected_ && uint64_t{expected_} + rounded <= size_) {
    // in place at the tail
  } else if (at == 0 && !restart && uint64_t{expected_} + rounded > size_) {
    need += size_ - expected_;
  } else {
    return Violation(absl::StrCat(length, " bytes written at offset ", at,
                                  ", where the ring puts them at ", expected_));
  }
  if (uint64_t{in_use()} + need > size_) {
    return Violation(
        absl::StrCat("wrote ", need, " bytes into an arena with ", size_ - in_use(), " free"));
  }
  arrivals_.push_back(Arrival{need, false});
  arrived_total_ += need;
  expected_ = at + rounded;
  if (expected_ == size_) expected_ = 0;
  return first_sequence_ + arrivals_.size() - 1;
}

absl::Status ArenaReader::Release(uint64_t sequence) {
  if (sequence < first_sequence_ || sequence - first_sequence_ >= arrivals_.size() ||
      arrivals_[sequence - first_sequence_].released) {
    return absl::FailedPreconditionError(
        absl::StrCat("bulk payload ", sequence, " released twice or never delivered"));
  }
  arrivals_[sequence - first_sequence_].released = true;
  while (!arrivals_.empty() && arrivals_.front().released) {
    released_total_ += arrivals_.front().bytes;
    arrivals_.pop_front();
    ++first_sequence_;
  }
  return absl::OkStatus();
}

bool ArenaReader::ShouldReport() const {
  uint32_t unreported = released_total_ - reported_total_;
  if (unreported == 0) return false;
  return unreported >= size_ / 4 || in_use() == 0;
}

}  // namespace zrpc::transport
