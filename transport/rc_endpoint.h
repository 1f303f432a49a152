// RcEndpoint: one reliable-connected queue pair, set up with librdmacm, with its own protection
// domain, completion queue and one registered buffer the peer may RDMA WRITE into.
//
// This is the foundation's raw-verbs building block: the verbs smoke test and the raw ping-pong
// baseline in tools/bench use it, so what they measure is verbs plus nothing. It is deliberately
// a thin, explicit layer -- the caller posts work requests by buffer offset and polls
// completions -- with none of the RPC transport's pools, credits or poller (those come with the
// transport proper, which will share verbs_owners.h and verbs_error.h with it).
//
// Connection exchange: connect and accept each carry a 24-byte private-data block, the
// BufferAdvert below (magic, version, buffer address, rkey, size), so each side learns where it
// may WRITE. A peer whose block has another magic or version is refused.
//
// Memory: the buffer is registered with LOCAL_WRITE | REMOTE_WRITE only (no REMOTE_READ). The
// peer may write anywhere in it; offsets passed to PostWriteWithImm are checked against the
// peer's advertised size before posting.
//
// Threads: an RcEndpoint is not thread-safe; use it from one thread at a time. RcListener::Accept
// and RcEndpoint::Connect block (with a timeout) and are meant to run on different threads.
#ifndef ZRPC_TRANSPORT_RC_ENDPOINT_H_
#define ZRPC_TRANSPORT_RC_ENDPOINT_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "transport/verbs_owners.h"
#include "transport/wire.h"

namespace zrpc::transport {

// What each side tells the other in the connection's private data. Little-endian on the wire
// (all supported hosts are little-endian; a big-endian host would have to convert here).
struct BufferAdvert {
  static constexpr uint32_t kMagic = kWireMagic;
  static constexpr uint32_t kVersion = 1;
  uint32_t magic = kMagic;
  uint32_t version = kVersion;
  uint64_t addr = 0;
  uint32_t rkey = 0;
  uint32_t size = 0;
};
static_assert(sizeof(BufferAdvert) == 24, "BufferAdvert is a wire format");

// A completion, without verbs types, for callers outside transport/.
struct Completion {
  enum class Kind { kSend, kRecv, kRecvWithImm, kWrite, kOther };
  uint64_t wr_id = 0;
  Kind kind = Kind::kOther;
  uint32_t byte_len = 0;  // for receives: bytes received (or written, with immediate)
  uint32_t imm = 0;       // host byte order; valid for kRecvWithImm
};

struct RcOptions {
  size_t buffer_size = 4 << 20;  // bytes registered for sends, receives and peer writes
  uint32_t max_send_wr = 128;    // send queue depth
  uint32_t max_recv_wr = 128;    // receive queue depth
  uint32_t max_inline = 64;      // requested inline size; the device may grant less
  // Receives posted before the connection is established, so the peer may SEND at once:
  // `initial_recvs` receives of `recv_size` bytes at offsets i * recv_size, with wr_id i.
  uint32_t initial_recvs = 0;
  uint32_t recv_size = 0;
};

class RcEndpoint {
 public:
  // Resolves `addr`:`port` and connects within `timeout`.
  static absl::StatusOr<std::unique_ptr<RcEndpoint>> Connect(const std::string& addr,
                                                             uint16_t port,
                                                             const RcOptions& options,
                                                             absl::Duration timeout);
  ~RcEndpoint();
  RcEndpoint(const RcEndpoint&) = delete;
  RcEndpoint& operator=(const RcEndpoint&) = delete;

  uint8_t* buffer() { return buffer_.get(); }
  size_t buffer_size() const { return options_.buffer_size; }
  const BufferAdvert& peer() const { return peer_; }
  uint32_t max_inline() const { return max_inline_; }

  // Device name, port and the GID librdmacm chose, as text (for logs and tests).
  std::string DeviceName() const;
  int PortNum() const;
  std::string GidText() const;
  // Index of that GID in the port's table, found by lookup.
  absl::StatusOr<int> GidIndex() const;

  // Posts a receive of up to `length` bytes at buffer offset `offset`.
  absl::Status PostRecv(size_t offset, size_t length, uint64_t wr_id);
  // Posts a SEND of `length` bytes from buffer offset `offset`; inline when it fits.
  absl::Status PostSend(size_t offset, size_t length, uint64_t wr_id, bool signaled);
  // RDMA WRITE of `length` bytes from local `offset` to the peer's buffer at `remote_offset`,
  // with immediate `imm` (consumes a receive at the peer) or without when `with_imm` is false.
  absl::Status PostWrite(size_t offset, size_t length, size_t remote_offset, uint64_t wr_id,
                         bool signaled, bool with_imm, uint32_t imm);

  // Busy-polls until one completion arrives or `timeout` passes (kDeadlineExceeded). A
  // completion with an error status returns that error (verbs_error.h).
  absl::StatusOr<Completion> Poll(absl::Duration timeout);

 private:
  friend class RcListener;
  RcEndpoint() = default;
  // Creates PD, CQ, buffer, MR and QP on `id`'s device.
  absl::Status SetUp(const RcOptions& options);
  BufferAdvert OwnAdvert() const;
  // Posts one work request on the send queue (SEND, WRITE or WRITE_WITH_IMM).
  absl::Status PostSendQueue(ibv_wr_opcode opcode, size_t offset, size_t length, uint64_t wr_id,
                             bool signaled, uint32_t imm, uint64_t remote_addr);
  // The scatter-gather entry for [offset, offset + length) of the registered buffer.
  ibv_sge Sge(size_t offset, size_t length) const;

  RcOptions options_;
  BufferAdvert peer_;
  uint32_t max_inline_ = 0;
  // Declared in creation order; destroyed in reverse.
  CmChannelOwner channel_;
  CmIdOwner id_;
  PdOwner pd_;
  CqOwner cq_;
  PageBuffer buffer_;
  MrOwner mr_;
  CmQpOwner qp_;
  bool connected_ = false;
};

class RcListener {
 public:
  // Listens on `addr`:`port`; port 0 picks a free one (see port()).
  static absl::StatusOr<std::unique_ptr<RcListener>> Create(const std::string& addr,
                                                            uint16_t port);
  uint16_t port() const;
  // Waits for one connection request, accepts it and returns the connected endpoint. A request
  // whose private data is not a valid BufferAdvert is rejected, and Accept returns
  // kFailedPrecondition.
  absl::StatusOr<std::unique_ptr<RcEndpoint>> Accept(const RcOptions& options,
                                                     absl::Duration timeout);

 private:
  RcListener() = default;
  CmChannelOwner channel_;
  CmIdOwner id_;
};

}  // namespace zrpc::transport

#endif  // ZRPC_TRANSPORT_RC_ENDPOINT_H_
