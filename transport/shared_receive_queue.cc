// SharedReceiveQueue: a poller's receive queue, shared by its connections.

#include "transport/shared_receive_queue.h"

#include <cerrno>

#include "absl/strings/str_cat.h"
#include "transport/log.h"
#include "transport/steady_clock.h"
#include "transport/verbs_error.h"
#include "transport/work_request_id.h"

namespace zrpc::transport {

absl::StatusOr<std::unique_ptr<SharedReceiveQueue>> SharedReceiveQueue::Create(
    Device& device, uint32_t size, uint32_t low_water, DeviceEventSink* sink) {
  const ibv_device_attr& attr = device.attr();
  if (attr.max_srq <= 0 || attr.max_srq_wr <= 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("device ", device.selection().device,
                     " has no shared receive queues (PollerOptions::shared_receive_queue)"));
  }
  if (size == 0 || size > static_cast<uint32_t>(attr.max_srq_wr)) {
    return absl::InvalidArgumentError(absl::StrCat("PollerOptions::shared_receive_queue is ", size,
                                                   "; device ", device.selection().device,
                                                   " takes 1 to ", attr.max_srq_wr, " receives"));
  }
  std::unique_ptr<SharedReceiveQueue> queue(new SharedReceiveQueue(device.slots(), size));
  ibv_srq_init_attr init{};
  init.attr.max_wr = size;
  init.attr.max_sge = 1;
  init.srq_context = sink;
  queue->srq_.reset(ibv_create_srq(device.pd(), &init));
  if (queue->srq_ == nullptr) return VerbsError("ibv_create_srq", errno);
  queue->slots_.assign(size, SlotPool::kNoSlot);
  queue->wrs_.resize(size);
  queue->sges_.resize(size);
  for (uint32_t entry = 0; entry < size; ++entry) {
    queue->sges_[entry].length = static_cast<uint32_t>(device.slots().slot_size());
    queue->wrs_[entry].wr_id = kRecvBit | kSharedBit | entry;
    queue->wrs_[entry].sg_list = &queue->sges_[entry];
    queue->wrs_[entry].num_sge = 1;
  }
  queue->unposted_.reserve(size);
  for (uint32_t entry = size; entry-- > 0;) queue->unposted_.push_back(entry);
  // Filled from the pool itself: no poller loop runs yet.
  SlotCache cache(device.slots());
  queue->RefillSlow(cache);
  cache.Flush();
  if (!queue->unposted_.empty()) {
    return device.slots().ExhaustedError(
        absl::StrCat("for the shared receive queue's ", size, " receives"));
  }
  if (low_water > 0 && sink != nullptr) {
    queue->low_water_ = low_water;
    queue->armed_ = queue->Arm();
    if (!queue->armed_) {
      static std::atomic<bool> said{false};
      if (!said.exchange(true)) {
        ZRPC_LOG(kInfo, "transport", ibv_get_device_name(device.context()->device),
                 " does not report a shared receive queue running low (ibv_modify_srq, errno ",
                 errno, "): its pollers go on without");
      }
    }
  }
  return queue;
}

bool SharedReceiveQueue::Arm() {
  ibv_srq_attr attr{};
  attr.srq_limit = low_water_;
  return ibv_modify_srq(srq_.get(), &attr, IBV_SRQ_LIMIT) == 0;
}

void SharedReceiveQueue::Rearm() {
  if (armed_ && !Arm()) {
    ZRPC_LOG(kWarning, "transport",
             "the shared receive queue's low-water report could not be "
             "armed again (errno ",
             errno, "): no more reports");
    armed_ = false;
  }
  budget_.SetDeviceLow(false);
}

SharedReceiveQueue::~SharedReceiveQueue() {
  if (srq_ == nullptr) return;  // Create failed before the queue existed: nothing was posted
  if (const int rc = ibv_destroy_srq(srq_.release()); rc != 0) {
    ZRPC_LOG(kWarning, "transport", "ibv_destroy_srq failed (", rc,
             "): a queue pair is still attached; its ", posted(), " posted slots are left to it");
    return;
  }
  for (uint32_t slot : slots_) {
    if (slot != SlotPool::kNoSlot) static_cast<void>(pool_.Free(slot));
  }
}

void SharedReceiveQueue::RefillSlow(SlotCache& cache) {
  const int64_t now = SteadyNanos();
  if (now < retry_at_ns_) return;
  while (!unposted_.empty()) {
    const uint32_t slot = cache.Allocate();
    if (slot == SlotPool::kNoSlot) {
      ++starved_;
      retry_at_ns_ = now + 100'000;
      break;
    }
    Chain(unposted_.back(), slot);
    unposted_.pop_back();
  }
  Post(cache);
}

void SharedReceiveQueue::PostChain(SlotCache& cache) {
  ibv_recv_wr* const head = chain_head_;
  chain_head_ = chain_tail_ = nullptr;
  ibv_recv_wr* bad = nullptr;
  if (ibv_post_srq_recv(srq_.get(), head, &bad) == 0) return;
  // From `bad` on nothing was posted (the whole chain when the device names none): those entries
  // wait for the next refill, their slots back in the cache. The queue never holds more than its
  // size, so this is the device failing.
  for (ibv_recv_wr* wr = bad != nullptr ? bad : head; wr != nullptr; wr = wr->next) {
    const auto entry = WorkRequestIndex(wr->wr_id);
    static_cast<void>(cache.Free(slots_[entry]));
    slots_[entry] = SlotPool::kNoSlot;
    unposted_.push_back(entry);
  }
  ++starved_;
}

}  // namespace zrpc::transport
