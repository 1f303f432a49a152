// Poller: one completion queue, the connections that share it, and the loop that drives them.
//
// Every connection is created on a Poller; its queue pair sends and receives completions to the
// poller's CQ and its rdma_cm events to the poller's event channel. The loop, run on a thread of
// its own by Start() or driven by the caller through RunOnce(), reads completions in batches and
// hands each to its connection (found by QP number), which turns it into handler calls: message
// received, bulk payload arrived, send done, closed. It reads the cm channel too, so a peer's
// disconnect reaches its connection without any traffic.
//
// The loop, one pass: poll the CQ; then, in event mode only, once the CQ has been empty for its
// spin budget since the last completion, arm the CQ, poll once more (a completion may have
// slipped in before arming), and sleep in poll(2) on the completion channel and a wake-up
// eventfd. A wake-up costs three system calls: the arm, the poll, one read of the completion
// event. The budget is learned (adaptive_spin.h): about twice the recent idle stretches between
// completions while they end within `spin`, none once they do not.
//
// The cm channel has a thread of its own while the loop runs (Start): it sleeps in poll(2) on
// the channel and queues each event (a disconnect, a device removal) for the loop, which applies
// it after its next look at the CQ, so that a failed completion's reason comes before the
// disconnect that follows it. Reading an empty channel costs a malloc and a failing write(2)
// in librdmacm, so the loop never looks: with nothing happening a busy loop makes no system call
// and no allocation. RunOnce, with no such thread, reads the channel itself on every pass.
//  - kBusy spins: lowest latency, one core at 100% even when idle. For benchmark servers and
//    latency-critical clients; one poller per core.
//  - kEvent sleeps when idle and wakes on the completion interrupt: an idle process uses no
//    CPU; each wake-up costs a few microseconds on hardware (brpc grew a polling mode because
//    interrupt-only completions gave TCP-like latency: see rdma-pitfalls.md). So after each
//    burst of completions it polls for its budget (at most `spin`, 50 us by default) before
//    sleeping: traffic that keeps coming within that is served at busy-polling latency, and
//    sparser traffic or none meets a poller that sleeps at once.
//
// Capacity. A CQ that overflows breaks every QP on it, so every completion that may be
// outstanding has an entry (completion_budget.h). A connection reserves, while it is registered,
// only what it may complete while idle (its drain marker, and its own receives unless the poller
// has a shared receive queue, whose receives the poller reserves once), and registration fails
// (kResourceExhausted) when the CQ cannot take that beside the others. Its sends take entries as
// they go: a grant, grown kCqGrantChunk at a time up to its send queue's depth and kept while it
// is used, so a busy connection takes nothing per work request. When the entries run out, a
// connection that needs more waits (its operations stay queued, as for credits) and the loop
// asks the connections holding grants to give back what they do not use: each keeps whole
// grants over its work requests in flight, gives back the rest at once and all of it once it has
// nothing in flight (a tail left unsignalled is flushed first), and does not grow while others
// wait; then the waiters are pumped again. So idle connections hold no entries for sends, and a
// poller holds thousands of them. A connection busy without a pause keeps a grant (16 at least)
// for as long as it is: busy connections whose grants cover the queue's unreserved entries hold
// off the others until one pauses. With a shared
// receive queue (PollerOptions::shared_receive_queue, shared_receive_queue.h) registration fails
// too when the connection's receive window would take the windows granted past the queue's
// receives.
//
// Threads. One thread runs the loop (Start or RunOnce, never both). Connect, the Listener and
// Connection methods may be called from any thread. The Poller must outlive its connections and
// be destroyed before its Device; destroying it (or Shutdown) stops the loop and closes what is
// still open, driving the drains for up to 5 s so handlers hear of it (a connection that has not
// drained by then is dropped without its OnSendDone/OnClosed, and a warning says so:
// transport/log.h).
#ifndef ZRPC_TRANSPORT_POLLER_H_
#define ZRPC_TRANSPORT_POLLER_H_

#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/optimization.h"
#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "transport/arena_pool.h"
#include "transport/completion_budget.h"
#include "transport/device.h"
#include "transport/options.h"
#include "transport/park_doors.h"
#include "transport/shared_receive_queue.h"
#include "transport/slot_pool.h"
#include "transport/verbs_owners.h"

namespace zrpc::transport {

class Connection;

// OK when `spin` is within PollerOptions::spin's bounds, [0, 1s]; otherwise kInvalidArgument
// naming `option` (the caller's name for it: "ChannelOptions::spin").
absl::Status CheckSpin(absl::Duration spin, absl::string_view option);

class Poller {
 public:
  // How long a failed connection may wait for its queues to come back flushed before the
  // poller's watchdog gives up on them (Connection::GiveUpOnDrain).
  static constexpr absl::Duration kDrainGiveUp = absl::Seconds(3);

  static absl::StatusOr<std::unique_ptr<Poller>> Create(Device& device,
                                                        const PollerOptions& options = {});
  ~Poller();
  Poller(const Poller&) = delete;
  Poller& operator=(const Poller&) = delete;

  // Runs the loop on a new thread until Stop() or destruction.
  absl::Status Start();
  void Stop();
  // Stops the loop and closes what is still registered, driving the drains for up to 5 s, as
  // destruction does; idempotent. For an owner whose users may keep the Poller object (and its
  // CQ, which a connection's queue pair needs until it is destroyed) alive a while longer: a
  // received payload still held by the application, say.
  void Shutdown();

  // One pass of the loop on the caller's thread, for programs that drive it themselves; in event
  // mode it sleeps up to `wait` when there is nothing to do. Returns the completions handled.
  int RunOnce(absl::Duration wait);

  PollMode mode() const { return options_.mode; }
  // Entries of its completion queue (cq_size capped at the device's maximum): what bounds the
  // connections it can serve (CqEntriesReservedFor each) and the sends in flight on them.
  int cq_capacity() const { return cq_capacity_; }
  // Entries of its completion queue neither reserved by its connections (nor its shared receive
  // queue) nor granted to their sends now: a moment's figure, for tests and diagnostics.
  int64_t cq_entries_free() const { return cq_budget_.free(); }
  // Times a connection found no entry for its next send and waited for one (any thread).
  uint64_t cq_waits() const { return cq_waits_.load(std::memory_order_relaxed); }
  // Receives its shared receive queue holds (PollerOptions::shared_receive_queue), or 0: none.
  uint32_t shared_receives() const { return srq_ != nullptr ? srq_->size() : 0; }
  // The arenas it lends (PollerOptions::arena_pool_pieces), or null: none asked for, or a device
  // without type-2 memory windows.
  ArenaPool* arena_pool() const { return arena_pool_.get(); }
  // Times a connection found no piece of that pool to lend and waited for one.
  uint64_t arena_waits() const { return arena_waits_.load(std::memory_order_relaxed); }
  // Parked windows (PollerOptions::park_windows): parked now, knocks heard, and knocks whose door
  // held another token than its connection's (a peer writing doors not its own: park_doors.h).
  // A window stays parked from its park until a floor opens it, through the moment between its
  // knock being heard and a floor being free. (Counted when asked, under the poller's lock: for
  // stats and tests, not the hot path.)
  uint32_t parked_windows() const;
  uint64_t knocks_heard() const { return knocks_heard_.load(std::memory_order_relaxed); }
  uint64_t foreign_knocks() const { return foreign_knocks_.load(std::memory_order_relaxed); }
  // Connections with `options` it can hold at once: what its completion queue can take, and,
  // with a shared receive queue, the floors that queue backs (unless windows park: then the
  // completion queue alone).
  uint64_t Capacity(const ConnectionOptions& options) const;
  // Whether a connection with `options` would be registered now: its completion-queue entries
  // and, with a shared receive queue, its floor are free (a poller that parks registers it
  // without a floor too, parked, but says no here: a server places it where a floor is free, or
  // starts a poller, before it parks it). A hint for placing one (a server adds a
  // poller when none has room): Register decides, and connections placed meanwhile may take the
  // room first.
  bool HasRoomFor(const ConnectionOptions& options);
  // Whether the calling thread is running a poller's loop (or RunOnce) now: handlers and the
  // callbacks they run are. Code that would wait for something only a poller can produce (a
  // send slot, a completion) must not wait there: it would wait for itself.
  static bool OnPollerThread();
  // Whether its loop has ended (Shutdown): nothing deferred to it runs any more. Any thread.
  bool loop_ended() const { return ended_.load(std::memory_order_acquire); }
  // The poller whose loop (or RunOnce) the calling thread is running now, or null.
  static Poller* Current();
  // The completion batch the calling thread is handing to its connections: a number that
  // changes with every batch a poller's pass reads (on this thread), and 0 outside one (another
  // thread, or a poller between batches: deferred tasks, cm events). What the handlers compute
  // once per batch they may key on it; the RPC layer reads the clock once per batch this way
  // (rpc/common/call_clock.h).
  static uint64_t CurrentBatch();
  // Returns true once the loop has run a whole pass that began after this call (woken as
  // needed): then every report that pass's predecessors were making (an OnClosed, a deferred
  // task) is over. What a user of a shared poller waits for before it frees what its
  // connections' handlers use. False when the loop is not running (manual, stopped), when called
  // on the loop's own thread, or after `timeout`.
  bool AwaitPass(absl::Duration timeout);
  // Passes of the loop, and (event mode) times it woke from sleep: how tests see it sleeping.
  uint64_t passes() const { return passes_.load(std::memory_order_relaxed); }
  uint64_t wakeups() const { return wakeups_.load(std::memory_order_relaxed); }
  // With a shared receive queue: its receives posted now (the queue's size but for a moment
  // after completions, or while the slot pool is exhausted); 0 without one. Any thread.
  uint32_t shared_receives_posted() const { return shared_posted_.load(std::memory_order_relaxed); }
  // With a shared receive queue: its receives its connections' windows claim now (their floors
  // and what they grew by: receive_budget.h), never more than its size; 0 without one.
  uint32_t shared_receives_claimed() const;
  // Event mode: how long the loop polled, or will poll, in its latest idle stretch before
  // sleeping (adaptive_spin.h; at most PollerOptions::spin, zero while traffic is sparser than
  // it). Zero in busy mode and before the first idle stretch.
  absl::Duration spin_budget() const {
    return absl::Nanoseconds(spin_budget_ns_.load(std::memory_order_relaxed));
  }

  // Where the device's reports of this poller's queues go (async_events.h): a queue pair's error
  // fails its connection on the loop's next pass; the shared receive queue's low water holds
  // windows to their floors until the loop has posted it full again (shared_receive_queue.h).
  DeviceEventSink* device_events() { return &events_; }
  // The low-water reports of the shared receive queue so far (0 without one).
  uint64_t shared_queue_low_reports() const { return events_.shared_queue_low_reports(); }
  // Whether the last report holds still (the queue is not posted full again since), and the mark
  // the device reports at (0: none; PollerOptions::shared_receive_low_water).
  bool shared_queue_low() const { return srq_ != nullptr && srq_->budget().device_low(); }
  uint32_t shared_queue_low_water() const { return srq_ != nullptr ? srq_->low_water() : 0; }

 private:
  friend class Connection;
  friend class Listener;

  Poller(const PollerOptions& options, SlotPool& slots) : options_(options), slot_cache_(slots) {}
  // Free slots of the device's pool for the loop's thread alone (slot_pool.h, "Caches"): its
  // connections' messages built in a batch, and the slots their completed sends free, take and
  // give them without an atomic instruction (Connection::AcquireSendBuffer). Flushed by Shutdown.
  SlotCache& slot_cache() { return slot_cache_; }
  absl::Status Register(const std::shared_ptr<Connection>& connection);
  void Unregister(uint32_t qp_num);
  // Gives back what Register reserved for `connection`, and what its sends hold: its CQ entries
  // and its window of the shared receive queue.
  void UnreserveLocked(Connection& connection) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // CQ entries for a connection's sends (completion_budget.h): Take from any thread inside the
  // connection's domain; a connection that got none waits (WaitForCqEntries) until the loop
  // hands it a pass (ServeCqShortage).
  bool TakeCqEntries(uint32_t n) { return cq_budget_.Take(n); }
  void GiveCqEntries(uint32_t n) { cq_budget_.Give(n); }
  void WaitForCqEntries(std::shared_ptr<Connection> connection);
  // Whether a connection waits for entries now: one with a grant and nothing in flight gives it
  // back then (a load; any thread).
  bool cq_short() const { return cq_short_.load(std::memory_order_relaxed); }
  // Has the loop ask for grants back soon (a registration that found the entries granted).
  void RequestCqEntries();
  // The loop's side of a shortage, at most once a millisecond: asks every connection holding a
  // grant to give back what it does not use (all of it once idle) and gives each waiter a pass,
  // which pumps it.
  void ServeCqShortage();
  // Asks the connections holding grants to give back what they do not use (AskForCqEntries).
  void AskCqHolders();
  // The loop's side of WaitForArena.
  void ServeArenaShortage();
  // Has the loop call connection->ReplayEarly() on its thread soon: completions that came before
  // the handshake ended, and events and tasks another thread left in the connection's domain.
  // False once the loop has ended (Shutdown): nothing will run it.
  bool Defer(std::shared_ptr<Connection> connection);
  void RunDeferred();
  std::shared_ptr<Connection> Find(uint32_t qp_num);
  // Find for the loop's thread, through found_: no lock and no reference count while no
  // connection came or went. The connection stays alive until the pass ends (retired_).
  Connection* FindFromLoop(uint32_t qp_num);
  ibv_cq* cq() const { return cq_.get(); }
  // The shared receive queue (PollerOptions::shared_receive_queue), or null.
  SharedReceiveQueue* srq() const { return srq_.get(); }
  // A connection found no piece to lend (Connection::TryLendLocked): the loop asks the holders to
  // give back loans idle since its last look, and gives the waiters another try (AskForArena),
  // at most once a millisecond while any waits.
  void WaitForArena(std::shared_ptr<Connection> connection);
  // A loan's piece goes back, its window gone; waiters get their try.
  void GiveArenaPiece(uint32_t piece);

  // Parked windows (PollerOptions::park_windows; credits.h, "Parked windows"). The doors, or null
  // when this poller does not park.
  ParkDoors* doors() const { return doors_.get(); }
  // The loop watches a parked window's door from now on, until it changes from its armed value
  // (a knock: Connection::KnockHeard) or the connection unregisters.
  void WatchDoor(uint32_t qp_num, uint32_t door, uint32_t token);
  // A parked window whose peer knocked found no floor free: the loop gives it another try when
  // one comes back (FloorGivenBack) and, while it waits, asks the windows not parked to park
  // when idle (AskForPark), every 10 ms.
  void WaitForFloor(std::shared_ptr<Connection> connection);
  void FloorGivenBack();
  // The loop's side of both, at most once a millisecond while a window is parked or waits.
  void ServeParking();
  bool ParkingDue() const {
    return doors_watched_.load(std::memory_order_relaxed) > 0 ||
           floor_short_.load(std::memory_order_relaxed);
  }

  rdma_event_channel* cm_channel() const { return cm_channel_.get(); }

  // Connections whose completions waited because another thread held their domain for a
  // moment (Connection::OnCompletions): tried again on every pass. False when none is left.
  bool RetryStashed();
  // Gives back the slots of the shared queue's receives among `wcs`, completions that will not be
  // handled: each carries a slot the queue handed on (TakeSharedReceives), which nobody else
  // frees.
  void FreeSharedReceiveSlots(absl::Span<const ibv_wc> wcs);
  // Forgets a stashed connection's completions, unhandled, and its place in the list (the
  // caller's to remove): for a connection gone, once the loop has ended.
  void DropStash(Connection& connection);

  void Loop();
  // The cm thread's loop: sleeps in poll(2) on the cm channel, handles its events as they come.
  void CmLoop();
  int PollCq();
  // The shared receive queue's completions among `wcs`: each takes its entry's slot (its wr_id
  // then names the slot, work_request_id.h), and the entries are posted again with fresh slots,
  // with any the pool left short before (every pass, so a queue short of slots fills up again).
  void TakeSharedReceives(ibv_wc* wcs, int n);
  // Reads the cm channel until it is empty. Each event goes to its connection at once, or with
  // `queue` (the cm thread) to cm_events_ for the loop, which is woken.
  void HandleCmEvents(bool queue);
  // The loop's side, after a look at the CQ that found `polled` completions: applies the events
  // the cm thread queued and the device's (events_). One load on every pass; the rest apart, so
  // that the pass pays for no stack frame (RunQueuedEvents saves six registers).
  void RunCmEvents(int polled) {
    if (ABSL_PREDICT_FALSE(events_.pending.load(std::memory_order_acquire))) {
      RunQueuedEvents(polled);
    }
  }
  void RunQueuedEvents(int polled);
  // Event mode: arms the CQ and sleeps until an event or `timeout_ms` (-1: forever); with
  // `with_cm` (RunOnce: no cm thread) it also wakes for, and handles, cm events. True when the
  // look after arming found completions (and handled them) instead of sleeping.
  bool ArmAndWait(int timeout_ms, bool with_cm);
  void Wake();
  void WakeCm();
  // The drain watchdog (cm thread, and Shutdown): a connection that failed kDrainGiveUp ago and
  // still waits for its queues to come back flushed is given up on (Connection::GiveUpOnDrain).
  // Looks at most once a second, and only while some connection drains (draining_).
  void WatchDrains();
  // Has the cm channel read now: after rdma_migrate_id, whose events moved to the channel
  // without making it readable (a peer that hung up at once).
  void LookAtCmChannel();

  // First: every queue that names it (qp_context, srq_context) is destroyed before it.
  DeviceEventSink events_;
  const PollerOptions options_;
  SlotCache slot_cache_;  // the loop's thread only
  // Created in this order, destroyed in reverse.
  CompChannelOwner comp_channel_;  // event mode only
  CqOwner cq_;
  std::unique_ptr<SharedReceiveQueue> srq_;  // receives: taken and refilled by the loop only
  std::unique_ptr<ArenaPool> arena_pool_;
  std::unique_ptr<ParkDoors> doors_;
  CmChannelOwner cm_channel_;
  int cm_wake_fd_ = -1;  // Stop() wakes the cm thread through it
  // Connections draining (Connection::FailLocked to FinishDrainLocked): while there are any, the
  // cm thread wakes every second to watch them (WatchDrains).
  std::atomic<int> draining_{0};
  absl::Mutex drain_watch_mu_;  // one WatchDrains at a time
  // SteadyNanos (steady_clock.h): a step of the wall clock must not hold the watchdog back.
  int64_t next_drain_watch_ns_ ABSL_GUARDED_BY(drain_watch_mu_) = 0;
  unsigned unacked_cq_events_ = 0;

  mutable absl::Mutex mu_;
  absl::flat_hash_map<uint32_t, std::shared_ptr<Connection>> connections_ ABSL_GUARDED_BY(mu_);
  // Reservations under mu_, grants from any thread (completion_budget.h).
  CompletionBudget cq_budget_;
  std::vector<std::shared_ptr<Connection>> cq_waiters_ ABSL_GUARDED_BY(mu_);
  std::atomic<bool> cq_short_{false};
  std::atomic<uint64_t> cq_waits_{0};
  int64_t cq_served_ns_ = 0;  // the loop's: when ServeCqShortage last asked
  std::vector<std::shared_ptr<Connection>> arena_waiters_ ABSL_GUARDED_BY(mu_);
  std::atomic<bool> arena_short_{false};
  std::atomic<uint64_t> arena_waits_{0};
  int64_t arena_served_ns_ = 0;         // the loop's: when ServeArenaShortage last ran
  int64_t arena_holders_asked_ns_ = 0;  // and when it last asked the holders
  // Parked windows: the doors watched (by door: its connection and token), and the windows
  // waiting for a floor.
  struct DoorWatch {
    uint32_t qp_num = 0;
    uint32_t token = 0;
  };
  absl::flat_hash_map<uint32_t, DoorWatch> watched_doors_ ABSL_GUARDED_BY(mu_);
  std::vector<std::shared_ptr<Connection>> floor_waiters_ ABSL_GUARDED_BY(mu_);
  std::atomic<uint32_t> doors_watched_{0};  // watched_doors_.size(), read without the lock
  std::atomic<bool> floor_short_{false};
  std::atomic<uint64_t> knocks_heard_{0};
  std::atomic<uint64_t> foreign_knocks_{0};
  int64_t park_served_ns_ = 0;         // the loop's: when ServeParking last ran
  int64_t park_holders_asked_ns_ = 0;  // and when it last asked windows to park
  std::vector<std::shared_ptr<Connection>> deferred_ ABSL_GUARDED_BY(mu_);
  // The references connections_ held to connections since unregistered. A pass of the loop may
  // be using any of them by plain pointer (FindFromLoop), so they are dropped only between
  // passes, by the loop's thread (ReleaseRetired), and by Shutdown once the loop has ended; after
  // that (loop_ended_) Unregister drops its reference at once. So a connection whose owners let
  // go during a pass is destroyed by its poller, never under a pass that uses it.
  std::vector<std::shared_ptr<Connection>> retired_ ABSL_GUARDED_BY(mu_);
  bool loop_ended_ ABSL_GUARDED_BY(mu_) = false;
  std::atomic<bool> ended_{false};  // loop_ended_, for any thread (loop_ended())
  std::atomic<bool> has_retired_{false};
  void ReleaseRetired();
  // Bumped (under mu_) whenever connections_ changes.
  std::atomic<uint64_t> generation_{0};
  // The loop thread's cache of lookups (FindFromLoop), direct-mapped by QP number: an entry
  // counts while generation_ has not moved since it was filled, that is while the connection is
  // still in connections_, which holds it. A plain pointer, so that a lookup touches no
  // reference count: what keeps the connection alive for the rest of a pass that found it is
  // retired_ below.
  struct CachedConnection {
    uint32_t qp_num = 0;
    uint64_t generation = ~uint64_t{0};
    Connection* connection = nullptr;
  };
  static constexpr uint32_t kFoundCache = 16;
  CachedConnection found_[kFoundCache];
  std::atomic<bool> has_deferred_{false};
  // Connections with stashed completions (Connection::OnCompletions), the loop's thread only.
  std::vector<std::shared_ptr<Connection>> stashed_;
  std::vector<std::pair<uint32_t, rdma_cm_event_type>> cm_events_ ABSL_GUARDED_BY(mu_);
  uint64_t low_reports_seen_ = 0;  // the loop's: the shared queue's reports it has applied
  int cq_capacity_ = 0;

  std::thread thread_;
  std::thread cm_thread_;  // runs CmLoop while the loop runs on thread_
  std::atomic<bool> stop_{false};
  std::atomic<bool> looping_{false};  // between Start and Stop: a loop serves shortages
  // Written by the loop's thread only (the one thread that runs passes), read by any: a load and
  // a store, not a read-modify-write, which would be an atomic instruction on every pass.
  void CountPass() {
    passes_.store(passes_.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
  }
  std::atomic<uint64_t> passes_{0};
  std::atomic<uint64_t> wakeups_{0};        // likewise the loop's only
  std::atomic<int64_t> spin_budget_ns_{0};  // written by the loop only: spin_budget()
  std::atomic<uint32_t> shared_posted_{0};  // likewise: shared_receives_posted()
};

}  // namespace zrpc::transport

#endif  // ZRPC_TRANSPORT_POLLER_H_
