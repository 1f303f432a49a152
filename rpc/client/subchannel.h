// Subchannel: one of a channel's connections, to one address, made on demand, and its
// reconnection state. The channel (ChannelImpl) spreads calls over its subchannels; each keeps
// at most one connection at a time and makes a new one when a call finds none open.
//
// Connecting. The first call that finds no open connection connects, on its own thread, bounded
// by ChannelOptions::connect_timeout and its deadline; calls that come meanwhile wait for that
// attempt up to their own deadlines (a call never waits past its deadline for another's
// attempt). A connection lost while another of the channel's is open is made again in the
// background, after its backoff (ChannelImpl's restorer). A runtime thread (a poller, the timer)
// never connects nor waits: a callback gets UNAVAILABLE at once. After a failed attempt calls
// fail fast with UNAVAILABLE, quoting the last error, until the backoff (backoff.h) allows the
// next attempt; an attempt cut short by the call's own deadline is that call's DEADLINE_EXCEEDED
// and sets no backoff.
//
// Threads: any. One lock per subchannel, never held across the connection attempt.
#ifndef ZRPC_RPC_CLIENT_SUBCHANNEL_H_
#define ZRPC_RPC_CLIENT_SUBCHANNEL_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "rpc/client/backoff.h"
#include "rpc/client/client_connection.h"
#include "rpc/options.h"
#include "transport/device.h"
#include "transport/poller.h"

namespace zrpc::internal {

// What a subchannel needs of its channel.
class SubchannelHost {
 public:
  // Every connection's owner (ClientConnection's).
  virtual ClientConnectionOwner& connection_owner() = 0;
  // An attempt started; it failed (ChannelStats::connect_attempts, connect_failures).
  virtual void CountAttempt() = 0;
  virtual void CountFailure() = 0;
  // A connection was made, before it carries calls: its message limit is noted.
  virtual void NoteMessageLimit(const transport::Connection& connection) = 0;
  // A connection is ready for calls: the channel keeps it among its live ones (timer, teardown).
  virtual void AddLive(std::shared_ptr<ClientConnection> connection) = 0;
  // The poller a new connection goes on: the subchannel's `home`, or, when its pollers are a
  // group's (poller_group.h), another of the group with room if home has none.
  virtual absl::StatusOr<std::shared_ptr<transport::Poller>> PollerToConnect(
      const std::shared_ptr<transport::Poller>& home) = 0;

 protected:
  ~SubchannelHost() = default;
};

class Subchannel {
 public:
  // `target` ("host:port") names the server in errors. `options` must outlive this; `poller` is
  // the one its connections are placed on (or, in a group, their first choice).
  Subchannel(SubchannelHost& host, const std::string& target, std::string address, uint16_t port,
             const ChannelOptions& options, std::shared_ptr<transport::Device> device,
             std::shared_ptr<transport::Poller> poller)
      : host_(host),
        target_(target),
        address_(std::move(address)),
        port_(port),
        options_(options),
        device_(std::move(device)),
        poller_(std::move(poller)),
        restore_backoff_(options.reconnect_backoff_initial, options.reconnect_backoff_max),
        backoff_(options.reconnect_backoff_initial, options.reconnect_backoff_max) {}

  // The open connection, or null: no wait, no attempt.
  std::shared_ptr<ClientConnection> Ready();
  // The open connection, or one made now (see the top of this file), or why there is none.
  // `deadline` is monotonic (rpc/common/monotonic.h), as every deadline here. `waited` (if
  // set) is set when there was no open connection at once (a wait, an attempt, or a failure).
  absl::StatusOr<std::shared_ptr<ClientConnection>> Get(absl::Time deadline,
                                                        bool* waited = nullptr);
  // An open connection by `deadline` (monotonic), attempts repeated after their backoff (see the
  // top of this file); DEADLINE_EXCEEDED quoting the last error when the deadline comes first.
  absl::Status Connect(absl::Time deadline);
  // Whether the channel's restorer should connect this subchannel (ChannelImpl::RestoreLoop):
  // kNo when it never had a connection (it connects on demand, or by Connect) or has one whose
  // loss is not yet noted (open, draining, or closed with its OnClosed on the way);
  // kAt, setting `*at`, while its backoff (or the short wait after a loss) runs or a call's
  // attempt is under way; kNow otherwise.
  enum class Restore { kNo, kNow, kAt };
  Restore Restorable(absl::Time now, absl::Time* at);
  // The current reconnection delay (zero when not failing).
  absl::Duration backoff() const;
  // When its backoff lets the next attempt start (monotonic; in the past when it may now).
  absl::Time next_attempt() const;
  // Forgets the connection (the channel's teardown, once it is closed).
  void Reset();
  // Forgets `closed` if it is this subchannel's connection: a closed connection keeps its
  // registered memory (arena, receive slots) for as long as anything holds it, and a subchannel
  // that gets no calls (the channel prefers open ones) would hold it until its next connect.
  // Returns the reference, for the caller to drop outside its locks.
  std::shared_ptr<ClientConnection> Forget(const ClientConnection* closed);

 private:
  // A connection lost sooner than this after its handshake counts as a failed attempt for the
  // restorer (NoteLossLocked).
  static constexpr absl::Duration kShortLived = absl::Seconds(1);
  // Sets restore_after_ for a connection just lost.
  void NoteLossLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  SubchannelHost& host_;
  const std::string& target_;
  const std::string address_;
  const uint16_t port_;
  const ChannelOptions& options_;
  const std::shared_ptr<transport::Device> device_;
  const std::shared_ptr<transport::Poller> poller_;

  mutable absl::Mutex mu_;
  std::shared_ptr<ClientConnection> current_ ABSL_GUARDED_BY(mu_);
  // A caller is connecting (outside `mu_`); others wait for it, each up to its own deadline.
  bool connecting_ ABSL_GUARDED_BY(mu_) = false;
  bool ever_connected_ ABSL_GUARDED_BY(mu_) = false;  // Restorable
  // The restorer waits until restore_after_ after a loss (NoteLossLocked); monotonic.
  absl::Time restore_after_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  absl::Time connected_at_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  // current_'s loss was noted (NoteLossLocked, once per connection): until then the restorer
  // leaves the subchannel alone.
  bool current_loss_noted_ ABSL_GUARDED_BY(mu_) = false;
  ReconnectBackoff restore_backoff_ ABSL_GUARDED_BY(mu_);
  absl::Time next_attempt_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();  // monotonic
  ReconnectBackoff backoff_ ABSL_GUARDED_BY(mu_);
  absl::Status last_error_ ABSL_GUARDED_BY(mu_);
};

}  // namespace zrpc::internal

#endif  // ZRPC_RPC_CLIENT_SUBCHANNEL_H_
