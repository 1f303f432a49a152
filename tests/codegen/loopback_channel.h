// An in-process Channel that hands each call straight to a Service: generated stubs and server
// base classes run end to end, marshalling included, with no transport. Slots are plain heap
// buffers here; the runtime's are registered memory. Records what passed through so tests can
// check that requests were serialized straight into the slot, at their exact size.
//
// Bulk payloads are copied into channel-owned "receive memory" (the transport would RDMA WRITE
// them), and the channel counts the releases of both directions so tests can check that every
// payload is given back exactly once.
#ifndef ZRPC_TESTS_CODEGEN_LOOPBACK_CHANNEL_H_
#define ZRPC_TESTS_CODEGEN_LOOPBACK_CHANNEL_H_

#include <cstdint>
#include <map>
#include <string>
#include <utility>

#include "rpc/generated_api.h"

namespace zrpc::testing {

// Receive memory for bulk payloads: each payload lives here until its IncomingBulk releases it.
class LoopbackBulkMemory : public BulkReleaser {
 public:
  // Copies `bulk`'s bytes in (as the transport's WRITE would) and releases `bulk`.
  IncomingBulk Receive(OutgoingBulk bulk) {
    if (bulk.empty()) return IncomingBulk();
    uint64_t token = next_token_++;
    std::string& bytes = held_[token];
    bytes.assign(reinterpret_cast<const char*>(bulk.data()), bulk.size());
    bulk.Reset();
    return IncomingBulk(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), this,
                        token);
  }

  void ReleaseBulk(uint64_t token) override {
    ++releases;
    if (held_.erase(token) != 1) ++bad_releases;
  }

  size_t held() const { return held_.size(); }
  int releases = 0;
  int bad_releases = 0;  // unknown or repeated tokens

 private:
  uint64_t next_token_ = 1;
  std::map<uint64_t, std::string> held_;
};

class LoopbackCall : public ServerCall {
 public:
  explicit LoopbackCall(std::string request, IncomingBulk request_bulk = IncomingBulk())
      : request_(std::move(request)), request_bulk_(std::move(request_bulk)) {}
  ServerContext& context() override { return context_; }
  const uint8_t* request_data() const override {
    return reinterpret_cast<const uint8_t*>(request_.data());
  }
  size_t request_size() const override { return request_.size(); }
  IncomingBulk TakeRequestBulk() override { return std::move(request_bulk_); }
  absl::StatusOr<SendSlot> AcquireResponseSlot(size_t size) override {
    response_.assign(size, '\0');
    return SendSlot{reinterpret_cast<uint8_t*>(response_.data()), size, 0};
  }
  void Finish(absl::Status status, SendSlot* response, OutgoingBulk response_bulk) override {
    ++finish_calls;
    status_ = std::move(status);
    if (response == nullptr) response_.clear();
    request_bulk_.Reset();  // a payload the handler did not take is released here
    response_bulk_ = std::move(response_bulk);
  }

  int finish_calls = 0;
  const absl::Status& status() const { return status_; }
  const std::string& response() const { return response_; }
  OutgoingBulk& response_bulk() { return response_bulk_; }

 private:
  ServerContext context_;
  std::string request_;
  IncomingBulk request_bulk_;
  std::string response_;
  OutgoingBulk response_bulk_;
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

  void StartUnaryCall(const MethodInfo& method, SendSlot slot, OutgoingBulk request_bulk,
                      google::protobuf::MessageLite* response, IncomingBulk* response_bulk,
                      const CallOptions&, DoneCallback done) override {
    ++calls;
    last_method = method.full_name;
    last_request = std::move(slots_.extract(slot.token).mapped());
    // What the runtime checks: payloads only where the method has them.
    if ((!method.request_bulk && !request_bulk.empty()) ||
        (response_bulk != nullptr) != method.response_bulk) {
      request_bulk.Reset();  // before done, as StartUnaryCall promises
      done(absl::InvalidArgumentError("bulk payloads do not match the method table"));
      return;
    }
    LoopbackCall call(last_request, server_memory.Receive(std::move(request_bulk)));
    service_->Dispatch(method.index, &call);
    if (call.finish_calls != 1) {
      done(absl::InternalError("handler finished " + std::to_string(call.finish_calls) +
                               " times"));
      return;
    }
    if (!call.status().ok()) {
      done(call.status());
      return;
    }
    if (!response->ParseFromArray(call.response().data(),
                                  static_cast<int>(call.response().size()))) {
      done(absl::InternalError("response does not parse"));
      return;
    }
    if (response_bulk != nullptr) {
      *response_bulk = client_memory.Receive(std::move(call.response_bulk()));
    } else if (!call.response_bulk().empty()) {
      done(absl::InternalError("a response payload for a method without response_bulk"));
      return;
    }
    done(absl::OkStatus());
  }

  absl::Status acquire_error;  // when set, AcquireSendSlot fails with it
  int calls = 0;
  std::string last_method;
  std::string last_request;
  LoopbackBulkMemory server_memory;  // where request payloads land
  LoopbackBulkMemory client_memory;  // where response payloads land

 private:
  Service* service_;
  uint64_t next_token_ = 1;
  std::map<uint64_t, std::string> slots_;
};

}  // namespace zrpc::testing

#endif  // ZRPC_TESTS_CODEGEN_LOOPBACK_CHANNEL_H_
