// object_store_server: serves zrpc.examples.ObjectStore (proto/examples/object_store.proto),
// asynchronous form, keeping the objects in memory.
//
//   object_store_server [--listen ADDR:PORT] [--threads N] [--arena BYTES] [--max-bulk BYTES]
//
// Put, Get and Stat finish their call inside the handler; Transform hands its call to a worker
// thread, which finishes it later: the shape of a handler that waits for I/O or another service.
// Prints "listening on ADDR:PORT" once it accepts calls, serves until SIGINT or SIGTERM, gives
// the calls in flight 5 s to finish, and exits 0 (serve.h). See examples/README.md.
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "examples/cli.h"
#include "examples/crc32c.h"
#include "examples/serve.h"
#include "proto/examples/object_store.zrpc.h"

namespace {

using zrpc::examples::Crc32c;
using zrpc::examples::ObjectInfo;
using zrpc::examples::ObjectKey;
using zrpc::examples::ObjectStore;
using zrpc::examples::PutReply;

using InfoCall = zrpc::PendingCall<ObjectKey, ObjectInfo>;

constexpr char kUsage[] =
    "usage: object_store_server [--listen ADDR:PORT] [--threads N] [--arena BYTES]\n"
    "                           [--max-bulk BYTES]\n"
    "  --listen ADDR:PORT  an address of the RDMA device and a port (0: any free one);\n"
    "                      default: the device's address (ZRPC_RDMA_ADDR), port 7471\n"
    "  --threads N         handler threads, 1 to 256 (default 4)\n"
    "  --arena BYTES       each connection's receive arena: payloads up to it are written there,\n"
    "                      larger ones pulled by RDMA READ; a multiple of 64 up to 1G, with an\n"
    "                      optional K, M or G suffix (default 4M)\n"
    "  --max-bulk BYTES    the largest payload a client can Put or Transform, up to 4G - 1\n"
    "                      (default 1G): a larger one is refused with RESOURCE_EXHAUSTED\n";

// Runs Transform calls on a thread of its own, one after the other.
class TransformWorker {
 public:
  TransformWorker() : thread_([this] { Run(); }) {}
  // Finishes the calls still queued, then stops.
  ~TransformWorker() {
    {
      absl::MutexLock lock(&mu_);
      stopping_ = true;
    }
    thread_.join();
  }

  void Enqueue(std::unique_ptr<InfoCall> call) {
    absl::MutexLock lock(&mu_);
    queue_.push_back(std::move(call));
  }

 private:
  void Run() {
    for (;;) {
      std::unique_ptr<InfoCall> call;
      {
        absl::MutexLock lock(&mu_);
        mu_.Await(absl::Condition(this, &TransformWorker::HasWorkOrStopping));
        if (queue_.empty()) return;  // stopping, and nothing left
        call = std::move(queue_.front());
        queue_.pop_front();
      }
      Transform(*call);
    }
  }

  // The transformation: the payload's bytes in reverse order.
  static void Transform(InfoCall& call) {
    if (call.context().IsCancelled()) {  // the client gave up while the call was queued
      call.Finish(absl::CancelledError("the caller gave up"));
      return;
    }
    zrpc::IncomingBulk payload = call.TakeRequestBulk();
    std::string reversed(payload.view().rbegin(), payload.view().rend());
    payload.Reset();  // gives the receive memory back at once
    call.response()->set_size(reversed.size());
    call.response()->set_crc32c(Crc32c(reversed));
    *call.response_bulk() = zrpc::OutgoingBulk::Copy(std::move(reversed));
    call.Finish(absl::OkStatus());
  }

  bool HasWorkOrStopping() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stopping_ || !queue_.empty();
  }

  absl::Mutex mu_;
  std::deque<std::unique_ptr<InfoCall>> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;  // last: starts once the members above exist
};

// An object as stored: immutable once stored, shared with the Get responses still sending it.
struct Object {
  std::string bytes;
  uint32_t crc32c = 0;
};

class ObjectStoreImpl final : public ObjectStore::AsyncService {
 public:
  void Put(std::unique_ptr<zrpc::PendingCall<ObjectKey, PutReply>> call) override {
    // The payload is read in place, in the connection's receive memory: copy it out and give
    // that memory back.
    zrpc::IncomingBulk payload = call->TakeRequestBulk();
    auto object = std::make_shared<Object>();
    object->bytes = std::string(payload.view());
    payload.Reset();
    object->crc32c = Crc32c(object->bytes);
    call->response()->set_stored_bytes(object->bytes.size());
    {
      absl::MutexLock lock(&mu_);
      objects_[call->request().name()] = std::move(object);
    }
    call->Finish(absl::OkStatus());
  }

  void Get(std::unique_ptr<InfoCall> call) override {
    std::shared_ptr<const Object> object = Find(call->request().name());
    if (object == nullptr) return call->Finish(NotFound(call->request()));
    FillInfo(*object, call->response());
    // No copy: the response payload points at the stored bytes, and the release callback keeps
    // them alive until the NIC has read them, even if a Put replaces the object meanwhile.
    *call->response_bulk() =
        zrpc::OutgoingBulk(object->bytes.data(), object->bytes.size(), [object] {});
    call->Finish(absl::OkStatus());
  }

  void Stat(std::unique_ptr<InfoCall> call) override {
    std::shared_ptr<const Object> object = Find(call->request().name());
    if (object == nullptr) return call->Finish(NotFound(call->request()));
    FillInfo(*object, call->response());
    call->Finish(absl::OkStatus());
  }

  // Returns at once; the worker finishes the call.
  void Transform(std::unique_ptr<InfoCall> call) override { worker_.Enqueue(std::move(call)); }

 private:
  std::shared_ptr<const Object> Find(const std::string& name) {
    absl::MutexLock lock(&mu_);
    auto it = objects_.find(name);
    return it == objects_.end() ? nullptr : it->second;
  }
  static absl::Status NotFound(const ObjectKey& key) {
    return absl::NotFoundError("no object named '" + key.name() + "'");
  }
  static void FillInfo(const Object& object, ObjectInfo* info) {
    info->set_size(object.bytes.size());
    info->set_crc32c(object.crc32c);
  }

  absl::Mutex mu_;
  std::map<std::string, std::shared_ptr<const Object>> objects_ ABSL_GUARDED_BY(mu_);
  TransformWorker worker_;
};

}  // namespace

int main(int argc, char** argv) {
  zrpc::examples::cli::CommandLine args("object_store_server", kUsage);
  if (!args.Parse(argc, argv, {"listen", "threads", "arena", "max-bulk"})) {
    return args.exit_code();
  }
  zrpc::ServerOptions options;
  if (auto error = zrpc::examples::ApplyServerFlags(args, &options)) return args.UsageError(*error);
  // Bulk payloads up to the arena are written into it by the client; larger ones, up to
  // max_bulk_size, the server pulls by RDMA READ (rpc/WIRE.md).
  options.listener.connection.arena_size = 4 << 20;
  if (const std::string* text = args.Find("arena")) {
    std::optional<uint64_t> arena = zrpc::examples::cli::ParseBytes(*text, 64, uint64_t{1} << 30);
    if (!arena || *arena % 64 != 0) return args.UsageError("bad --arena " + *text);
    options.listener.connection.arena_size = static_cast<uint32_t>(*arena);
  }
  if (const std::string* text = args.Find("max-bulk")) {
    std::optional<uint64_t> max = zrpc::examples::cli::ParseBytes(*text, 1, UINT32_MAX);
    if (!max) return args.UsageError("bad --max-bulk " + *text);
    options.max_bulk_size = *max;
  }

  // First, before any thread starts (the store's worker is one): every thread inherits the
  // blocked signals.
  const sigset_t stop_signals = zrpc::examples::cli::BlockStopSignals();
  // Outlives the server: Shutdown waits for the calls the worker still holds, which it finishes.
  ObjectStoreImpl store;
  return zrpc::examples::ServeUntilStopped("object_store_server", options, &store, stop_signals);
}
