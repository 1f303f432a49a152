// SharedReceiveQueue: one receive queue for every connection of a poller (PollerOptions::
// shared_receive_queue), so that an idle connection keeps no receive of its own posted.
//
// Why. Without it each connection posts its whole receive window (32 pool slots of 4 KiB by
// default) for its lifetime, and a thousand idle connections pin 132 MiB for messages that do not
// come. SPDK, the Linux NVMe-oF target and Ceph's RDMA messenger share one receive queue among
// many connections the same way.
//
// Buffers. The queue has `size` entries, each posted with a pool slot (the device's SlotPool, so
// a received message is in a slot as it is without the queue). A receive completion hands its
// slot to the connection it arrived on, which keeps it as long as the message is held (a
// request held until its handler finishes) and gives it back to the pool on Release; the entry
// is posted again at once with a fresh slot (Take chains it, Post posts the pass's chain before
// the batch is dispatched), so a held message never starves the queue (SPDK #2180 was that bug).
// The queue thus always has `size` receives posted, apart from those completed in the pass being
// handled and entries waiting for a slot when the pool is exhausted (Refill).
//
// Credits. A connection still grants its peer a window of receives (credits.h); with the queue
// those receives are the queue's: each window is a claim on the queue's budget (receive_budget.h),
// a floor taken at admission (ConnectionOptions::idle_recv_credits) from the three quarters of the
// queue that back floors, and more from the other quarter while the peer uses it, and the claims
// never sum to more than `size`. Every grant is then backed by a posted
// receive, so a peer that keeps to its credits never meets receiver-not-ready. One that overruns
// them is cut off at its first excess message (CreditAccount::OnConsumed; before the handshake has
// ended, at the first past its window), but until its poller has seen that message, the messages it
// sent on take receives of the queue that other connections' peers may then find missing for a
// moment: they meet receiver-not-ready and retry, kRnrRetryCount times (cm_util.h), while the
// poller posts the queue full again; a connection whose retries run out fails.
//
// Teardown. A queue pair attached to the queue owns no receive: when it fails, nothing of the
// queue is flushed or lost, and a completion of its that the poller meets after the connection
// has gone gives its slot back to the pool (Poller::PollCq). An open connection that fails is
// destroyed only after its drain marker came back flushed, behind the completions of the
// messages it had received, and, on a device that raises it (Device::awaits_last_wqe: the
// specification asks it of every device with shared receive queues; rxe never raises it,
// tools/probes/srq_mw_probe.c), after the device's last-WQE-reached event for the queue pair:
// after it no receive of the queue can complete for that queue pair, and the poller polls its
// completion queue empty before passing the event on (Poller::RunQueuedEvents), so every
// completion of the queue pair's has been handled when it is destroyed. Without that, a receive
// the peer had begun to fill (a message of several packets) could complete after the marker, and
// a device that drops a destroyed queue pair's unpolled completions and takes their receives back
// (mlx5 does) would leave the entry counted as posted until the poller goes: the queue would back
// one window's receive fewer than it says. A device that never raises the event costs each
// closing connection the drain's give-up (Poller::kDrainGiveUp, 3 s, with a warning).
// tests/transport/last_wqe_fake_test holds the wait (fakeverbs raises the event). A handshake
// that fails (Listener::Abandon, a client's Connect) still destroys its queue pair at once, with
// the same risk for a receive in progress then.
//
// Low water. A poller that falls behind its arrivals (a long handler, a pass over a large batch)
// or a pool run dry leaves the device fewer posted receives than the windows granted, and peers
// then meet receiver-not-ready. The device can say when the queue falls below a mark
// (PollerOptions::shared_receive_low_water, an eighth of the queue by default): the report
// comes on the device's event thread (async_events.h) and is counted there at once. From the
// loop's next pass the budget is low until every entry is posted again and the completion queue
// drained, when the report is armed anew (it fires once per arming): windows grow no more and
// shrink to their floors meanwhile, so that the peers' claims come back toward what the queue
// can hold. That holds for as long as the pool stays dry, or the loop keeps finding full
// batches; a loop that was only held up for a moment re-arms on its first pass.
//
// Pool. The queue's receives are taken again from the device's slot pool as messages arrive;
// held messages and outgoing messages take from it too. When the pool is exhausted (at
// SlotPoolOptions::max_slots) the queue waits, short, for slots to come back (Refill tries
// again every 100 us at most, and an event-mode poller sleeps at most a millisecond meanwhile),
// and peers may meet receiver-not-ready meanwhile (and fail, past their RNR retries): with
// receives per connection the same shortage refused connections at their handshake instead.
// Size max_slots for the queues, the windows held and the sends (max_send_slots per connection).
//
// Threads: the thread running the poller's passes only (its loop, or RunOnce's caller once the
// loop has stopped), after creation; budget() from any thread.
#ifndef ZRPC_TRANSPORT_SHARED_RECEIVE_QUEUE_H_
#define ZRPC_TRANSPORT_SHARED_RECEIVE_QUEUE_H_

#include <infiniband/verbs.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "transport/async_events.h"
#include "transport/device.h"
#include "transport/receive_budget.h"
#include "transport/slot_pool.h"
#include "transport/verbs_owners.h"

namespace zrpc::transport {

class SharedReceiveQueue {
 public:
  // Creates the queue with `size` entries (at most the device's max_srq_wr) and posts them all.
  // kFailedPrecondition when the device has no shared receive queues; kResourceExhausted when
  // the pool cannot fill it. With `low_water` (below `size`) and a `sink` for its events, the
  // device is asked to report the queue's falling below that many posted receives (see
  // "Low water" above); a device that cannot is said so once and the queue works without.
  static absl::StatusOr<std::unique_ptr<SharedReceiveQueue>> Create(
      Device& device, uint32_t size, uint32_t low_water = 0, DeviceEventSink* sink = nullptr);
  // Every queue pair attached to it must be destroyed first. Gives the posted slots back (or,
  // when the device refuses to destroy the queue because a queue pair is still attached, leaves
  // them to it, with a warning: a slot the device may still write into is never reused).
  ~SharedReceiveQueue();
  SharedReceiveQueue(const SharedReceiveQueue&) = delete;
  SharedReceiveQueue& operator=(const SharedReceiveQueue&) = delete;

  ibv_srq* srq() const { return srq_.get(); }
  uint32_t size() const { return size_; }

  // ---- The poller's loop.
  // A completion of entry `entry` (its wr_id's index): returns the slot it held, which the
  // caller now owns, and chains the entry again with a fresh slot from `cache` for Post. When
  // the pool has none, the entry waits for Refill.
  // kNoSlot for an entry that is not posted (a device reporting a receive twice, or one it was
  // never given): nothing changes.
  uint32_t Take(uint32_t entry, SlotCache& cache) {
    if (entry >= size_ || slots_[entry] == SlotPool::kNoSlot) return SlotPool::kNoSlot;
    const uint32_t slot = slots_[entry];
    // Once the pool has run short, entries wait for Refill's next try, not one per completion.
    const uint32_t fresh = unposted_.empty() ? cache.Allocate() : SlotPool::kNoSlot;
    if (fresh == SlotPool::kNoSlot) {
      slots_[entry] = SlotPool::kNoSlot;
      unposted_.push_back(entry);
    } else {
      Chain(entry, fresh);
    }
    return slot;
  }
  // Posts what Take chained, in one ibv_post_srq_recv. Cheap when nothing is chained.
  void Post(SlotCache& cache) {
    if (chain_head_ != nullptr) PostChain(cache);
  }
  // Chains and posts the entries Take left without a slot, as slots come back: at most every
  // 100 us while any waits (an exhausted pool's allocation takes its lock). Cheap when none
  // waits.
  void Refill(SlotCache& cache) {
    if (!unposted_.empty()) RefillSlow(cache);
  }
  // Entries posted now, and whether any waits for a slot (Refill has work).
  uint32_t posted() const { return size_ - static_cast<uint32_t>(unposted_.size()); }
  bool short_of_slots() const { return !unposted_.empty(); }
  // Refills that found the pool empty for at least one entry.
  uint64_t starved() const { return starved_; }

  // ---- Low water (see above).
  // The device reported the queue below its mark (the loop, once its poller's DeviceEventSink
  // counted the report): the budget is low until Rearm.
  void OnLowReported() { budget_.SetDeviceLow(true); }
  // Arms the device's report again and ends the budget's low (the loop's thread).
  void Rearm();
  uint32_t low_water() const { return armed_ ? low_water_ : 0; }

  // The queue's receives as credits its connections' windows claim (any thread).
  ReceiveBudget& budget() { return budget_; }
  const ReceiveBudget& budget() const { return budget_; }

 private:
  SharedReceiveQueue(SlotPool& pool, uint32_t size) : pool_(pool), size_(size), budget_(size) {}
  // Asks the device for the low-water report (ibv_modify_srq, IBV_SRQ_LIMIT): it fires once.
  bool Arm();
  // Entry `entry` holds `slot` from now on, and goes in the chain Post posts.
  void Chain(uint32_t entry, uint32_t slot) {
    slots_[entry] = slot;
    sges_[entry].addr = reinterpret_cast<uintptr_t>(pool_.data(slot));
    sges_[entry].lkey = pool_.lkey(slot);
    ibv_recv_wr* wr = &wrs_[entry];
    wr->next = nullptr;
    if (chain_head_ == nullptr) {
      chain_head_ = wr;
    } else {
      chain_tail_->next = wr;
    }
    chain_tail_ = wr;
  }
  void PostChain(SlotCache& cache);
  void RefillSlow(SlotCache& cache);

  SlotPool& pool_;
  const uint32_t size_;
  std::vector<uint32_t> slots_;  // entry -> its slot (kNoSlot: waiting in unposted_)
  // Entry i's work request and scatter entry, filled once but for the slot (Chain).
  std::vector<ibv_recv_wr> wrs_;
  std::vector<ibv_sge> sges_;
  ibv_recv_wr* chain_head_ = nullptr;  // what Take chained for Post
  ibv_recv_wr* chain_tail_ = nullptr;
  std::vector<uint32_t> unposted_;  // entries the pool had no slot for
  uint64_t starved_ = 0;
  int64_t retry_at_ns_ = 0;  // RefillSlow's next try after it found the pool empty
  ReceiveBudget budget_;
  uint32_t low_water_ = 0;
  bool armed_ = false;  // the device took the mark
  SrqOwner srq_;
};

}  // namespace zrpc::transport

#endif  // ZRPC_TRANSPORT_SHARED_RECEIVE_QUEUE_H_
