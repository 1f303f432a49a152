// The Bench service as zrpc_bench's server runs it: echo and Cpu inline on the poller thread
// (they never block: what a latency-minded user would do), Put and Get too (a payload read in
// place and released, a payload sent from memory allocated once). Stream, a streaming method,
// runs on a thread of its own, as every streaming handler does.
#ifndef ZRPC_BENCHMARKS_BENCH_SERVICE_H_
#define ZRPC_BENCHMARKS_BENCH_SERVICE_H_

#include <cstdint>
#include <string>

#include "benchmarks/bench.zrpc.h"
#include "benchmarks/run_row.h"

namespace zrpc::bench {

class BenchService final : public Bench::Service {
 public:
  // The largest message Stream sends: the default arena, which a stream's large messages are
  // written into (rpc/streaming.h).
  static constexpr uint64_t kMaxStreamMessage = 256 << 10;

  // Get answers with up to `max_bulk` bytes (the largest payload the clients' arenas take).
  explicit BenchService(size_t max_bulk) : bulk_(max_bulk, '\x5a') {}

  absl::Status Echo(ServerContext&, const EchoMessage& request, EchoMessage* reply) override {
    reply->set_payload(request.payload());
    return absl::OkStatus();
  }
  absl::Status Put(ServerContext&, const BulkRequest&, IncomingBulk payload,
                   BulkReply* reply) override {
    reply->set_size(payload.size());
    return absl::OkStatus();
  }
  absl::Status Get(ServerContext&, const BulkRequest& request, BulkReply* reply,
                   OutgoingBulk* payload) override {
    if (request.size() > bulk_.size()) {
      return absl::InvalidArgumentError("Get: size exceeds the server's --max-bulk");
    }
    reply->set_size(request.size());
    // Lives as long as the server: no release callback needed (rpc/bulk.h).
    *payload = OutgoingBulk(bulk_.data(), request.size());
    return absl::OkStatus();
  }
  absl::Status Stream(ServerContext&, const StreamRequest& request,
                      ServerWriter<EchoMessage>* writer) override {
    if (request.size() > kMaxStreamMessage) {
      return absl::InvalidArgumentError("Stream: size exceeds 256 KiB, the client's arena");
    }
    EchoMessage message;
    message.set_payload(std::string(request.size(), '\x53'));
    for (uint64_t i = 0; i < request.count(); ++i) {
      if (!writer->Write(message)) return absl::CancelledError("Stream: the client went away");
    }
    return absl::OkStatus();
  }
  absl::Status Cpu(ServerContext&, const CpuRequest&, CpuReply* reply) override {
    reply->set_cpu_ns(ProcessCpuNanos());
    return absl::OkStatus();
  }

 private:
  const std::string bulk_;
};

}  // namespace zrpc::bench

#endif  // ZRPC_BENCHMARKS_BENCH_SERVICE_H_
