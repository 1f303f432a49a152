// RpcConnection: what the client's and the server's connection handlers share: reading the RPC
// header of each message, pairing bulk payloads with their messages, sending a message with its
// payload, handing received payloads to users, and disconnecting a peer that breaks the protocol.
//
// Receiving (poller thread). OnBulk keeps the connection's one unpaired payload; Receive decodes
// the next message's header (rpc_header.h) and claims that payload for it, by the pairing rules
// of WIRE.md. A malformed header or a broken pairing is a protocol violation: the connection is
// closed, the reason is logged with the peer's address, and every call on it fails through the
// subclass's OnClosed. Nothing a peer sends is used before it is checked.
//
// Sending (any thread). SendMessage writes the RPC header in front of a body already in the send
// buffer and, for a message with a payload, queues WRITE_WITH_IMM and SEND together in one
// transport operation (WriteBulkThenSend), so no other message of the connection comes between
// a payload and its message (the receiver pairs them by order). Messages alone therefore take
// no lock of this layer; payloads take the connection's send lock, which orders them against
// Withdraw. A payload goes one of two ways:
//   - zero-copy, when it lies in memory the application registered on this connection's device
//     (registered_memory.h): the WRITE reads the caller's bytes, and the payload (its release,
//     its registration) is held by a record whose address is the WRITE's transport token, until
//     OnSendDone reports the WRITE done or flushed;
//   - staged, otherwise: copied into a staging buffer (staging.h), the caller's bytes released at
//     once, and the staging buffer returned at OnSendDone.
// The two kinds of token differ in their lowest bit (kZeroCopyTag).
//
// Taking a payload back. A client's call that ends (deadline, cancel) while its payload has not
// left yet must not leave the caller's bytes with the runtime: Withdraw takes it back from the
// deferred list below, or, for a zero-copy WRITE still waiting in the transport for credits or
// arena space, from the transport's queue (with its message; the transport then reports the
// WRITE withdrawn, and its OnSendDone releases the payload), so the call's ending (which waits
// for the payload's release: BulkGate) never waits on the peer. A WRITE already posted cannot
// be taken back; it completes or is flushed within the transport's retry time.
//
// Staging per connection. The staging pool is shared by every connection of a server (or
// channel), and a staged payload is held until its WRITE completes, which waits for the peer's
// arena: a peer that holds or slowly releases payloads would pin staging until every other
// connection's payloads were refused. So a connection stages at most what its peer's arena holds
// (rounded up to a staging buffer); a message whose payload does not fit that quota waits, in
// order, in the connection's deferred list, unstaged (the caller's bytes stay in the
// OutgoingBulk), and goes out when the connection's earlier payloads complete. Back-pressure
// lands on the slow peer's own calls; the rest are served. A deferred message that later cannot
// go fails its call through OnDeferredFailed (the subclass answers or ends the call).
//
// Received payloads given to users are IncomingBulk whose releaser is ReceiveReleaser: the token
// is a small heap record holding the Connection (shared), so a payload released after the
// connection failed, or after the handler went away, still finds its arena.
//
// The implementation, one file a phase (eRPC's rpc_impl/ split): rpc_connection_receive.cc
// (the poller's callbacks, Receive, releasing payloads), rpc_connection_send.cc (SendMessage,
// send slots, answers and errors, the staging quota and deferred list), rpc_connection_bulk.cc
// (BulkGate, ReceiveLimits, pulls, exposure, zero-copy and staged WRITEs, Withdraw) and
// rpc_connection_stream.cc (stream frames); rpc_connection_internal.h has the records they
// share.
#ifndef ZRPC_RPC_CONNECTION_RPC_CONNECTION_H_
#define ZRPC_RPC_CONNECTION_RPC_CONNECTION_H_

#include <google/protobuf/message_lite.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "rpc/bulk.h"
#include "rpc/bulk/staging.h"
#include "rpc/connection/rpc_header.h"
#include "rpc/impl/inline_function.h"
#include "rpc/stream/stream_state.h"
#include "transport/connection.h"
#include "transport/device.h"
#include "transport/poller.h"

namespace zrpc::internal {

// The reserved service every server answers itself, on its poller thread (WIRE.md, keepalive).
inline constexpr absl::string_view kKeepaliveService = "zrpc.Keepalive";
inline constexpr uint32_t kKeepaliveServiceId = ServiceId(kKeepaliveService);

// The smallest message the RPC layer works with: a header, and a body that holds an error with
// a useful message. Servers and channels set it as their connections' min_message_size, so a
// peer announcing smaller receives is refused at the handshake and MaxBody never underflows.
inline constexpr uint32_t kMinRpcMessage = RpcHeader::kSize + 256;

// How soon a runtime thread tries again to send what found no send slot (a client's cancels and
// asynchronous stream frames, a server's async stream frames), if nothing sooner says a slot is
// back: slots free as sends complete, and the completion batch that frees one tells what waits
// (transport::Connection::NotifyWhenSendSlotFree); this timed retry is for slots given back
// otherwise, and costs a millisecond at most. Both sides' timers use it (through SlotRetry()),
// and a client's timer also as "shortly" while its expiry pass waits in the domain.
inline constexpr absl::Duration kSlotRetry = absl::Milliseconds(1);
// The retry both timers use: kSlotRetry, unless a test lengthened it (SetSlotRetryForTesting) to
// show that the completions' notices alone send what waits.
absl::Duration SlotRetry();
void SetSlotRetryForTesting(absl::Duration retry);

// Gives received payloads back to their connection, from any thread. Stateless: one for the
// process, so it outlives every IncomingBulk (bulk.h asks that of a releaser).
class ReceiveReleaser final : public BulkReleaser {
 public:
  static ReceiveReleaser& Get();
  // Wraps a payload received on `connection`, whose handler is `owner`, for a user. The bulk
  // keeps alive everything its release needs: the connection, its poller (whose CQ the
  // connection's queue pair needs) and the device (its slots, its protection domain), so it may
  // be released after its server or channel is gone.
  static IncomingBulk Wrap(const class RpcConnection& owner,
                           std::shared_ptr<transport::Connection> connection,
                           const transport::ReceivedBulk& bulk);
  void ReleaseBulk(uint64_t token) override;
};

// A received message whose header has been checked, with its body and paired payload.
struct IncomingMessage {
  RpcHeader header;
  // The serialized message: in the SEND (without the descriptors), or at the front of the
  // payload for a large body (set once the payload is here: paired, or pulled).
  absl::Span<const uint8_t> body;
  uint64_t handle;  // give back with Connection::Release
  // The bulk payload the method carries, without the large body in front of it (if any):
  // written into the arena (paired) or pulled (after StartPull). Give it back with
  // RpcConnection::ReleasePayload; when a large body shares its memory, that holds the body too.
  std::optional<transport::ReceivedBulk> bulk;
  // The memory of a large body when no bulk payload holds it (a large body alone, or one pulled
  // apart from the bulk payload): given back the same way.
  std::optional<transport::ReceivedBulk> body_payload;
  MessageLayout layout;  // where the parts are; layout.pull_count > 0: still to pull
  bool pulls() const { return layout.pull_count > 0; }
  // Bytes of the message itself, in the SEND or in the payload.
  size_t body_size() const { return layout.payload_body > 0 ? layout.payload_body : body.size(); }
  // Bytes of the method's bulk payload.
  uint32_t bulk_size() const { return layout.bulk_size(header); }
};

// What one side (a server, or a channel) takes from its peer: messages of at most
// max_message_size bytes, bulk payloads of at most max_bulk_size, and payloads pulled from the
// peer (with the large bodies among them) together at most `budget` bytes at once, counted
// from the pull until the payload is released. Thread-safe; shared with the payloads
// themselves, so it outlives its server or channel when they do.
class ReceiveLimits {
 public:
  // `side` names the options in errors: "ServerOptions", "ChannelOptions".
  ReceiveLimits(uint64_t max_message_size, uint64_t max_bulk_size, uint64_t budget,
                std::string side)
      : max_message_size_(max_message_size),
        max_bulk_size_(max_bulk_size),
        budget_(budget),
        side_(std::move(side)) {}
  // kResourceExhausted, naming the option, for a message larger than max_message_size.
  // `what` names the message ("request", "response").
  // Inline: every message is checked, and almost all fit.
  absl::Status CheckMessage(uint64_t size, absl::string_view what) const {
    return size <= max_message_size_ ? absl::OkStatus() : MessageTooLarge(size, what);
  }
  uint64_t max_message_size() const { return max_message_size_; }
  // Takes `bytes` for one pulled payload, of which `bulk_bytes` are a bulk payload (the rest a
  // large body: CheckMessage covers it); kResourceExhausted naming the option over its limit.
  absl::Status Take(uint64_t bytes, uint64_t bulk_bytes);
  // kResourceExhausted, naming the option, for a bulk payload larger than max_bulk_size.
  absl::Status CheckBulk(uint64_t size) const;
  void Give(uint64_t bytes) { in_use_.fetch_sub(bytes, std::memory_order_relaxed); }
  uint64_t in_use() const { return in_use_.load(std::memory_order_relaxed); }

 private:
  // CheckMessage's error.
  absl::Status MessageTooLarge(uint64_t size, absl::string_view what) const;

  const uint64_t max_message_size_;
  const uint64_t max_bulk_size_;
  const uint64_t budget_;
  const std::string side_;
  std::atomic<uint64_t> in_use_{0};
};

// A payload this side exposes for the peer to pull: the caller's bytes and the registrations
// made for them, if any. The registrations go first (after which the peer's NIC can read nothing
// more), then the bytes are released. A large body (a message that did not fit a slot) is
// exposed beside it the same way.
//   - Through windows (transport/exposures.h; a device with type-2 windows): the record is the
//     transport's from Expose on, freed at its OnSendDone (kExposureTag), which comes once the
//     windows' keys are dead. A part in memory registered on this device needs no registration
//     (where a window opens only its own range, or the part is the whole registration).
//   - Without: each part registered for remote READ, exactly its bytes; the record is kept by
//     an ExposureHold until the peer is done.
struct ExposedPayload {
  OutgoingBulk bulk;
  OutgoingBulk body;
  std::unique_ptr<transport::MemoryRegion> region;
  std::unique_ptr<transport::MemoryRegion> body_region;
  std::atomic<uint32_t>* count = nullptr;  // the connection's count of exposed payloads
  ~ExposedPayload() {
    region.reset();
    body_region.reset();
    bulk.Reset();
    body.Reset();
    if (count != nullptr) count->fetch_sub(1, std::memory_order_relaxed);
  }
};

// What a call's gate, or a server's table of responses, keeps of one exposed payload until the
// peer is done with it; ending it (End, or destruction) withdraws the payload: the payload itself
// without windows (its registrations removed, its bytes released), or the transport's exposure
// (Connection::EndExposure: its windows deallocated, the record freed at the OnSendDone that
// follows). Ending an exposure the peer has invalidated already does nothing. Move-only.
class ExposureHold {
 public:
  ExposureHold() = default;
  explicit ExposureHold(std::unique_ptr<ExposedPayload> payload) : payload_(std::move(payload)) {}
  // `connection` must outlive this, or End(/*orphan=*/true) must come first.
  ExposureHold(transport::Connection* connection, uint64_t exposure)
      : connection_(connection), exposure_(exposure) {}
  ExposureHold(ExposureHold&& other) noexcept { *this = std::move(other); }
  ExposureHold& operator=(ExposureHold&& other) noexcept {
    End();
    payload_ = std::move(other.payload_);
    connection_ = std::exchange(other.connection_, nullptr);
    exposure_ = std::exchange(other.exposure_, 0);
    return *this;
  }
  ~ExposureHold() { End(); }

  bool empty() const { return payload_ == nullptr && exposure_ == 0; }
  // Withdraws the payload now. `orphan`: the connection is gone (its exposures ended with it), and
  // so is the count of exposed payloads, which a payload must then not count itself out of.
  void End(bool orphan = false) {
    if (payload_ != nullptr && orphan) payload_->count = nullptr;
    payload_.reset();
    if (exposure_ != 0 && !orphan && connection_ != nullptr) connection_->EndExposure(exposure_);
    exposure_ = 0;
    connection_ = nullptr;
  }

 private:
  std::unique_ptr<ExposedPayload> payload_;
  transport::Connection* connection_ = nullptr;
  uint64_t exposure_ = 0;
};

// What lets a client's call end only once the runtime no longer reads its request payload
// (bulk.h's promise to callers): the payload's release marks the gate, and a call that ends
// before that parks its ending here until then. It also keeps the zero-copy WRITE's transport
// token while the payload may still be waiting, for Withdraw. Thread-safe.
class BulkGate : public std::enable_shared_from_this<BulkGate> {
 public:
  // `held`: how many things are held from the start (a request payload, a large request body:
  // each is released once). A gate for a response destination starts with none and holds only
  // while a READ lands there (Begin).
  explicit BulkGate(int held = 1) : held_(held) {}
  // Holds again (a READ into the call's destination starts), unless the call has ended: false
  // then, and nothing may land there any more.
  bool Begin();
  // One thing held was released: the last runs the parked ending, if any, on this thread.
  void Released();
  // Runs `then` now if the payload was released, else when it is.
  // (Move-only: it holds the call's ending, whose DoneCallback is.)
  void AfterRelease(InlineFunction<void(), 48> then);
  // The call ended. A payload exposed for the server to pull, and not pulled yet, stays exposed
  // when there is a retire hook (the server may be reading it: withdrawing it under its READ
  // would fail the server's connection), and the hook is told so; without one it is withdrawn
  // now (ExposureHold::End: its key killed, so the server's NIC can read no more of it, then its
  // bytes released).
  void End();
  // Keeps `source`, the call's payload exposed for pulling, until Withdraw (the server pulled
  // it, or answered, or gave up) or End without a retire hook. False (and `source` left with the
  // caller, who destroys it and sends nothing) when the call has ended already.
  bool Hold(ExposureHold& source);
  // Told at End whether a payload is still exposed (true) or not (false). Runs outside the lock.
  // False (and not set) when the call has ended already.
  bool SetRetire(std::function<void(BulkGate& gate, bool exposed)> retire);
  // Withdraws the payload exposed, if any (ExposureHold::End): its key killed, then its bytes
  // released (which ends a call that ended meanwhile; through windows, that release comes at the
  // exposure's OnSendDone on the poller). `orphan`: the connection is gone, and with it its
  // exposures and its count of exposed payloads.
  void Withdraw(bool orphan = false);

 private:
  friend class RpcConnection;
  absl::Mutex mu_;
  int held_ ABSL_GUARDED_BY(mu_);  // released when 0
  bool ended_ ABSL_GUARDED_BY(mu_) = false;
  InlineFunction<void(), 48> then_ ABSL_GUARDED_BY(mu_);
  uint64_t token_ ABSL_GUARDED_BY(mu_) = 0;  // zero-copy WRITE's token; 0 once released
  ExposureHold source_ ABSL_GUARDED_BY(mu_);
  std::function<void(BulkGate&, bool)> retire_ ABSL_GUARDED_BY(mu_);
};

// Whether the calling thread is one of the runtime's own: a poller (transport), a channel's
// timer or a server's sweeper. Callbacks run there, and nothing there may wait for what only
// those threads produce (send slots, staging quota, connections, answers).
bool OnRuntimeThread();
// Marks the calling thread as a runtime timer (a channel's timer, a server's sweeper).
void MarkRuntimeTimerThread();

class RpcConnection : public transport::ConnectionHandler {
 public:
  // `side` names this end in logs ("client", "server"); `staging` must outlive the connection.
  // `device` and `poller` are the connection's: payloads handed to users hold them (Wrap).
  RpcConnection(const char* side, StagingPool& staging, std::shared_ptr<ReceiveLimits> limits,
                std::shared_ptr<transport::Device> device,
                std::shared_ptr<transport::Poller> poller)
      : side_(side),
        staging_(staging),
        receive_limits_(std::move(limits)),
        device_(std::move(device)),
        poller_(std::move(poller)) {}

  void OnBulk(transport::Connection& connection, const transport::ReceivedBulk& bulk) override;
  void OnSendDone(transport::Connection& connection, uint64_t token,
                  const absl::Status& status) override;

  // The RPC body of a send buffer starts after the header.
  static uint8_t* Body(const transport::SendBuffer& buffer) {
    return buffer.data + RpcHeader::kSize;
  }
  // Gives back a received payload: written into the arena (the transport's handle) or pulled
  // (this layer's memory). Any thread.
  static void ReleasePayload(transport::Connection& connection, uint64_t handle);
  // Body bytes a message can carry on `connection`.
  static size_t MaxBody(const transport::Connection& connection) {
    const size_t max = connection.max_message_size();  // >= kMinRpcMessage (see there)
    return max > RpcHeader::kSize ? max - RpcHeader::kSize : 0;
  }

  // Whether a message of `size` bytes goes in a slot on `connection` (else: as a large body),
  // with room left for the descriptor of a pulled payload beside it.
  static size_t MaxInlineBody(const transport::Connection& connection) {
    return MaxBody(connection) - PullDescriptor::kSize;  // MaxBody >= 256 (kMinRpcMessage)
  }
  static bool FitsSlot(const transport::Connection& connection, size_t size) {
    return size <= MaxInlineBody(connection);
  }
  // Whether a metadata block of `block` bytes goes in a SEND on `connection` beside whatever
  // else a message's SEND may need to carry (a large body's trailer, two pull descriptors):
  // kResourceExhausted naming the slot size when not (slots far below the 4 KiB default).
  static absl::Status MetadataFits(const transport::Connection& connection, size_t block);

  // A send buffer of `connection`, waiting while every one is in flight: they free as earlier
  // sends complete, usually within microseconds, so it yields first and then sleeps 100 us at a
  // time (a peer that stalls the connection must not cost a spinning core per waiter). Before
  // each wait it asks `stop`, which returns OK to go on or the status to give up with (the
  // caller's deadline, its stream's end). Never waits when `may_wait` is false (a poller or the
  // timer: only those threads free slots, so waiting there would wait for itself): then
  // kResourceExhausted at once, saying so. Other failures of the acquire (the connection is
  // closing) are returned as they are. `leave_free`: as transport::Connection::
  // AcquireSendBuffer's. `stop` is a FunctionRef: every unary call comes here, and a
  // std::function would be built per call.
  static absl::StatusOr<transport::SendBuffer> AcquireSendBufferWaiting(
      transport::Connection& connection, bool may_wait, absl::FunctionRef<absl::Status()> stop,
      uint32_t leave_free = 0);

  const ReceiveLimits& limits() const { return *receive_limits_; }

  // Sends `header` and the `body_size` bytes already at Body(buffer) (taking the buffer), with
  // `bulk` beside it (released here, on every path; its size goes into the header). A message
  // too large for a slot comes as `large_body` instead (body_size 0) and travels at the front of
  // the payload (WIRE.md, "Messages larger than a slot"). A payload that fits the peer's arena is
  // written there (zero-copy, or staged: always with a large body); a larger one is exposed for
  // the peer to pull. Errors: kInvalidArgument for a payload of 4 GiB or more, or a body that
  // leaves no room for the pull descriptor; kResourceExhausted when no staging memory is free or
  // registration fails; kUnavailable when the connection is closed or failing.
  // A request's `deadline` (monotonic.h; InfiniteFuture for none) becomes its header's remaining
  // time at the last moment, after the payload is staged, so the server's deadline is not late
  // by the staging. (Time spent waiting for credits in the transport is not subtracted.)
  // A client passes its call's `gate` (with the payload's release chained to it), for Withdraw.
  // A server passes `expose` when the request asked for a pulled response (kRpcFlagPullResponse):
  // the payload is then exposed whatever its size.
  absl::Status SendMessage(transport::Connection& connection, const transport::SendBuffer& buffer,
                           RpcHeader header, size_t body_size, OutgoingBulk bulk,
                           OutgoingBulk large_body = OutgoingBulk(),
                           absl::Time deadline = absl::InfiniteFuture(), BulkGate* gate = nullptr,
                           bool expose = false);
  // SendMessage for a message without payload that answers the received message whose handle is
  // `answered`: the transport gives that back and sends under one lock (ReleaseAndSend), so the
  // answer carries its credit. The release happens whatever the outcome.
  absl::Status SendAnswer(transport::Connection& connection, const transport::SendBuffer& buffer,
                          RpcHeader header, size_t body_size, uint64_t answered);
  // Serializes a stream's `message` (null: a frame without one) straight into Body(buffer)
  // when it fits a slot (an empty result), else into memory of its own, returned to go at the
  // front of a payload (kResourceExhausted when none can be had).
  static absl::StatusOr<OutgoingBulk> SerializeStreamMessage(
      const transport::Connection& connection, const transport::SendBuffer& buffer,
      const google::protobuf::MessageLite* message);
  // A stream's message (rpc/streaming.h) of `body_size` bytes already at Body(buffer), or, when
  // it did not fit a slot, `large_body` (body_size 0): written into the peer's arena at the front
  // of a payload, as a large request's. Never deferred behind the staging quota, as SendMessage
  // defers payloads: a stream's next small frame would overtake it. It waits for the quota here
  // instead, while `give_up` returns false (the stream is still on) and the connection is open,
  // unless `may_wait` is false (a runtime thread, which would wait for itself: the quota frees as
  // the poller completes sends): then kResourceExhausted at once when the quota is full.
  // A body larger than the peer's arena is exposed for the peer to pull instead (SendPulled,
  // held in exposed_ until the peer's kPulled names it), with no staging: the receiver keeps
  // the stream's later frames behind it. Errors as SendMessage's. Takes the buffer on every
  // path.
  // `quota_taken`: the caller took the quota already (TakeQuotaOrWait).
  absl::Status SendStreamMessage(transport::Connection& connection,
                                 const transport::SendBuffer& buffer, const RpcHeader& header,
                                 size_t body_size, OutgoingBulk large_body, bool may_wait,
                                 absl::FunctionRef<bool()> give_up, bool quota_taken = false);
  // One frame of a stream, either side's: `message` (null: a header alone, a credit or a
  // half-close) of `size` bytes, within this side's max_message_size, in a send buffer of its
  // own (leaving `leave_free` free: AcquireSendBuffer's), serialized straight into it or, past a
  // slot, into memory sent at the front of a payload (SendStreamMessage). Waits for a buffer or
  // the quota unless this is a runtime thread, and while `gone` is false. Returns:
  //   OK: sent;
  //   kCancelled: `gone` turned true (the stream's end says why);
  //   with `no_slot`, set (and a kResourceExhausted status) when every send slot is taken on a
  //     runtime thread, which must not wait (the caller tries again later);
  //   kResourceExhausted (a limit, the quota, memory, or no slot without `no_slot`) or
  //     kUnavailable (the connection is closing) otherwise: the stream fails with it.
  // `quota_taken` (StreamQuotaOrWait took it) goes back on every path on which nothing is sent.
  // `bulk` (if set and not empty): a bulk payload beside the message, exposed for the peer to
  // pull with the message's body when that does not fit the slot (no staging: a reader holding
  // payloads never holds the peer's arena); taken once the frame has a send slot, and left with
  // the caller only when it did not get one (`*no_slot`, kCancelled, or a closing connection).
  absl::Status SendStreamFrame(transport::Connection& connection, const RpcHeader& header,
                               const google::protobuf::MessageLite* message, size_t size,
                               absl::FunctionRef<bool()> gone, uint32_t leave_free,
                               bool quota_taken, bool* no_slot, OutgoingBulk* bulk = nullptr);
  // For an asynchronous stream's message of `size` bytes, larger than a slot, sent from a
  // runtime thread (which must not wait for the quota: client_stream.h): takes the staging
  // quota it needs when there is room (true); else (false) `waiter` is told once quota comes
  // back, and tries again then. Quota taken for a message that then does not go is given back
  // with ReturnStreamQuota.
  bool TakeQuotaOrWait(const transport::Connection& connection, size_t size,
                       std::weak_ptr<StreamListener> waiter);
  void ReturnStreamQuota(size_t size);
  // An asynchronous stream's check before it sends a message of `size` bytes: true to send it
  // now, with `*quota_taken` when TakeQuotaOrWait took its quota (only a message larger than a
  // slot, sent from a `runtime_thread`, needs that); false while it waits for `waiter` to be told.
  // A message with a bulk payload (`has_bulk`) is pulled, whatever its size: it needs none.
  bool StreamQuotaOrWait(const transport::Connection& connection, size_t size, bool runtime_thread,
                         std::weak_ptr<StreamListener> waiter, bool* quota_taken,
                         bool has_bulk = false);
  // An asynchronous stream's pump whose frame found no send slot on a runtime thread (which
  // must not wait for one: it is what frees them). `waiter` is told once, when the connection's
  // next completion batch leaves a slot free (OnSendSlotFree). The fallback, for a slot given
  // back other than by a completion, is the owner's: a client's timer pass calls TellSlotWaiters;
  // a server's sweeper retries the pumps it keeps itself (ServerImpl::WaitForSlot), so those may
  // be told twice, which costs a pump one more look. Any thread.
  void WaitForSendSlot(transport::Connection& connection, std::weak_ptr<StreamListener> waiter);
  // Tells every waiting pump that slots may be back (each tries again, and asks again if none
  // is). Any thread, no lock held; a load when none waits.
  void TellSlotWaiters();
  bool slot_waiters_pending() const {
    return slot_waiters_pending_.load(std::memory_order_acquire);
  }
  // The transport's notice (WaitForSendSlot asked for it): tells the waiting pumps. An override
  // calls this too.
  void OnSendSlotFree(transport::Connection& connection) override;
  // Takes back the payload of request `call_id`, whose gate is `gate`, if it has not left yet
  // (see the top of this file); its release runs here, on this thread. Nothing when it has.
  void Withdraw(transport::Connection& connection, uint64_t call_id, BulkGate& gate);

  // A message with only a header (cancel) or an error with its status; takes a send buffer of
  // its own. kResourceExhausted when none is free.
  absl::Status SendHeaderOnly(transport::Connection& connection, const RpcHeader& header);
  // With `trailing` (null: none) and `status`'s payloads in a metadata block in front of the
  // message (WIRE.md, "Metadata"), as much of them as fits Metadata::kMaxSize and the slot.
  absl::Status SendError(transport::Connection& connection, uint64_t call_id,
                         const absl::Status& status, const Metadata* trailing = nullptr);

  uint64_t violations() const { return violations_.load(std::memory_order_relaxed); }
  // The last thing that went wrong on this connection, for an operator (/connections): a
  // protocol violation, a call the runtime refused or could not answer, the connection's
  // failure. Slow paths only; any thread.
  struct LastError {
    std::string what;  // empty: nothing went wrong
    absl::Time when;
  };
  void NoteError(absl::string_view what);
  LastError last_error() const;
  // Large transfers under way on this connection: payloads this side is pulling, or has
  // exposed for the peer to pull. They move without a message for seconds, and what this side
  // sends meanwhile may queue behind them: liveness checks must not take that for silence.
  uint32_t pulling() const { return pulling_.load(std::memory_order_relaxed); }
  bool Transferring() const {
    return pulling_.load(std::memory_order_relaxed) > 0 ||
           exposed_count_.load(std::memory_order_relaxed) > 0;
  }
  // Messages waiting for this connection's staging quota (see the top of this file).
  size_t deferred() {
    absl::MutexLock lock(&quota_mu_);
    return deferred_.size();
  }

 protected:
  // Decodes `message` into `*incoming` and pairs its payload (true); on a protocol violation
  // closes the connection and returns false (the message and any unpaired payload are given
  // back, and Violation logged why). Not a StatusOr: the message is written in place, and no
  // status is made when there is nothing wrong (every message of every call comes here).
  bool Receive(transport::Connection& connection, const transport::ReceivedMessage& message,
               IncomingMessage* incoming);
  // Receive's refusal: gives back `message` and `bulk`, and Violation.
  void Refuse(transport::Connection& connection, const transport::ReceivedMessage& message,
              const std::optional<transport::ReceivedBulk>& bulk, absl::string_view why);
  // Why a message's payload does not pair with its header (Receive's slow path).
  static absl::Status PairingError(const RpcHeader& header,
                                   const std::optional<transport::ReceivedBulk>& bulk);
  // Closes the connection for breaking the protocol, logging why.
  void Violation(transport::Connection& connection, absl::string_view what);
  // Gives back what arrived with a message nobody will use.
  static void Discard(transport::Connection& connection, const IncomingMessage& message);
  // The same for a message that may pull (a stream's, an answer held behind its stream's pulls):
  // its sender is also told it may stop exposing the payload, which is never read.
  void DiscardUnread(transport::Connection& connection, const IncomingMessage& message) {
    if (message.pulls()) static_cast<void>(SendPulledWord(connection, message));
    Discard(connection, message);
  }
  // Takes from `message` the memory its large body was pulled into (Discard then leaves it):
  // the function returned gives it back, with its share of max_pulled_bytes, from any thread,
  // once. Null when the body lies elsewhere.
  static std::function<void()> TakePulledBody(IncomingMessage& message);
  // Takes from `message` its bulk payload (empty when it has none), for the application: it
  // keeps the connection's memory (or the pulled buffer) until released, from any thread.
  IncomingBulk TakeBulk(transport::Connection& connection, IncomingMessage& message) const;
  // What is wrong with a frame for a stream (null: nothing), before it is read: `stream` false
  // for a unary call's; `bulk_allowed`: the method's messages this way carry bulk payloads,
  // which must come exposed for pulling (rpc/streaming.h, "Bulk payloads"), never written into
  // this side's arena.
  static const char* StreamFrameError(bool stream, bool bulk_allowed, const IncomingMessage& frame);
  // Starts pulling the payload of `message` (message.layout.pulls) into memory this side allocates
  // and registers, within the ReceiveLimits. OK: the message is the pull's now, and OnPulled gets
  // it back, with message.bulk, once the payload has landed (nothing, if the connection fails
  // first: the message is discarded then). An error (the budget, memory, registration, a
  // closed connection): nothing was started, and the caller still owns the message.
  absl::Status StartPull(transport::Connection& connection, const IncomingMessage& message);
  // The same with the bulk payload into the caller's `destination` (registered on this device,
  // large enough; a large body still lands in memory of this side's), with `landing` (if any)
  // held (Begin) until the READs are done or flushed, after which it is Released. `release`
  // (if any) runs once the payload is given back (ReleasePayload), or at once on failure.
  absl::Status StartPullInto(transport::Connection& connection, const IncomingMessage& message,
                             const BulkDestination& destination, std::shared_ptr<BulkGate> landing,
                             std::function<void()> release = nullptr);
  virtual void OnPulled(transport::Connection& connection, IncomingMessage& message) = 0;
  // A client's request payload, behind `gate`, is about to be exposed for the peer to pull:
  // whatever must outlive the call's end for it is set up now. False when the call is ending
  // already (nothing is exposed then).
  virtual bool PrepareExposure(uint64_t /*call_id*/, BulkGate& /*gate*/) { return true; }
  // The peer has pulled the payload a message of call `call_id` exposed at `addr` (kPulled: a
  // response's, or a stream message's): stop exposing it. False when nothing is held there (a
  // peer repeating itself, a closed call, or a client's request, which its call's gate holds).
  bool Unexpose(uint64_t call_id, uint64_t addr);
  // Tells the peer it may stop exposing the payload of `message` (the READ is done, or will
  // never be made): a kPulled, which invalidates the payload's window key when its descriptor
  // says so (kPullWindow). Once per message that pulls: a second would name a dead key, which
  // costs the connection. With every send slot taken, the word waits for the next completion
  // that frees one (OnSendSlotFree) and OK is returned.
  absl::Status SendPulledWord(transport::Connection& connection, const IncomingMessage& message);
  // Sends the pulled words that found no send slot (SendPulledWord), in order, while slots are
  // free: on each completion notice (OnSendSlotFree), and from the owner's timer pass (a slot
  // given back unused raises no notice). Any thread; a load while there are none.
  void SendPulledBacklog(transport::Connection& connection);
  // Gives back a payload still waiting for its message, the messages still deferred and the
  // payloads still exposed (on close): their calls fail with the connection.
  void DropPending(transport::Connection& connection);
  // A deferred message (its header) could not be sent when its turn came: the call must hear.
  virtual void OnDeferredFailed(transport::Connection& connection, const RpcHeader& header,
                                const absl::Status& status) = 0;

 private:
  friend class ReceiveReleaser;
  const char* side_;
  StagingPool& staging_;
  const std::shared_ptr<ReceiveLimits> receive_limits_;
  const std::shared_ptr<transport::Device> device_;
  const std::shared_ptr<transport::Poller> poller_;
  // The payload waiting for its message; only the poller thread touches it.
  std::optional<transport::ReceivedBulk> unpaired_;
  // A message whose payload waits for the staging quota.
  struct Deferred {
    transport::SendBuffer buffer;
    RpcHeader header;
    size_t body_size;
    OutgoingBulk bulk;
    OutgoingBulk large_body;
    absl::Time deadline;
  };
  // Exposes `bulk` for the peer to pull (it is larger than the peer's arena) and sends its
  // message with the descriptor. A client's payload is held by its call's gate until the call
  // ends; a server's until the client says it pulled it (kPulled) or the connection closes.
  absl::Status SendPulled(transport::Connection& connection, const transport::SendBuffer& buffer,
                          RpcHeader header, size_t body_size, OutgoingBulk bulk,
                          OutgoingBulk large_body, absl::Time deadline, BulkGate* gate);
  // The caller's registration of `part` when a window over it opens exactly `part` (memory
  // registered on this device, on a device whose windows bound their range or as a whole); null
  // when the part needs a region of its own.
  const transport::MemoryRegion* WindowRegion(const OutgoingBulk& part) const;
  // Posts `bulk`, which lies in memory registered on this device, straight from the caller's
  // bytes, then its message. Errors as SendMessage's.
  absl::Status SendZeroCopy(transport::Connection& connection, const transport::SendBuffer& buffer,
                            RpcHeader header, size_t body_size, OutgoingBulk bulk,
                            absl::Time deadline, BulkGate* gate);
  // Queues a payload's WRITE (`token` for its OnSendDone) and then its message, together
  // (transport WriteBulkThenSend: nothing comes between them). `*written` false: neither was
  // queued (the caller still owns the buffer and what the token names). Under the send lock,
  // which orders payloads against Withdraw.
  absl::Status WriteThenSendLocked(transport::Connection& connection,
                                   const transport::BulkSource& source, uint64_t token,
                                   const transport::SendBuffer& buffer, size_t body_size,
                                   bool* written) ABSL_EXCLUSIVE_LOCKS_REQUIRED(send_mu_);
  // Stages `large_body` and `bulk` (their quota already taken), one after the other, then
  // posts them and their message. Errors as SendMessage's; the quota is given back on failure.
  absl::Status StageAndSend(transport::Connection& connection, const transport::SendBuffer& buffer,
                            RpcHeader header, size_t body_size, OutgoingBulk bulk,
                            OutgoingBulk large_body, absl::Time deadline);
  // A pulled word (SendPulledWord): its header, and the key it invalidates (0: none).
  struct PulledWord {
    RpcHeader header;
    uint32_t rkey;
  };
  absl::Status SendPulledWordNow(transport::Connection& connection, const PulledWord& word);
  // Whether a payload of call `call_id` is exposed at `addr` now (its peer has not said pulled).
  bool Exposed(uint64_t call_id, const void* addr);
  // Gives `capacity` of staging quota back; true when deferred messages wait for it.
  bool ReturnQuota(size_t capacity);
  // Tells the streams waiting for quota (TakeQuotaOrWait) that some came back.
  void WakeQuotaWaiters();
  // Sends the deferred messages whose payloads fit the quota now, in order.
  void SendDeferred(transport::Connection& connection);

  absl::Mutex send_mu_;
  absl::Mutex quota_mu_;
  absl::CondVar quota_freed_;  // stream messages waiting for the quota (SendStreamMessage)
  size_t staged_ ABSL_GUARDED_BY(quota_mu_) = 0;  // staging capacity held by this connection
  std::deque<Deferred> deferred_ ABSL_GUARDED_BY(quota_mu_);
  StreamWaiters quota_waiters_ ABSL_GUARDED_BY(quota_mu_);
  // Pumps waiting for a send slot (WaitForSendSlot).
  absl::Mutex slot_waiters_mu_;
  StreamWaiters slot_waiters_ ABSL_GUARDED_BY(slot_waiters_mu_);
  std::atomic<bool> slot_waiters_pending_{false};
  // Pulled words waiting for a send slot (SendPulledWord), and whether there are any.
  absl::Mutex pulled_mu_;
  std::deque<PulledWord> pulled_backlog_ ABSL_GUARDED_BY(pulled_mu_);
  std::atomic<bool> pulled_backlog_pending_{false};
  std::atomic<uint64_t> violations_{0};
  mutable absl::Mutex error_mu_;
  LastError last_error_ ABSL_GUARDED_BY(error_mu_);
  std::atomic<bool> warned_foreign_{false};
  std::atomic<uint32_t> pulling_{0};        // READs of pulled payloads under way
  std::atomic<uint32_t> exposed_count_{0};  // payloads exposed for the peer to pull
  // Payloads exposed for the peer to pull that no call's gate holds (a server's responses, both
  // sides' stream messages), by call id and the address their descriptor named: a stream may
  // have several exposed at once.
  absl::Mutex exposed_mu_;
  absl::flat_hash_map<std::pair<uint64_t, uint64_t>, ExposureHold> exposed_
      ABSL_GUARDED_BY(exposed_mu_);
  // Set by DropPending: the connection closed, and nothing is kept here any more (a hold kept
  // after that would outlive the transport connection it ends its exposure on).
  bool exposed_closed_ ABSL_GUARDED_BY(exposed_mu_) = false;
};

}  // namespace zrpc::internal

#endif  // ZRPC_RPC_CONNECTION_RPC_CONNECTION_H_
