// HealthService: the health service every Server answers (proto/zrpc/health.proto, the shape of
// gRPC's grpc.health.v1.Health), and the statuses it answers with.
//
// A status is kept per name: "" for the server as a whole, and a service's full name for that
// service. Check answers a name's status now (NOT_FOUND for a name never set). Watch sends a
// name's status at once (SERVICE_UNKNOWN for a name never set) and then each change, one Write
// at a time: a change made while a Write is out goes with the next one, so a slow watcher sees
// the latest status, not each step (gRPC's Watch does the same). Shutdown sets every status
// NOT_SERVING, sends that to each watcher and finishes its stream, so the server's Shutdown is
// not kept waiting by streams that would otherwise last for ever.
//
// A watcher whose client gave up is noticed at its next Write (a status change), or when any
// Watch starts: each start finishes the idle watchers whose context says cancelled. Until then
// it holds one of its connection's streams (ServerOptions::max_streams_per_connection).
//
// Threads: any. Handlers run inline on the poller (an AsyncService's); Write callbacks run on
// runtime threads or inline. A Write is never started under the mutex: its callback may run at
// once, on the same thread, and take it.
#ifndef ZRPC_RPC_HEALTH_HEALTH_SERVICE_H_
#define ZRPC_RPC_HEALTH_HEALTH_SERVICE_H_

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

  HealthService() = default;
  HealthService(const HealthService&) = delete;
  HealthService& operator=(const HealthService&) = delete;
  // Finishes the watchers left (Shutdown does so first in a server).
  ~HealthService() override;

  // Sets `name`'s status and tells its watchers. After Shutdown, does nothing: a server going
  // away is NOT_SERVING whatever its services say.
  void Set(absl::string_view name, Status status);
  // Sets `name`'s status unless it has one.
  void SetIfUnset(absl::string_view name, Status status);
  // Every status NOT_SERVING, told to each watcher, whose stream then finishes OK.
  void Shutdown();
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
  // Claims each idle watcher of `name` ("" with `all`: of every name) and says what to do.
  std::vector<std::pair<Watcher*, Next>> ClaimIdle(absl::string_view name, bool all)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  Status StatusOf(absl::string_view name) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, Status> statuses_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_set<Watcher*> watchers_ ABSL_GUARDED_BY(mu_);
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace zrpc::internal

#endif  // ZRPC_RPC_HEALTH_HEALTH_SERVICE_H_
