// A peer that speaks zrpc's wire by hand over the transport, for tests of what a hostile or
// lagging client can do to a server (the Numbers service's ids included).
#ifndef ZRPC_TESTS_RPC_RAW_CLIENT_H_
#define ZRPC_TESTS_RPC_RAW_CLIENT_H_

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "rpc/connection/rpc_header.h"
#include "transport/connection.h"

namespace zrpc_test {

// A peer that speaks the transport and writes RPC headers by hand: what a hostile client can
// send. It gives every receive back at once (or, while `hold` is set, when told: a client whose
// poller lags) and records the headers of what it got.
class RawClient : public zrpc::transport::ConnectionHandler {
 public:
  void OnMessage(zrpc::transport::Connection& c,
                 const zrpc::transport::ReceivedMessage& m) override {
    absl::StatusOr<zrpc::RpcHeader> header =
        zrpc::DecodeRpcHeader(absl::MakeConstSpan(m.data, m.size));
    absl::MutexLock lock(&mu_);
    if (hold) {
      held_.push_back(m.handle);
    } else {
      static_cast<void>(c.Release(m.handle));
    }
    if (header.ok()) received_.push_back(*header);
  }
  // Gives back what `hold` kept, and everything from now on.
  void Unhold(zrpc::transport::Connection& c) {
    absl::MutexLock lock(&mu_);
    hold = false;
    for (const auto& handle : held_) static_cast<void>(c.Release(handle));
    held_.clear();
  }
  void OnBulk(zrpc::transport::Connection& c, const zrpc::transport::ReceivedBulk& b) override {
    static_cast<void>(c.Release(b.handle));
  }
  void OnSendDone(zrpc::transport::Connection&, uint64_t, const absl::Status&) override {}
  void OnClosed(zrpc::transport::Connection&, const absl::Status&) override { closed.Notify(); }

  int received() {
    absl::MutexLock lock(&mu_);
    return static_cast<int>(received_.size());
  }
  // Messages of `kind` received (errors: with `code`).
  int Count(zrpc::RpcKind kind, absl::StatusCode code = absl::StatusCode::kOk) {
    absl::MutexLock lock(&mu_);
    int n = 0;
    for (const zrpc::RpcHeader& h : received_) n += h.kind == kind && h.status_code == code;
    return n;
  }

  absl::Notification closed;
  bool hold = false;  // set before the connection carries anything

 private:
  absl::Mutex mu_;
  std::vector<zrpc::RpcHeader> received_;
  std::vector<uint64_t> held_;
};

// Sends `header` and `body` on `connection`, waiting for a send slot or a place in its queue;
// the error once it is closed.
inline absl::Status SendRaw(zrpc::transport::Connection& connection, const zrpc::RpcHeader& header,
                            const std::string& body = "") {
  for (;;) {
    absl::StatusOr<zrpc::transport::SendBuffer> buffer = connection.AcquireSendBuffer();
    absl::Status status = buffer.status();
    if (buffer.ok()) {
      zrpc::EncodeRpcHeader(header, buffer->data);
      std::memcpy(buffer->data + zrpc::RpcHeader::kSize, body.data(), body.size());
      status =
          connection.Send(*buffer, static_cast<uint32_t>(zrpc::RpcHeader::kSize + body.size()));
      if (status.ok()) return status;
    }
    if (status.code() != absl::StatusCode::kResourceExhausted || !connection.open()) {
      return status;
    }
    absl::SleepFor(absl::Microseconds(200));
  }
}

constexpr uint32_t kNumbersId = zrpc::ServiceId("zrpc.examples.Numbers");
constexpr uint16_t kCountIndex = 0, kDoubleIndex = 2, kSquareIndex = 3;

}  // namespace zrpc_test

#endif  // ZRPC_TESTS_RPC_RAW_CLIENT_H_
