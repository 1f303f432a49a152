// An in-process Channel that hands each call straight to a Service: generated stubs and server
// base classes run end to end, marshalling included, with no transport. Slots are plain heap
// buffers here; the runtime's are registered memory. Records what passed through so tests can
// check that requests were serialized straight into the slot, at their exact size.
//
// Bulk payloads are copied into channel-owned "receive memory" (the transport would RDMA WRITE
// them), and the channel counts the releases of both directions so tests can check that every
// payload is given back exactly once.
//
// Calls end when the server finishes them, not when Dispatch returns, as with the runtime
// (rpc/generated_api.h, ServerCall): a handler of an AsyncService may keep its call and finish it
// later from another thread, and the client's `done` then runs on that thread, inside Finish. A
// blocking stub call waits for it. The channel keeps every server call it created until it is
// destroyed, so that a break of the ServerCall contract (Finish twice, a use after Finish) is
// counted (contract_violations) rather than undefined; a call no handler ever finishes leaves
// its client waiting, as it would over RDMA without a deadline (unfinished_calls tells).
#ifndef ZRPC_TESTS_CODEGEN_LOOPBACK_CHANNEL_H_
#define ZRPC_TESTS_CODEGEN_LOOPBACK_CHANNEL_H_

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "absl/time/time.h"
#include "rpc/generated_api.h"

namespace zrpc::testing {

// Receive memory for bulk payloads: each payload lives here until its IncomingBulk releases it.
// Thread-safe, as a BulkReleaser must be: payloads are released from handler threads too.
class LoopbackBulkMemory : public BulkReleaser {
 public:
  // Copies `bulk`'s bytes in (as the transport's WRITE would) and releases `bulk`.
  IncomingBulk Receive(OutgoingBulk bulk) {
    if (bulk.empty()) return IncomingBulk();
    uint64_t token;
    const std::string* bytes;
    {
      std::lock_guard<std::mutex> lock(mu_);
      token = next_token_++;
      std::string& held = held_[token];  // a map node: it stays where it is until released
      held.assign(reinterpret_cast<const char*>(bulk.data()), bulk.size());
      bytes = &held;
    }
    bulk.Reset();
    return IncomingBulk(reinterpret_cast<const uint8_t*>(bytes->data()), bytes->size(), this,
                        token);
  }

  void ReleaseBulk(uint64_t token) override {
    std::lock_guard<std::mutex> lock(mu_);
    ++releases;
    if (held_.erase(token) != 1) ++bad_releases;
  }

  size_t held() const {
    std::lock_guard<std::mutex> lock(mu_);
    return held_.size();
  }
  std::atomic<int> releases{0};
  std::atomic<int> bad_releases{0};  // unknown or repeated tokens

 private:
  mutable std::mutex mu_;
  uint64_t next_token_ = 1;
  std::map<uint64_t, std::string> held_;
};

// One call as the server sees it. On its own (a test dispatches to it directly) it records how
// it was finished; made by LoopbackChannel it also completes the client's call, from inside
// Finish, on whichever thread finishes it.
class LoopbackCall : public ServerCall {
 public:
  // Runs once, at the end of the first Finish, on the finishing thread. It may end the client's
  // call, after which the channel, and this call with it, may be destroyed at any moment.
  using FinishHook =
      internal::InlineFunction<void(LoopbackCall&), 48>;  // move-only, as DoneCallback

  explicit LoopbackCall(std::string request, IncomingBulk request_bulk = IncomingBulk(),
                        FinishHook on_finish = nullptr)
      : request_(std::move(request)),
        request_bulk_(std::move(request_bulk)),
        on_finish_(std::move(on_finish)) {}

  ServerContext& context() override {
    NoteUse();
    return context_;
  }
  const uint8_t* request_data() const override {
    NoteUse();
    return reinterpret_cast<const uint8_t*>(request_.data());
  }
  size_t request_size() const override {
    NoteUse();
    return request_.size();
  }
  IncomingBulk TakeRequestBulk() override {
    NoteUse();
    return std::move(request_bulk_);
  }
  absl::StatusOr<SendSlot> AcquireResponseSlot(size_t size) override {
    NoteUse();
    response_.assign(size, '\0');
    return SendSlot{reinterpret_cast<uint8_t*>(response_.data()), size, 0};
  }
  void Finish(absl::Status status, SendSlot* response, OutgoingBulk response_bulk) override {
    if (finish_calls.fetch_add(1) > 0) return;  // counted; the first Finish stands
    status_ = std::move(status);
    if (response == nullptr) response_.clear();
    request_bulk_.Reset();  // a payload the handler did not take is released here
    response_bulk_ = std::move(response_bulk);
    FinishHook hook = std::move(on_finish_);
    {
      std::lock_guard<std::mutex> lock(mu_);
      finished_ = true;
      finished_cv_.notify_all();
    }
    if (hook) hook(*this);  // last: from here on the call may be gone
  }

  // For a call a test dispatched itself: waits until Finish has run; false on timeout. After
  // it returns true, status(), response() and response_bulk() may be read from this thread.
  bool WaitForFinish(absl::Duration timeout = absl::Seconds(10)) {
    std::unique_lock<std::mutex> lock(mu_);
    return finished_cv_.wait_for(lock, absl::ToChronoNanoseconds(timeout),
                                 [this] { return finished_; });
  }

  std::atomic<int> finish_calls{0};
  mutable std::atomic<int> uses_after_finish{0};
  const absl::Status& status() const { return status_; }
  const std::string& response() const { return response_; }
  OutgoingBulk& response_bulk() { return response_bulk_; }

 private:
  void NoteUse() const {
    if (finish_calls.load() > 0) ++uses_after_finish;
  }

  ServerContext context_;
  std::string request_;
  IncomingBulk request_bulk_;
  std::string response_;
  OutgoingBulk response_bulk_;
  absl::Status status_ = absl::UnknownError("Finish was not called");
  FinishHook on_finish_;
  std::mutex mu_;
  std::condition_variable finished_cv_;
  bool finished_ = false;
};

class LoopbackChannel : public Channel {
 public:
  explicit LoopbackChannel(Service* service) : service_(service) {}

  absl::StatusOr<SendSlot> AcquireSendSlot(const MethodInfo&, size_t size,
                                           const CallOptions&) override {
    if (!acquire_error.ok()) return acquire_error;
    std::lock_guard<std::mutex> lock(mu_);
    uint64_t token = next_token_++;
    std::string& buffer = slots_[token];
    buffer.assign(size, '\xee');  // poison: every byte must be overwritten by the serializer
    return SendSlot{reinterpret_cast<uint8_t*>(buffer.data()), size, token};
  }

  // Streams are the runtime's (tests/rpc/streaming_test): this channel refuses them, giving the
  // slot back.
  std::unique_ptr<ClientStreamCall> OpenStream(const MethodInfo& method, SendSlot slot,
                                               const google::protobuf::MessageLite*,
                                               google::protobuf::MessageLite*,
                                               const CallOptions&) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      slots_.erase(slot.token);
    }
    return std::make_unique<internal::FailedStream>(absl::UnimplementedError(
        std::string(method.full_name) + ": the loopback channel opens no streams"));
  }

  void StartUnaryCall(const MethodInfo& method, SendSlot slot, OutgoingBulk request_bulk,
                      google::protobuf::MessageLite* response, IncomingBulk* response_bulk,
                      const CallOptions&, DoneCallback done) override {
    ++calls;
    std::string request;
    {
      std::lock_guard<std::mutex> lock(mu_);
      request = std::move(slots_.extract(slot.token).mapped());
      last_method = method.full_name;
      last_request = request;
    }
    // What the runtime checks: payloads only where the method has them.
    if ((!method.request_bulk && !request_bulk.empty()) ||
        (response_bulk != nullptr) != method.response_bulk) {
      request_bulk.Reset();  // before done, as StartUnaryCall promises
      done(absl::InvalidArgumentError("bulk payloads do not match the method table"));
      return;
    }
    auto complete = [this, response, response_bulk,
                     done = std::move(done)](LoopbackCall& finished) mutable {
      Complete(finished, response, response_bulk, std::move(done));
    };
    auto owned = std::make_unique<LoopbackCall>(
        std::move(request), server_memory.Receive(std::move(request_bulk)), std::move(complete));
    LoopbackCall* call = owned.get();
    {
      std::lock_guard<std::mutex> lock(mu_);
      server_calls_.push_back(std::move(owned));
    }
    // The call ends at its Finish, which may already have run, or may run later on another
    // thread: an AsyncService handler can keep the call.
    service_->Dispatch(method.index, call);
  }

  // Calls dispatched that no one has finished yet.
  int unfinished_calls() const {
    std::lock_guard<std::mutex> lock(mu_);
    int unfinished = 0;
    for (const auto& call : server_calls_) unfinished += call->finish_calls.load() == 0;
    return unfinished;
  }
  // Breaks of the ServerCall contract so far: each Finish after the first, each use after Finish.
  int contract_violations() const {
    std::lock_guard<std::mutex> lock(mu_);
    int violations = 0;
    for (const auto& call : server_calls_) {
      const int finishes = call->finish_calls.load();
      violations += (finishes > 1 ? finishes - 1 : 0) + call->uses_after_finish.load();
    }
    return violations;
  }

  absl::Status acquire_error;  // when set, AcquireSendSlot fails with it
  std::atomic<int> calls{0};
  std::string last_method;  // read these once the calls have returned
  std::string last_request;
  LoopbackBulkMemory server_memory;  // where request payloads land
  LoopbackBulkMemory client_memory;  // where response payloads land

 private:
  // What the client's runtime does when the response arrives; runs inside the call's first
  // Finish, on the finishing thread. `done` is the last thing it touches.
  void Complete(LoopbackCall& call, google::protobuf::MessageLite* response,
                IncomingBulk* response_bulk, DoneCallback done) {
    if (!call.status().ok()) {
      done(call.status());
      return;
    }
    if (!response->ParseFromArray(call.response().data(),
                                  static_cast<int>(call.response().size()))) {
      call.response_bulk().Reset();
      done(absl::InternalError("response does not parse"));
      return;
    }
    if (response_bulk != nullptr) {
      *response_bulk = client_memory.Receive(std::move(call.response_bulk()));
    } else if (!call.response_bulk().empty()) {
      call.response_bulk().Reset();
      done(absl::InternalError("a response payload for a method without response_bulk"));
      return;
    }
    done(absl::OkStatus());
  }

  Service* service_;
  mutable std::mutex mu_;  // guards the members below
  uint64_t next_token_ = 1;
  std::map<uint64_t, std::string> slots_;
  // Declared after the receive memories: destroyed first, releasing what they still hold there.
  std::vector<std::unique_ptr<LoopbackCall>> server_calls_;
};

}  // namespace zrpc::testing

#endif  // ZRPC_TESTS_CODEGEN_LOOPBACK_CHANNEL_H_
