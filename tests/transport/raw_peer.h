// A zrpc peer written by hand over raw verbs and librdmacm, for tests that need a peer to break
// the rules on purpose: a Hello of its choosing, an RNR retry count of its choosing, RECVs fewer
// than it claims, frames that ignore credits, a handshake it never finishes.
#ifndef ZRPC_TESTS_TRANSPORT_RAW_PEER_H_
#define ZRPC_TESTS_TRANSPORT_RAW_PEER_H_

#include <arpa/inet.h>
#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "transport/cm_util.h"
#include "transport/verbs_owners.h"
#include "transport/wire.h"

namespace zrpc::testing {

class RawPeer {
 public:
  struct Options {
    uint32_t claimed_credits = 16;  // what its Hello claims
    uint32_t posted_recvs = 16;     // RECVs it really posts (and re-posts as they complete)
    uint8_t rnr_retry = transport::kRnrRetryCount;
    uint8_t retry = transport::kMaxRetryCount;  // the transport retries both queue pairs take
    uint8_t reads = 0;  // RDMA READs it may have outstanding (initiator depth): ReadRaw needs one
    std::vector<uint8_t> hello;  // sent as is instead of a Hello built from the above
  };
  static constexpr uint32_t kSlot = 4096;

  RawPeer() = default;
  RawPeer(const RawPeer&) = delete;
  RawPeer& operator=(const RawPeer&) = delete;
  ~RawPeer() {
    if (id_ != nullptr && established_) rdma_disconnect(id_.get());
  }

  // Sends a connection request to addr:port. With `finish`, waits for the handshake to end and
  // decodes the server's Hello; without, reads nothing more from its channel, so librdmacm never
  // confirms the server's reply: a handshake left silent half-way.
  absl::Status Connect(const std::string& addr, uint16_t port, const Options& options,
                       bool finish = true, absl::Duration timeout = absl::Seconds(30)) {
    absl::Time deadline = absl::Now() + timeout;
    options_ = options;
    if (auto s = transport::CreateCmChannelAndId(&channel_, &id_); !s.ok()) return s;
    if (auto s = transport::ResolveRoute(channel_.get(), id_.get(), "", addr, port, deadline);
        !s.ok()) {
      return s;
    }
    rdma_cm_id* id = id_.get();
    pd_.reset(ibv_alloc_pd(id->verbs));
    uint32_t slots = options.posted_recvs + 1;
    cq_.reset(ibv_create_cq(id->verbs, static_cast<int>(slots + 8), nullptr, nullptr, 0));
    if (pd_ == nullptr || cq_ == nullptr) return absl::InternalError("cannot create PD or CQ");
    ibv_qp_init_attr attr{};
    attr.send_cq = attr.recv_cq = cq_.get();
    attr.qp_type = IBV_QPT_RC;
    attr.cap.max_send_wr = 4;
    attr.cap.max_recv_wr = options.posted_recvs + 1;
    attr.cap.max_send_sge = attr.cap.max_recv_sge = 1;
    if (rdma_create_qp(id, pd_.get(), &attr) != 0) return absl::InternalError("rdma_create_qp");
    qp_.reset(id);
    buffer_.assign(size_t{slots} * kSlot, 0);
    mr_.reset(ibv_reg_mr(pd_.get(), buffer_.data(), buffer_.size(), IBV_ACCESS_LOCAL_WRITE));
    if (mr_ == nullptr) return absl::InternalError("ibv_reg_mr");
    for (uint32_t i = 0; i < options.posted_recvs; ++i) {
      if (!PostRecv(i)) return absl::InternalError("ibv_post_recv");
    }
    std::vector<uint8_t> hello = options.hello;
    if (hello.empty()) {
      transport::Hello h;
      h.recv_credits = options.claimed_credits;
      h.max_recv_credits = options.claimed_credits;
      h.recv_size = kSlot;
      hello.resize(transport::Hello::kSize);
      transport::EncodeHello(h, hello.data());
    }
    rdma_conn_param param = transport::ConnParam(hello.data(), static_cast<uint8_t>(hello.size()),
                                                 options.reads, options.reads);
    param.rnr_retry_count = options.rnr_retry;
    param.retry_count = options.retry;
    if (rdma_connect(id, &param) != 0) return absl::InternalError("rdma_connect");
    if (!finish) return absl::OkStatus();
    auto event = transport::ExpectCmEvent(channel_.get(), RDMA_CM_EVENT_ESTABLISHED, deadline);
    if (!event.ok()) return event.status();
    const auto* reply = static_cast<const uint8_t*>((*event)->param.conn.private_data);
    const size_t reply_size = reply != nullptr ? (*event)->param.conn.private_data_len : 0;
    reply_.assign(reply, reply + reply_size);
    remote_qp_num_ = (*event)->param.conn.qp_num;
    auto server = transport::DecodeHello(absl::MakeConstSpan(reply, reply_size));
    // A server that parks says where to knock, after its accept data (wire.h).
    if (server.ok() && (server->flags & transport::kHelloParks) != 0 &&
        reply_size >= transport::ParkDoor::kOffset + transport::ParkDoor::kSize) {
      auto door = transport::DecodeParkDoor(absl::MakeConstSpan(
          reply + transport::ParkDoor::kOffset, reply_size - transport::ParkDoor::kOffset));
      if (door.ok()) park_door_ = *door;
    }
    rdma_ack_cm_event(*event);
    established_ = true;
    if (!server.ok()) return server.status();
    server_ = *server;
    return absl::OkStatus();
  }

  // Hangs up now (a peer that leaves the moment it got in).
  void Disconnect() {
    if (established_) rdma_disconnect(id_.get());
    established_ = false;
  }

  const transport::Hello& server_hello() const { return server_; }
  // The accept reply's private data as it came, and the queue pair numbers the handshake named:
  // what a peer that authenticates by hand needs (auth.h).
  const std::vector<uint8_t>& reply() const { return reply_; }
  uint32_t remote_qp_num() const { return remote_qp_num_; }
  uint32_t qp_num() const { return qp_ != nullptr ? qp_->qp->qp_num : 0; }
  // The server's park door, when its Hello says it parks.
  const std::optional<transport::ParkDoor>& park_door() const { return park_door_; }
  // The start of its buffer: what WriteRaw sends.
  uint8_t* raw() { return buffer_.data(); }

  // Where the next Send's payload goes (after the frame header): write it before Send.
  uint8_t* payload() {
    return buffer_.data() + size_t{options_.posted_recvs} * kSlot + transport::FrameHeader::kSize;
  }

  // Sends one frame of `kind` returning `credits`, with `payload` bytes after the header,
  // credits or not, and waits for its completion while handling what arrives. With `invalidate`,
  // a SEND_WITH_INV of that key.
  absl::Status Send(transport::FrameKind kind, uint16_t credits, uint32_t payload,
                    absl::Duration timeout = absl::Seconds(30),
                    std::optional<uint32_t> invalidate = std::nullopt) {
    uint8_t* frame = buffer_.data() + size_t{options_.posted_recvs} * kSlot;
    transport::FrameHeader header;
    header.credits = credits;
    header.kind = kind;
    transport::EncodeFrameHeader(header, frame);
    ibv_sge sge{reinterpret_cast<uintptr_t>(frame),
                static_cast<uint32_t>(transport::FrameHeader::kSize + payload), mr_->lkey};
    ibv_send_wr wr{};
    wr.wr_id = kSendId;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_SEND;
    if (invalidate) {
      wr.opcode = IBV_WR_SEND_WITH_INV;
      wr.invalidate_rkey = *invalidate;
    }
    wr.send_flags = IBV_SEND_SIGNALED;
    ibv_send_wr* bad = nullptr;
    if (int rc = ibv_post_send(qp_->qp, &wr, &bad); rc != 0) {
      return absl::UnavailableError(absl::StrCat("ibv_post_send: ", rc));
    }
    send_done_ = false;
    absl::Time deadline = absl::Now() + timeout;
    while (!send_done_) {
      if (!send_status_.ok()) return send_status_;
      if (absl::Now() > deadline) return absl::DeadlineExceededError("send not completed");
      Poll();
    }
    return send_status_;
  }

  // RDMA-WRITEs `length` bytes of its buffer to `addr` under `rkey` (a key it should not hold,
  // say) and returns the completion's status, waiting for it while handling what arrives.
  // With `imm`, a WRITE_WITH_IMM carrying it (host order), which takes a receive at the peer.
  ibv_wc_status WriteRaw(uint64_t addr, uint32_t rkey, uint32_t length,
                         absl::Duration timeout = absl::Seconds(30),
                         std::optional<uint32_t> imm = std::nullopt) {
    ibv_sge sge{reinterpret_cast<uintptr_t>(buffer_.data()), length, mr_->lkey};
    ibv_send_wr wr{};
    wr.wr_id = kSendId;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_RDMA_WRITE;
    if (imm) {
      wr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
      wr.imm_data = htonl(*imm);
    }
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.wr.rdma.remote_addr = addr;
    wr.wr.rdma.rkey = rkey;
    ibv_send_wr* bad = nullptr;
    if (ibv_post_send(qp_->qp, &wr, &bad) != 0) return IBV_WC_GENERAL_ERR;
    return AwaitOwn(timeout);
  }

  // RDMA-READs `length` bytes (at most kReadBuffer) from `addr` under `rkey` into read_bytes()
  // and returns the completion's status, waiting for it while handling what arrives.
  static constexpr uint32_t kReadBuffer = 64 * 1024;
  ibv_wc_status ReadRaw(uint64_t addr, uint32_t rkey, uint32_t length,
                        absl::Duration timeout = absl::Seconds(30)) {
    if (length > kReadBuffer) return IBV_WC_LOC_LEN_ERR;
    if (read_mr_ == nullptr) {
      read_buffer_.assign(kReadBuffer, 0);
      read_mr_.reset(
          ibv_reg_mr(pd_.get(), read_buffer_.data(), read_buffer_.size(), IBV_ACCESS_LOCAL_WRITE));
      if (read_mr_ == nullptr) return IBV_WC_LOC_PROT_ERR;
    }
    ibv_sge sge{reinterpret_cast<uintptr_t>(read_buffer_.data()), length, read_mr_->lkey};
    ibv_send_wr wr{};
    wr.wr_id = kSendId;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_RDMA_READ;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.wr.rdma.remote_addr = addr;
    wr.wr.rdma.rkey = rkey;
    ibv_send_wr* bad = nullptr;
    if (ibv_post_send(qp_->qp, &wr, &bad) != 0) return IBV_WC_GENERAL_ERR;
    return AwaitOwn(timeout);
  }
  const uint8_t* read_bytes() const { return read_buffer_.data(); }

  // Handles the completions that are there: sends, and received frames (counted, re-posted).
  void Poll() {
    ibv_wc wcs[16];
    int n = ibv_poll_cq(cq_.get(), 16, wcs);
    for (int i = 0; i < n; ++i) {
      const ibv_wc& wc = wcs[i];
      if (wc.status != IBV_WC_SUCCESS) {
        send_status_ = absl::UnavailableError(
            absl::StrCat("completion failed: ", ibv_wc_status_str(wc.status)));
        continue;
      }
      if (wc.wr_id == kSendId) {
        send_done_ = true;
        continue;
      }
      auto index = static_cast<uint32_t>(wc.wr_id);
      auto header = transport::DecodeFrameHeader(
          absl::MakeConstSpan(buffer_.data() + size_t{index} * kSlot, wc.byte_len));
      if (header.ok()) {
        credits_returned += header->credits;
        if (header->kind == transport::FrameKind::kAuthOk) {
          ++auth_ok_frames;
        } else {
          (header->kind == transport::FrameKind::kCredit ? credit_frames : data_frames)++;
        }
        if (header->kind == transport::FrameKind::kData) {
          const uint8_t* data = buffer_.data() + size_t{index} * kSlot;
          last_data.assign(data + transport::FrameHeader::kSize, data + wc.byte_len);
        }
        if (header->kind == transport::FrameKind::kArena) {
          const uint8_t* data = buffer_.data() + size_t{index} * kSlot;
          auto message = transport::DecodeArenaMessage(absl::MakeConstSpan(
              data + transport::FrameHeader::kSize, transport::ArenaMessage::kSize));
          if (message.ok()) arena_messages.push_back(*message);
        }
      }
      PostRecv(index);
    }
  }

  uint64_t credit_frames = 0;      // credit frames received
  uint64_t data_frames = 0;        // data frames received
  uint64_t auth_ok_frames = 0;     // kAuthOk frames received
  uint64_t credits_returned = 0;   // credits the other side returned in them
  std::vector<uint8_t> last_data;  // the payload of the last data frame received
  std::vector<transport::ArenaMessage> arena_messages;  // loan messages received (kArena frames)

 private:
  static constexpr uint64_t kSendId = ~uint64_t{0};

  std::vector<uint8_t> reply_;
  uint32_t remote_qp_num_ = 0;

  // The status of this peer's own work request in flight (WriteRaw, ReadRaw), re-posting the
  // receives that complete meanwhile; IBV_WC_GENERAL_ERR if none within `timeout`.
  ibv_wc_status AwaitOwn(absl::Duration timeout) {
    const absl::Time deadline = absl::Now() + timeout;
    while (absl::Now() < deadline) {
      ibv_wc wc{};
      if (ibv_poll_cq(cq_.get(), 1, &wc) != 1) continue;
      if (wc.wr_id == kSendId) return wc.status;
      if (wc.status == IBV_WC_SUCCESS) PostRecv(static_cast<uint32_t>(wc.wr_id));
    }
    return IBV_WC_GENERAL_ERR;
  }

  bool PostRecv(uint32_t index) {
    ibv_sge sge{reinterpret_cast<uintptr_t>(buffer_.data() + size_t{index} * kSlot), kSlot,
                mr_->lkey};
    ibv_recv_wr wr{};
    wr.wr_id = index;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    ibv_recv_wr* bad = nullptr;
    return ibv_post_recv(qp_->qp, &wr, &bad) == 0;
  }

  Options options_;
  transport::Hello server_;
  std::optional<transport::ParkDoor> park_door_;
  bool established_ = false;
  bool send_done_ = false;
  absl::Status send_status_;
  // Destroyed in reverse: the MR, the QP, the CQ and PD, the id, its channel.
  transport::CmChannelOwner channel_;
  transport::CmIdOwner id_;
  transport::PdOwner pd_;
  transport::CqOwner cq_;
  transport::CmQpOwner qp_;
  std::vector<uint8_t> buffer_;
  transport::MrOwner mr_;
  std::vector<uint8_t> read_buffer_;  // ReadRaw's landing
  transport::MrOwner read_mr_;
};

}  // namespace zrpc::testing

#endif  // ZRPC_TESTS_TRANSPORT_RAW_PEER_H_
