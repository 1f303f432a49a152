// Listener: accepts connections on one address and port, on a thread of its own, with every
// handshake bounded and every peer held to limits.
//
// Why a thread and not a caller-driven Accept(). A handshake is a conversation: connection
// request, the listener's reply (REP), the peer's confirmation (RTU). A peer may stop half-way
// (crash, packet loss, or on purpose), and an Accept that waits for one handshake at a time lets
// three silent peers delay everyone else by their timeouts. So the listener owns its cm channel:
// one thread reads every event on it, answers each request at once and keeps each unfinished
// handshake in a table with a deadline of its own (handshake_timeout from its request). A peer
// that never finishes is dropped when its deadline passes; nobody else waits for it.
//
// What a request must pass, in order (a refusal is sent to the peer as text its Connect quotes,
// and reported to AcceptHandler::OnRefused):
//  1. a valid Hello (wire.h) that does not say kHelloParks (only the accepting side parks), and
//     an RNR retry count and a transport retry count below 7: the accepting side's queue pair
//     takes both counts from the peer's request, and 7 means "retry forever" (for transport
//     retries, on rxe), which would let a peer that claims more receive credits than it posts
//     wedge this side's sends for good, or keep a dead peer's connection alive, instead of
//     failing within seconds;
//  2. admission: at most max_connections connections (open or handshaking) in all, and at most
//     max_connections_per_peer from one IP address, so one host cannot take every place; a
//     connection's place is given back when it closes (OnClosed), not when it is destroyed; and
//     at most accepts_per_second_per_peer requests a second from one address (a token bucket,
//     accept_burst_per_peer deep), so one host reconnecting in a loop cannot take this thread
//     ("server busy");
//  2a. with keys (ConnectionOptions::auth_keys; auth.h), a request that presents one of them,
//     with a nonce not seen lately; without, a request that presents none (the refusals are
//     counted: auth_counts());
//  3. AcceptHandler::Place, which picks the connection's poller and handler (or refuses);
//  4. resources: receive slots from the device's pool, an arena, CQ entries on the poller. A
//     server that cannot give them refuses with what ran out ("server full").
// When the peer's confirmation arrives the connection moves to its poller's cm channel, the
// poller is woken to look at it (a hang-up that raced the handshake moved along with it and is
// seen at once), and AcceptHandler::OnAccepted receives it. A hang-up before that drops the
// handshake and frees everything it held. With keys, OnAccepted waits until the poller has
// checked the client's tag (its first frame, connection_auth.cc) and answered; a tag that does
// not match, any other first frame, a hang-up, or no tag within handshake_timeout of the request
// is reported to OnRefused instead, the connection closed without its handler hearing of it.
//
// Threads. The AcceptHandler is called on the listener's thread, one call at a time; it must not
// block for long (handshakes wait meanwhile) and must not destroy the Listener. Destroying the
// Listener stops the thread and drops unfinished handshakes, each reported to OnRefused (on the
// destroying thread) so that what was placed for it is freed; connections already accepted are
// unaffected.
//
// Every placement ends in exactly one of: OnRefused (the connection never opened; its handler
// hears nothing), or OnAccepted and, on the poller thread, the handler's OnClosed. Those two
// race: OnClosed may run before OnAccepted (a peer that breaks the protocol at once). The Device
// and every poller Place returns must outlive the Listener.
#ifndef ZRPC_TRANSPORT_LISTENER_H_
#define ZRPC_TRANSPORT_LISTENER_H_

#include <rdma/rdma_cma.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "transport/auth.h"
#include "transport/connection.h"
#include "transport/device.h"
#include "transport/options.h"
#include "transport/verbs_owners.h"

namespace zrpc::transport {

class Poller;

// Where an accepted connection goes: the poller its queue pair uses, and its handler. The poller
// must outlive the connection. The handler must too, unless `owner` owns it: then the
// connection holds `owner` until it is destroyed, so the handler lives as long as anything can
// reach it through the connection (Connection::handler(), the poller's callbacks, OnAccepted),
// however a close on the poller races the listener's OnAccepted.
struct Placement {
  Poller* poller = nullptr;
  ConnectionHandler* handler = nullptr;
  std::shared_ptr<ConnectionHandler> owner;  // optional; owns `handler` when set
  // Bytes the accept reply carries to the client after the Hello (wire.h), which reads them as
  // Connection::peer_accept_data(). Zero: none.
  AcceptData accept_data{};
};

class AcceptHandler {
 public:
  virtual ~AcceptHandler() = default;
  // A request from `peer` ("ip:port") passed the checks: choose its placement, or refuse it
  // with a status whose message the peer's Connect quotes.
  virtual absl::StatusOr<Placement> Place(const std::string& peer) = 0;
  // The handshake finished. The connection is open, or already failing (then OnClosed follows
  // on its handler).
  virtual void OnAccepted(std::shared_ptr<Connection> connection) = 0;
  // A request refused or a handshake abandoned, and why: for logs and metrics. `placed` is the
  // handler Place chose when the refusal came after Place (it will never hear of the
  // connection: free what was placed for it), else null.
  virtual void OnRefused(const std::string& /*peer*/, ConnectionHandler* /*placed*/,
                         const absl::Status& /*why*/) {}
};

class Listener {
 public:
  // Listens on `addr` (empty: the device's address) and `port` (0: any free one; see port())
  // and starts accepting on a new thread. `handler` must outlive the Listener.
  static absl::StatusOr<std::unique_ptr<Listener>> Create(Device& device, const std::string& addr,
                                                          uint16_t port, AcceptHandler* handler,
                                                          const ListenerOptions& options = {});
  ~Listener();
  Listener(const Listener&) = delete;
  Listener& operator=(const Listener&) = delete;

  uint16_t port() const;
  // Connections open or handshaking now (each holds a place until it closes), and the most at
  // once since Create: never above max_connections.
  uint32_t connections() const;
  uint32_t peak_connections() const;
  // Handshakes not finished yet (with keys, until the client's tag is checked).
  size_t handshakes() const;

  // Peer authentication's counts since Create (auth.h): connections whose client proved its key,
  // and requests or handshakes refused, by why.
  struct AuthCounts {
    uint64_t authenticated = 0;
    uint64_t refused_no_key = 0;          // this listener has keys; the request presented none
    uint64_t refused_unknown_key = 0;     // a key id it does not hold
    uint64_t refused_unexpected_key = 0;  // it has no keys; the request presented one
    uint64_t refused_replay = 0;          // a client nonce seen lately (NonceCache)
    uint64_t refused_bad_tag = 0;         // the client's tag did not match
    // Established, but no tag came: another frame first, a hang-up, or handshake_timeout passed.
    uint64_t refused_no_tag = 0;
    uint64_t refused() const {
      return refused_no_key + refused_unknown_key + refused_unexpected_key + refused_replay +
             refused_bad_tag + refused_no_tag;
    }
  };
  AuthCounts auth_counts() const;
  // Replaces the keys requests are checked against, from the next request on: how keys rotate
  // without a restart (accept the old and the new, move the clients, drop the old). Empty: no
  // authentication from then on. InvalidArgument for a keyring AuthKeyring::Create refuses; the
  // keys stay as they were. Handshakes already answered finish with the key they began with.
  absl::Status SetAuthKeys(std::vector<AuthKey> keys);

 private:
  // Places taken, shared with accepted connections, which give theirs back when they close
  // (possibly after the Listener is gone).
  // Each address's token bucket of connection requests (accepts_per_second_per_peer).
  struct RequestRate {
    double tokens = 0;
    std::chrono::steady_clock::time_point refilled;
  };
  struct Admission {
    absl::Mutex mu;
    uint32_t total ABSL_GUARDED_BY(mu) = 0;
    uint32_t peak ABSL_GUARDED_BY(mu) = 0;
    absl::flat_hash_map<std::string, uint32_t> per_peer ABSL_GUARDED_BY(mu);
    // Only addresses seen within the last burst's refill time: a full bucket is forgotten
    // (Admit sweeps them as the map grows), so addresses cannot grow it without bound.
    absl::flat_hash_map<std::string, RequestRate> rates ABSL_GUARDED_BY(mu);
    size_t sweep_at ABSL_GUARDED_BY(mu) = 1024;
  };
  struct Handshake {
    std::shared_ptr<Connection> connection;
    absl::Time deadline;
  };
  // An eventfd that wakes the loop, shared with the connections whose tag is being checked, whose
  // poller writes it when the outcome is known (it may outlive the Listener).
  struct WakeFd {
    int fd = -1;
    ~WakeFd();
    void Wake() const;
  };
  struct AtomicAuthCounts {
    std::atomic<uint64_t> authenticated{0}, no_key{0}, unknown_key{0}, unexpected_key{0}, replay{0},
        bad_tag{0}, no_tag{0};
  };

  Listener(Device& device, AcceptHandler* handler, const ListenerOptions& options);
  void Loop();
  void OnEvent(rdma_cm_event* event);
  // A connection request: checked, placed and answered, or refused. Takes the event (acks it).
  void OnRequest(rdma_cm_event* event);
  absl::Status Admit(const std::string& ip);
  static void Leave(Admission& admission, const std::string& ip);
  void Complete(rdma_cm_id* id);
  // Drops an unfinished handshake and frees what it held.
  void Abandon(rdma_cm_id* id, const absl::Status& why);
  void ExpireHandshakes();
  // The request's authentication (auth.h), checked against the keys: the key it presents (null:
  // none, and none is needed), or why it is refused (counted).
  absl::StatusOr<const AuthKey*> CheckAuthRequest(const AuthKeyring* keys,
                                                  const AuthRequest& request, const Hello& hello);
  // Connections whose tag was being checked and whose outcome is known: OnAccepted or OnRefused.
  void SettleVerified();
  // The earliest deadline of the handshakes, both kinds.
  absl::Time NextDeadline() const;

  Device& device_;
  AcceptHandler* handler_;
  const ListenerOptions options_;
  std::shared_ptr<Admission> admission_ = std::make_shared<Admission>();
  // Unfinished handshakes by cm id; only the listener thread touches it after Create.
  absl::flat_hash_map<rdma_cm_id*, Handshake> handshakes_;
  // Established handshakes whose client's tag is being checked, by connection; listener thread.
  absl::flat_hash_map<Connection*, Handshake> verifying_;
  std::atomic<size_t> handshake_count_{0};
  // Keys (null: none); replaced whole by SetAuthKeys, read by the listener thread per request.
  mutable absl::Mutex keys_mu_;
  std::shared_ptr<const AuthKeyring> keys_ ABSL_GUARDED_BY(keys_mu_);
  NonceCache nonces_{4096};  // the listener thread's
  AtomicAuthCounts auth_counts_;

  // Declared before the ids that report to it: destroyed after them.
  CmChannelOwner channel_;
  CmIdOwner id_;
  std::shared_ptr<WakeFd> wake_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace zrpc::transport

#endif  // ZRPC_TRANSPORT_LISTENER_H_
