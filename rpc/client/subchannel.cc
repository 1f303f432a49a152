// Subchannel: one connection of a channel made on demand, its waiting callers, and its
// reconnection backoff.

#include "rpc/client/subchannel.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "rpc/common/monotonic.h"
#include "rpc/connection/rpc_connection.h"

namespace zrpc::internal {

std::shared_ptr<ClientConnection> Subchannel::Ready() {
  absl::MutexLock lock(&mu_);
  return current_ != nullptr && current_->open() ? current_ : nullptr;
}

Subchannel::Restore Subchannel::Restorable(absl::Time now, absl::Time* at) {
  absl::MutexLock lock(&mu_);
  // A connection not yet noted lost is open, or drains, or closed with its OnClosed on the way
  // (Forget notes it and kicks the restorer): not yet, or the wait after the loss is skipped.
  // Every connection's OnClosed comes, a drain that never ends included: the poller's drain
  // watchdog gives up on it (transport::Poller::kDrainGiveUp).
  if (!ever_connected_ || (current_ != nullptr && !current_loss_noted_)) return Restore::kNo;
  if (connecting_) {  // a call's attempt: looked at again soon, in case it fails
    *at = now + absl::Milliseconds(100);
    return Restore::kAt;
  }
  if (const absl::Time after = std::max(next_attempt_, restore_after_); now < after) {
    *at = after;
    return Restore::kAt;
  }
  return Restore::kNow;
}

absl::Duration Subchannel::backoff() const {
  absl::MutexLock lock(&mu_);
  return backoff_.delay();
}

absl::Time Subchannel::next_attempt() const {
  absl::MutexLock lock(&mu_);
  return next_attempt_;
}

void Subchannel::Reset() {
  absl::MutexLock lock(&mu_);
  current_.reset();
}

std::shared_ptr<ClientConnection> Subchannel::Forget(const ClientConnection* closed) {
  absl::MutexLock lock(&mu_);
  if (current_.get() != closed) return nullptr;
  NoteLossLocked();
  return std::move(current_);
}

void Subchannel::NoteLossLocked() {
  if (std::exchange(current_loss_noted_, true)) return;  // Get and Forget may both see it
  // A connection that lived long is a loss like any other: a short wait, and the restores' own
  // backoff starts over. One dropped soon after its handshake (a server that accepts and then
  // drops, or is full) counts as a failed attempt, so that the restorer's attempts back off.
  const absl::Time now = MonotonicNow();
  if (now - connected_at_ < kShortLived) {
    restore_after_ = restore_backoff_.Failed(now);
  } else {
    restore_backoff_.Succeeded();
    restore_after_ = restore_backoff_.AfterLoss(now);
  }
}

absl::StatusOr<std::shared_ptr<ClientConnection>> Subchannel::Get(absl::Time deadline,
                                                                  bool* waited) {
  absl::MutexLock lock(&mu_);
  auto usable = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return current_ != nullptr && current_->open();
  };
  if (usable()) return current_;
  if (waited != nullptr) *waited = true;
  const bool runtime_thread = OnRuntimeThread();
  if (connecting_) {
    // Another caller is connecting: wait for its outcome, but never past this call's deadline,
    // and never on a poller or the timer (they would wait for the very thread that connects).
    auto not_connecting = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !connecting_; };
    if (runtime_thread ||
        !mu_.AwaitWithTimeout(absl::Condition(&not_connecting), deadline - MonotonicNow())) {
      return runtime_thread
                 ? absl::UnavailableError(absl::StrCat("a connection to ", target_,
                                                       " is being made; a callback on a runtime "
                                                       "thread does not wait for it"))
                 : absl::DeadlineExceededError(absl::StrCat(
                       "the deadline passed while a connection to ", target_, " was being made"));
    }
    if (usable()) return current_;
  }
  const absl::Time now = MonotonicNow();  // as next_attempt_ and `deadline` are
  if (now < next_attempt_) {
    return absl::UnavailableError(absl::StrCat(
        "not connected to ", target_, " (", last_error_.message(), "); next attempt in ",
        absl::FormatDuration(absl::Ceil(next_attempt_ - now, absl::Milliseconds(1)))));
  }
  if (runtime_thread) {
    // Connecting takes up to connect_timeout; a poller or the timer waiting that long stops
    // every connection and deadline it serves.
    return absl::UnavailableError(
        absl::StrCat("not connected to ", target_,
                     "; a callback on a runtime thread (poller or timer) does "
                     "not connect: call from another thread, or Connect() first"));
  }
  const absl::Duration timeout = std::min(options_.connect_timeout, deadline - now);
  if (timeout <= absl::ZeroDuration()) {
    return absl::DeadlineExceededError(
        absl::StrCat("the deadline passed before a connection to ", target_, " was made"));
  }
  host_.CountAttempt();
  absl::StatusOr<std::shared_ptr<transport::Poller>> poller = host_.PollerToConnect(poller_);
  if (!poller.ok()) {
    // Full for now (the group's other channels hold the room): an attempt failed, after its
    // backoff another, as for a server that refused.
    host_.CountFailure();
    next_attempt_ = backoff_.Failed(now);
    last_error_ = poller.status();
    return absl::UnavailableError(
        absl::StrCat("cannot connect to ", target_, ": ", poller.status().message()));
  }
  // A payload the server may be pulling when its call ends stays exposed this long at most: as
  // long as a ping may go unanswered.
  const absl::Duration pull_grace = options_.keepalive_timeout > absl::ZeroDuration()
                                        ? options_.keepalive_timeout
                                        : absl::Seconds(2);
  auto connection = std::make_shared<ClientConnection>(
      host_.connection_owner(), options_.max_calls_per_connection, pull_grace, device_, *poller);
  // Outside the lock: callers with shorter deadlines give up at theirs instead of waiting for
  // this attempt's.
  connecting_ = true;
  mu_.Unlock();
  absl::StatusOr<std::shared_ptr<transport::Connection>> made = transport::Connection::Connect(
      *device_, **poller, address_, port_, connection.get(), options_.connection, timeout);
  if (made.ok()) {
    host_.NoteMessageLimit(**made);
    connection->Attach(*std::move(made));
  }
  mu_.Lock();
  connecting_ = false;
  if (!made.ok() && timeout < options_.connect_timeout &&
      made.status().code() == absl::StatusCode::kDeadlineExceeded) {
    // This call's deadline cut the attempt short, not the server: no backoff for the calls
    // that come next (a short-deadline call would otherwise keep a slow-to-connect subchannel
    // down), and the call fails as what it is.
    return absl::DeadlineExceededError(absl::StrCat("the deadline passed while connecting to ",
                                                    target_, " (", made.status().message(), ")"));
  }
  if (!made.ok()) {
    host_.CountFailure();
    next_attempt_ = backoff_.Failed(MonotonicNow());
    last_error_ = made.status();
    return absl::UnavailableError(
        absl::StrCat("cannot connect to ", target_, ": ", made.status().message()));
  }
  ever_connected_ = true;
  connected_at_ = MonotonicNow();
  host_.AddLive(connection);
  backoff_.Succeeded();
  next_attempt_ = absl::InfinitePast();
  current_ = connection;
  current_loss_noted_ = false;
  // Closed between its handshake and here: its OnClosed may have found no current_ to forget.
  // (One still draining is noted by its OnClosed's Forget.)
  if (connection->closed()) NoteLossLocked();
  return connection;
}

absl::Status Subchannel::Connect(absl::Time deadline) {
  for (;;) {
    absl::StatusOr<std::shared_ptr<ClientConnection>> got = Get(deadline);
    if (got.ok()) return absl::OkStatus();
    // UNAVAILABLE is a failed attempt or its backoff; anything else (this call's deadline, a
    // runtime thread) is final.
    if (got.status().code() != absl::StatusCode::kUnavailable || OnRuntimeThread()) {
      return got.status();
    }
    absl::Duration wait;
    {
      absl::MutexLock lock(&mu_);
      // Reasons that may pass: nothing listening yet or a refusal (UNAVAILABLE), a handshake
      // that timed out, a full server. A bad address or an incompatible server will not.
      const absl::StatusCode why = last_error_.code();
      if (why != absl::StatusCode::kUnavailable && why != absl::StatusCode::kDeadlineExceeded &&
          why != absl::StatusCode::kResourceExhausted) {
        return got.status();
      }
      wait = std::max(absl::ZeroDuration(), next_attempt_ - MonotonicNow());
    }
    if (MonotonicNow() + wait >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("not connected to ", target_,
                       " by the deadline; the last attempt: ", got.status().message()));
    }
    absl::SleepFor(wait);
  }
}

}  // namespace zrpc::internal
