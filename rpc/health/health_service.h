// HealthService: the health service every Server answers (proto/zrpc/health.proto, the shape of
// gRPC's grpc.health.v1.Health), and the statuses it answers with.
//
// A status is kept per name: "" for the server as a whole, and a service's full name for that
// service. Check answers a name's status now (NOT_FOUND for a name never set). Watch sends a
// name's status (SERVICE_UNKNOWN for a name never set) and then each change, one Write at a
// time: a change made while a Write is out goes with the next one, so a slow watcher sees the
// latest status, not each step (gRPC's Watch does the same). Shutdown sets every status
// NOT_SERVING, sends that to each watcher and finishes its stream, so the server's Shutdown is
// not kept waiting by streams that would otherwise last for ever.
//
// Writes start only on a runtime thread, where a stream's Write never waits for a send slot
// (rpc/streaming.h): in Flush, which the server's sweeper runs when `kick` asks it to (a change,
// a new watcher, Shutdown) and at least every second while there are watchers, and in the
// callback of the Write before. So neither SetServingStatus nor Shutdown waits on a client that
// stops reading, and a Watch handler returns at once. Flush also finishes the watchers whose
// client gave up or went (their context says cancelled), so a cancelled Watch holds its
// connection's stream (ServerOptions::max_streams_per_connection) for a second at most.
//
// Threads: any. A Write is never started under the mutex: its callback may run at once, on the
// same thread, and take it.
#ifndef ZRPC_RPC_HEALTH_HEALTH_SERVICE_H_
#define ZRPC_RPC_HEALTH_HEALTH_SERVICE_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "proto/zrpc/health.zrpc.h"

namespace zrpc::internal {

class HealthService final : public health::v1::Health::AsyncService {
 public:
  using Status = health::v1::HealthCheckResponse::ServingStatus;
  using Request = health::v1::HealthCheckRequest;
  using Response = health::v1::HealthCheckResponse;

  // `kick` asks the server's sweeper to run Flush soon; called outside the mutex.
  explicit HealthService(std::function<void()> kick) : kick_(std::move(kick)) {}
  HealthService(const HealthService&) = delete;
  HealthService& operator=(const HealthService&) = delete;
  // Waits for the watchers left to finish (none in a server: its Shutdown ends them first).
  ~HealthService() override;

  // Sets `name`'s status; its watchers hear at the next Flush. After Shutdown, does nothing: a
  // server going away is NOT_SERVING whatever its services say.
  void Set(absl::string_view name, Status status);
  // Sets `name`'s status unless it has one (atomically: a Set that came first stays).
  void SetIfUnset(absl::string_view name, Status status);
  // Every status NOT_SERVING; at the next Flush each watcher hears so and its stream then
  // finishes OK.
  void Shutdown();
  // On a runtime thread (the server's sweeper): writes to each idle watcher whose status changed,
  // finishes those whose client gave up, and after Shutdown those told.
  void Flush();
  // `name`'s status; *known false (and SERVICE_UNKNOWN) for a name never set.
  Status Get(absl::string_view name, bool* known) const;
  // Watchers whose stream is open, for tests.
  size_t watchers() const;

  void Check(std::unique_ptr<PendingCall<Request, Response>> call) override;
  void Watch(std::unique_ptr<ServerAsyncWriter<Request, Response>> call) override;

 private:
  struct Watcher;
  // What to do with a watcher this thread has claimed, outside the mutex.
  enum class Next { kNothing, kWrite, kFinish };

  // With the watcher claimed (no Write of it out): what comes next, and the claim kept for a
  // Write or a Finish, released otherwise.
  Next NextFor(Watcher* watcher) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Performs `next` for a claimed watcher (outside the mutex).
  void Run(Watcher* watcher, Next next);
  void OnWritten(Watcher* watcher, bool ok);
  Status StatusOf(absl::string_view name) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::function<void()> kick_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, Status> statuses_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_set<Watcher*> watchers_ ABSL_GUARDED_BY(mu_);
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace zrpc::internal

#endif  // ZRPC_RPC_HEALTH_HEALTH_SERVICE_H_
