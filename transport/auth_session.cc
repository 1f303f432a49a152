#include "transport/auth_session.h"

#include <openssl/crypto.h>

#include <utility>

#include "absl/strings/str_cat.h"

namespace zrpc::transport {
namespace {

void Wipe(std::string& secret) {
  if (!secret.empty()) OPENSSL_cleanse(secret.data(), secret.size());
  secret.clear();
}

}  // namespace

AuthSession::AuthSession(AuthRole role, AuthKey key)
    : role_(role), key_id_(key.id), key_(std::move(key)) {
  transcript_.key_id = key_id_;
}

AuthSession::~AuthSession() {
  absl::MutexLock lock(&mu_);
  Wipe(key_.secret);
}

absl::StatusOr<AuthTag> AuthSession::OwnTag() const {
  absl::MutexLock lock(&mu_);
  if (key_.secret.empty()) {
    return absl::FailedPreconditionError("the authentication's handshake is over");
  }
  return ComputeAuthTag(role_, key_, transcript_);
}

absl::Status AuthSession::CheckPeerTag(const AuthTag& got) const {
  const AuthRole peer = role_ == AuthRole::kServer ? AuthRole::kClient : AuthRole::kServer;
  absl::StatusOr<AuthTag> expected;
  {
    absl::MutexLock lock(&mu_);
    if (key_.secret.empty()) {
      return absl::FailedPreconditionError("the authentication's handshake is over");
    }
    expected = ComputeAuthTag(peer, key_, transcript_);
  }
  if (!expected.ok()) return expected.status();
  if (AuthTagMatches(*expected, got)) return absl::OkStatus();
  return absl::PermissionDeniedError(
      role_ == AuthRole::kServer
          ? absl::StrCat("the client's tag does not match key ", key_id_,
                         ": it does not hold that key's secret, or its tag is not for this "
                         "handshake (replayed)")
          : absl::StrCat("the server's tag does not match key ", key_id_,
                         ": the server holds another secret under that id, or is not the "
                         "server meant"));
}

bool AuthSession::Finish(const absl::Status& outcome) {
  {
    absl::MutexLock lock(&mu_);
    if (state_.load(std::memory_order_relaxed) != kPending) return false;
    outcome_ = outcome;
    Wipe(key_.secret);
    state_.store(outcome.ok() ? kVerified : kRefused, std::memory_order_release);
  }
  if (on_finish_) on_finish_(outcome);
  return true;
}

bool AuthSession::Wait(absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  auto done = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return state_.load(std::memory_order_relaxed) != kPending;
  };
  return mu_.AwaitWithDeadline(absl::Condition(&done), deadline);
}

absl::Status AuthSession::outcome() const {
  absl::MutexLock lock(&mu_);
  if (state_.load(std::memory_order_relaxed) == kPending) {
    return absl::UnknownError("the authentication is not over");
  }
  return outcome_;
}

absl::Status AuthSession::Settle(const absl::Status& if_unset) {
  Finish(if_unset);
  return outcome();
}

}  // namespace zrpc::transport
