// AsyncEvents: a device's asynchronous events, read, counted, logged and acted on.
//
// Why. A device reports what no completion says on its context's event file: a port that went
// down or came back, a queue pair that the device put in error (a local access violation, a
// fatal error), a shared receive queue in error, the device itself failing. Nobody read them
// before: the kernel keeps each one queued for the context until it is read, a port flap left no
// trace in any log, and an idle connection whose queue pair the device failed stayed "open",
// with nothing posted to flush, until its next send or a liveness probe.
//
// What is done with each:
//  - a queue pair's fatal error, request error, access error or path migration error: its
//    connection fails at once, with the event's name in the reason (the queue pair's poller
//    carries it over: its qp_context names a DeviceEventSink, the poller);
//  - a queue pair's last-WQE-reached (one of a shared receive queue, in error): no receive of the
//    queue can complete for it any more, so its connection's drain may end (shared_receive_
//    queue.h, "Teardown"); carried over the same way;
//  - a shared receive queue that fell below its low-water mark: its poller counts it and grants
//    no more than floors until the queue is posted full again (shared_receive_queue.h);
//  - a port's going down or coming back, a shared receive queue's error and the device's fatal
//    error: logged (kError, or kInfo for a port that came back);
//  - every event: counted by kind (counts()), whatever it was.
//
// One reader per context. librdmacm opens every device once per process, so every Device on
// one device shares one context and its one event file; each event is read once. For() hands
// out the context's reader, started at its first use and stopped when the last Device lets it
// go. The event file is made non-blocking: code outside zrpc reading the same context's events
// would take some of them from this reader.
//
// Threads: a thread per context, asleep in poll(2) until an event or its stop.
#ifndef ZRPC_TRANSPORT_ASYNC_EVENTS_H_
#define ZRPC_TRANSPORT_ASYNC_EVENTS_H_

#include <infiniband/verbs.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"

namespace zrpc::transport {

// Where a queue's events go: what its qp_context or srq_context points at. The reader calls it
// before it acknowledges the event, so the queue is not destroyed meanwhile (ibv_destroy_qp and
// ibv_destroy_srq wait for the acknowledgement); but its owner may be. So it is a whole object of
// its own, holding everything the reader's thread touches (the errors queued for the owner's
// loop, the low-water reports, the owner's "something is queued" flag and its wake-up), and its
// owner (a Poller) declares it before every queue that names it, so destroys it after them. Its
// calls take only its own lock. Only a sink alive is called: a queue's context that points at
// anything else (a queue pair made by other code on the same device) is routed nowhere.
class DeviceEventSink {
 public:
  struct QueuePairError {
    ibv_qp* qp;  // with its number, tells a queue pair from a later one given the same number
    uint32_t qp_num;
    ibv_event_type type;
  };

  DeviceEventSink();   // makes the wake-up (an eventfd; wake_fd() < 0 when it could not)
  ~DeviceEventSink();  // closes it
  DeviceEventSink(const DeviceEventSink&) = delete;
  DeviceEventSink& operator=(const DeviceEventSink&) = delete;

  // The reader's thread. A queue pair's QP_FATAL, QP_REQ_ERR, QP_ACCESS_ERR, PATH_MIG_ERR or
  // QP_LAST_WQE_REACHED: queued, flagged, the owner woken.
  void OnQueuePairEvent(ibv_qp* qp, ibv_event_type type);
  // A shared receive queue's SRQ_LIMIT_REACHED: counted and flagged (no wake-up: the owner's
  // loop is the one that fell behind).
  void OnSharedQueueLow();

  // The owner's. Set whenever something is queued for its loop (its own cm events too).
  std::atomic<bool> pending{false};
  int wake_fd() const { return wake_fd_; }
  void Wake();
  std::vector<QueuePairError> TakeQueuePairErrors();
  uint64_t shared_queue_low_reports() const { return low_reports_.load(std::memory_order_relaxed); }

 private:
  const int wake_fd_;
  std::mutex mu_;
  std::vector<QueuePairError> errors_;  // under mu_
  std::atomic<uint64_t> low_reports_{0};
};

// Events read so far, by kind.
struct AsyncEventCounts {
  uint64_t port_down = 0;            // IBV_EVENT_PORT_ERR
  uint64_t port_active = 0;          // IBV_EVENT_PORT_ACTIVE
  uint64_t queue_pair_errors = 0;    // QP_FATAL, QP_REQ_ERR, QP_ACCESS_ERR, PATH_MIG_ERR
  uint64_t shared_queue_errors = 0;  // SRQ_ERR
  uint64_t shared_queue_low = 0;     // SRQ_LIMIT_REACHED
  uint64_t device_fatal = 0;         // DEVICE_FATAL
  uint64_t last_wqe = 0;             // QP_LAST_WQE_REACHED (a shared queue's QP in error)
  uint64_t other = 0;                // COMM_EST, SQ_DRAINED, LID, GID...
};

class AsyncEvents {
 public:
  // The reader of `context`'s events, started if it was not (see the top). Null when the context
  // has no event file (a stand-in device); an error when it cannot be made non-blocking or the
  // thread's wake-up cannot be made.
  static absl::StatusOr<std::shared_ptr<AsyncEvents>> For(ibv_context* context);

  // Stops the thread. Events not read yet stay queued for the context.
  ~AsyncEvents();
  AsyncEvents(const AsyncEvents&) = delete;
  AsyncEvents& operator=(const AsyncEvents&) = delete;

  AsyncEventCounts counts() const;

 private:
  AsyncEvents(ibv_context* context, int wake_fd);
  void Loop();
  void Handle(const ibv_async_event& event);

  ibv_context* const context_;
  const int wake_fd_;  // an eventfd: written to stop the thread
  std::thread thread_;
  std::atomic<uint64_t> port_down_{0};
  std::atomic<uint64_t> port_active_{0};
  std::atomic<uint64_t> queue_pair_errors_{0};
  std::atomic<uint64_t> shared_queue_errors_{0};
  std::atomic<uint64_t> shared_queue_low_{0};
  std::atomic<uint64_t> device_fatal_{0};
  std::atomic<uint64_t> last_wqe_{0};
  std::atomic<uint64_t> other_{0};
};

}  // namespace zrpc::transport

#endif  // ZRPC_TRANSPORT_ASYNC_EVENTS_H_
