// An in-process Channel that hands each call straight to a Service: generated stubs and server
// base classes run end to end, marshalling included, with no transport. Slots are plain heap
// buffers here; the runtime's are registered memory. Records what passed through so tests can
// check that requests were serialized straight into the slot, at their exact size.
#ifndef ZRPC_TESTS_CODEGEN_LOOPBACK_CHANNEL_H_
#define ZRPC_TESTS_CODEGEN_LOOPBACK_CHANNEL_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "rpc/generated_api.h"

namespace zrpc::testing {

class LoopbackCall : public ServerCall {
 public:
  explicit LoopbackCall(std::string request) : request_(std::move(request)) {}
  ServerContext& context() override { return context_; }
  const uint8_t* request_data() const override {
    return reinterpret_cast<const uint8_t*>(request_.data());
  }
  size_t request_size() const override { return request_.size(); }
  absl::StatusOr<SendSlot> AcquireResponseSlot(size_t size) override {
    response_.assign(size, '\0');
    return SendSlot{reinterpret_cast<uint8_t*>(response_.data()), size, 0};
  }
  void Finish(absl::Status status, SendSlot* response) override {
    ++finish_calls;
    status_ = std::move(status);
    if (response == nullptr) response_.clear();
  }

  int finish_calls = 0;
  const absl::Status& status() const { return status_; }
  const std::string& response() const { return response_; }

 private:
  ServerContext context_;
  std::string request_;
  std::string response_;
  absl::Status status_ = absl::UnknownError("Finish was not called");
};

class LoopbackChannel : public Channel {
 public:
  explicit LoopbackChannel(Service* service) : service_(service) {}

  absl::StatusOr<SendSlot> AcquireSendSlot(size_t size, const CallOptions&) override {
    if (!acquire_error.ok()) return acquire_error;
    uint64_t token = next_token_++;
    std::string& buffer = slots_[token];
    buffer.assign(size, '\xee');  // poison: every byte must be overwritten by the serializer
    return SendSlot{reinterpret_cast<uint8_t*>(buffer.data()), size, token};
  }

  void StartUnaryCall(const MethodInfo& method, SendSlot slot,
                      google::protobuf::MessageLite* response, const CallOptions&,
                      DoneCallback done) override {
    ++calls;
    last_method = method.full_name;
    last_request = slots_[slot.token];
    slots_.erase(slot.token);
    LoopbackCall call(last_request);
    service_->Dispatch(method.index, &call);
    if (call.finish_calls != 1) {
      done(absl::InternalError("handler finished " + std::to_string(call.finish_calls) +
                               " times"));
      return;
    }
    if (call.status().ok() &&
        !response->ParseFromArray(call.response().data(), static_cast<int>(call.response().size()))) {
      done(absl::InternalError("response does not parse"));
      return;
    }
    done(call.status());
  }

  absl::Status acquire_error;  // when set, AcquireSendSlot fails with it
  int calls = 0;
  std::string last_method;
  std::string last_request;

 private:
  Service* service_;
  uint64_t next_token_ = 1;
  std::map<uint64_t, std::string> slots_;
};

}  // namespace zrpc::testing

#endif  // ZRPC_TESTS_CODEGEN_LOOPBACK_CHANNEL_H_
