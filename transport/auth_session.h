// One connection's authentication while its handshake lasts (auth.h): the key presented, the
// transcript both tags cover, and the outcome that whoever waits for the handshake hears.
//
// Who uses it. A connection that authenticates holds one from its setup until it closes. On the
// accepting side the listener makes it when it answers the request; the connection's poller
// checks the client's kAuth frame against it; the listener hears the outcome (set_on_finish)
// and only then hands the connection to AcceptHandler::OnAccepted, or reports OnRefused. On the
// connecting side Connection::Connect makes it, checks the server's tag against it, and waits
// (Wait) for the server's kAuthOk before it returns the connection.
//
// The outcome is set once: the first Finish wins, whichever thread calls it (the poller that
// checked a tag or saw the connection fail, the listener whose deadline passed, the client that
// gave up waiting), and the others learn they came second. The secret is wiped then: nothing
// needs it after the handshake.
//
// Thread-safety: Finish, Wait, finished() and verified() from any thread; transcript() only by
// the one thread that sets the handshake up, before the connection is shared.
#ifndef ZRPC_TRANSPORT_AUTH_SESSION_H_
#define ZRPC_TRANSPORT_AUTH_SESSION_H_

#include <atomic>
#include <functional>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "transport/auth.h"

namespace zrpc::transport {

class AuthSession {
 public:
  AuthSession(AuthRole role, AuthKey key);
  ~AuthSession();
  AuthSession(const AuthSession&) = delete;
  AuthSession& operator=(const AuthSession&) = delete;

  AuthRole role() const { return role_; }
  uint32_t key_id() const { return key_id_; }
  AuthTranscript& transcript() { return transcript_; }
  const AuthTranscript& transcript() const { return transcript_; }

  // This side's tag over the transcript. FailedPrecondition once finished (the secret is gone).
  absl::StatusOr<AuthTag> OwnTag() const;
  // OK when `got` is the peer's tag over the transcript; else PermissionDenied, naming the key
  // (its id) and whose tag failed.
  absl::Status CheckPeerTag(const AuthTag& got) const;

  // Called once the outcome is known, on the thread whose Finish won, outside any lock here.
  // Set before the session is shared.
  void set_on_finish(std::function<void(const absl::Status&)> on_finish) {
    on_finish_ = std::move(on_finish);
  }
  // Sets the outcome (OK: the peer is verified) unless it is set: true for the call that set it.
  bool Finish(const absl::Status& outcome);
  bool finished() const { return state_.load(std::memory_order_acquire) != kPending; }
  bool verified() const { return state_.load(std::memory_order_acquire) == kVerified; }
  // Waits until the outcome is set or `deadline` passes: whether it is set.
  bool Wait(absl::Time deadline);
  // The outcome once set; Unknown while pending.
  absl::Status outcome() const;
  // Sets the outcome to `if_unset` unless it is set (Finish), and returns the outcome.
  absl::Status Settle(const absl::Status& if_unset);

 private:
  enum State : int { kPending, kVerified, kRefused };
  const AuthRole role_;
  const uint32_t key_id_;
  mutable absl::Mutex mu_;
  AuthKey key_ ABSL_GUARDED_BY(mu_);  // its secret wiped once finished
  AuthTranscript transcript_;
  std::function<void(const absl::Status&)> on_finish_;
  std::atomic<int> state_{kPending};
  absl::Status outcome_ ABSL_GUARDED_BY(mu_);
};

}  // namespace zrpc::transport

#endif  // ZRPC_TRANSPORT_AUTH_SESSION_H_
