#include "transport/async_events.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <map>
#include <mutex>
#include <set>

#include "absl/strings/str_cat.h"
#include "transport/log.h"
#include "transport/verbs_error.h"

namespace zrpc::transport {
namespace {

// The readers alive, by context (see the top of the header).
std::mutex& RegistryMutex() {
  static auto* mu = new std::mutex;
  return *mu;
}
std::map<ibv_context*, std::weak_ptr<AsyncEvents>>& Registry() {
  static auto* readers = new std::map<ibv_context*, std::weak_ptr<AsyncEvents>>;
  return *readers;
}

// The sinks alive. A queue's context is only a pointer: one made by other code on the same device
// context (a test's raw peer, an application's own queue pairs; librdmacm may set it to the
// cm id) points elsewhere, and is routed nowhere. A sink is called under this lock, so it is not
// destroyed meanwhile.
std::mutex& SinksMutex() {
  static auto* mu = new std::mutex;
  return *mu;
}
std::set<const DeviceEventSink*>& Sinks() {
  static auto* sinks = new std::set<const DeviceEventSink*>;
  return *sinks;
}

// `context` when it is a sink alive, else null; called with SinksMutex held.
DeviceEventSink* SinkOf(void* context) {
  auto* sink = static_cast<DeviceEventSink*>(context);
  return context != nullptr && Sinks().count(sink) > 0 ? sink : nullptr;
}

// Adds one to an eventfd: its reader wakes. Fails only when the counter would overflow, when a
// wake-up is pending anyway.
void Signal(int fd) {
  const uint64_t one = 1;
  ssize_t written = write(fd, &one, sizeof(one));
  static_cast<void>(written);
}

}  // namespace

DeviceEventSink::DeviceEventSink() : wake_fd_(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) {
  std::lock_guard<std::mutex> lock(SinksMutex());
  Sinks().insert(this);
}

DeviceEventSink::~DeviceEventSink() {
  {
    std::lock_guard<std::mutex> lock(SinksMutex());
    Sinks().erase(this);
  }
  if (wake_fd_ >= 0) close(wake_fd_);
}

void DeviceEventSink::Wake() {
  if (wake_fd_ >= 0) Signal(wake_fd_);
}

void DeviceEventSink::OnQueuePairEvent(ibv_qp* qp, ibv_event_type type) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    errors_.push_back(QueuePairError{qp, qp->qp_num, type});
  }
  pending.store(true, std::memory_order_release);
  Wake();
}

void DeviceEventSink::OnSharedQueueLow() {
  low_reports_.fetch_add(1, std::memory_order_relaxed);
  pending.store(true, std::memory_order_release);
}

std::vector<DeviceEventSink::QueuePairError> DeviceEventSink::TakeQueuePairErrors() {
  std::vector<QueuePairError> taken;
  std::lock_guard<std::mutex> lock(mu_);
  taken.swap(errors_);
  return taken;
}

absl::StatusOr<std::shared_ptr<AsyncEvents>> AsyncEvents::For(ibv_context* context) {
  if (context == nullptr || context->async_fd < 0) return std::shared_ptr<AsyncEvents>();
  std::lock_guard<std::mutex> lock(RegistryMutex());
  std::weak_ptr<AsyncEvents>& entry = Registry()[context];
  if (std::shared_ptr<AsyncEvents> reader = entry.lock()) return reader;
  const int flags = fcntl(context->async_fd, F_GETFL);
  if (flags < 0 || fcntl(context->async_fd, F_SETFL, flags | O_NONBLOCK) < 0) {
    return VerbsError("fcntl(the device's event file, O_NONBLOCK)", errno);
  }
  const int wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (wake_fd < 0) return VerbsError("eventfd (the device event reader's wake-up)", errno);
  std::shared_ptr<AsyncEvents> reader(new AsyncEvents(context, wake_fd));
  entry = reader;
  return reader;
}

AsyncEvents::AsyncEvents(ibv_context* context, int wake_fd)
    : context_(context), wake_fd_(wake_fd), thread_([this] { Loop(); }) {}

AsyncEvents::~AsyncEvents() {
  {
    // Out of the registry first, unless a new reader of the context took the entry already
    // (this one's last reference went while For made another).
    std::lock_guard<std::mutex> lock(RegistryMutex());
    auto it = Registry().find(context_);
    if (it != Registry().end() && it->second.expired()) Registry().erase(it);
  }
  Signal(wake_fd_);
  thread_.join();
  close(wake_fd_);
}

AsyncEventCounts AsyncEvents::counts() const {
  AsyncEventCounts c;
  c.port_down = port_down_.load(std::memory_order_relaxed);
  c.port_active = port_active_.load(std::memory_order_relaxed);
  c.queue_pair_errors = queue_pair_errors_.load(std::memory_order_relaxed);
  c.shared_queue_errors = shared_queue_errors_.load(std::memory_order_relaxed);
  c.shared_queue_low = shared_queue_low_.load(std::memory_order_relaxed);
  c.device_fatal = device_fatal_.load(std::memory_order_relaxed);
  c.last_wqe = last_wqe_.load(std::memory_order_relaxed);
  c.other = other_.load(std::memory_order_relaxed);
  return c;
}

void AsyncEvents::Loop() {
  pollfd fds[2] = {{context_->async_fd, POLLIN, 0}, {wake_fd_, POLLIN, 0}};
  for (;;) {
    if (poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      ZRPC_LOG(kError, "transport", "poll on the device's event file failed (errno ", errno,
               "): its events are no longer read");
      return;
    }
    if (fds[1].revents != 0) return;
    if (fds[0].revents & (POLLERR | POLLNVAL)) {
      ZRPC_LOG(kError, "transport",
               "the device's event file failed: its events are no longer read");
      return;
    }
    ibv_async_event event;
    while (ibv_get_async_event(context_, &event) == 0) {
      Handle(event);
      ibv_ack_async_event(&event);
    }
  }
}

void AsyncEvents::Handle(const ibv_async_event& event) {
  const char* name = ibv_event_type_str(event.event_type);
  const char* device = ibv_get_device_name(context_->device);
  switch (event.event_type) {
    case IBV_EVENT_QP_FATAL:
    case IBV_EVENT_QP_REQ_ERR:
    case IBV_EVENT_QP_ACCESS_ERR:
    case IBV_EVENT_PATH_MIG_ERR: {
      queue_pair_errors_.fetch_add(1, std::memory_order_relaxed);
      ibv_qp* qp = event.element.qp;
      std::lock_guard<std::mutex> lock(SinksMutex());
      if (DeviceEventSink* sink = SinkOf(qp->qp_context)) {
        sink->OnQueuePairEvent(qp, event.event_type);
      } else {
        ZRPC_LOG(kError, "transport", device, ": ", name, " on queue pair ", qp->qp_num,
                 ", which is no zrpc connection's");
      }
      break;
    }
    case IBV_EVENT_QP_LAST_WQE_REACHED: {
      last_wqe_.fetch_add(1, std::memory_order_relaxed);
      ibv_qp* qp = event.element.qp;
      std::lock_guard<std::mutex> lock(SinksMutex());
      if (DeviceEventSink* sink = SinkOf(qp->qp_context))
        sink->OnQueuePairEvent(qp, event.event_type);
      break;
    }
    case IBV_EVENT_PORT_ERR:
      port_down_.fetch_add(1, std::memory_order_relaxed);
      ZRPC_LOG(kError, "transport", device, " port ", event.element.port_num, " went down (", name,
               "): its connections fail as their transfers time out");
      break;
    case IBV_EVENT_PORT_ACTIVE:
      port_active_.fetch_add(1, std::memory_order_relaxed);
      ZRPC_LOG(kInfo, "transport", device, " port ", event.element.port_num, " is active (", name,
               ")");
      break;
    case IBV_EVENT_SRQ_ERR:
    case IBV_EVENT_SRQ_LIMIT_REACHED: {
      if (event.event_type == IBV_EVENT_SRQ_ERR) {
        shared_queue_errors_.fetch_add(1, std::memory_order_relaxed);
        ZRPC_LOG(kError, "transport", device, ": a shared receive queue failed (", name,
                 "): its poller's connections receive nothing more");
      } else {
        shared_queue_low_.fetch_add(1, std::memory_order_relaxed);
      }
      std::lock_guard<std::mutex> lock(SinksMutex());
      DeviceEventSink* sink = SinkOf(event.element.srq->srq_context);
      if (sink != nullptr && event.event_type == IBV_EVENT_SRQ_LIMIT_REACHED) {
        sink->OnSharedQueueLow();
      }
      break;
    }
    case IBV_EVENT_DEVICE_FATAL:
      device_fatal_.fetch_add(1, std::memory_order_relaxed);
      ZRPC_LOG(kError, "transport", device, " failed (", name,
               "): every connection on it fails; the device must be opened again");
      break;
    default:
      other_.fetch_add(1, std::memory_order_relaxed);
      ZRPC_LOG(kDebug, "transport", device, ": ", name);
      break;
  }
}

}  // namespace zrpc::transport
