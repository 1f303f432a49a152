// Peer authentication on a connection (auth.h): the client's check of the server's reply, the
// kAuth and kAuthOk frames, and the handshake's outcome. The listener's part (the request, the
// deadline, OnAccepted) is in listener.cc.
//
// The order, on the wire and here:
//   client  Connect: the request carries its Hello and AuthRequest; at ESTABLISHED it checks the
//           server's tag (CheckServerAuth) and, open to nothing yet (kVerifying), sends kAuth
//           with the one credit the server's Hello offered;
//   server  the kAuth arrives in kVerifying (VerifyPeerLocked): the tag is checked and the
//           client's arena applied; the window stops being provisional and the connection opens,
//           and the kAuthOk goes in place of the credit frame the window's owed credits call for
//           (SendAuthFrameLocked), returning them all; then the outcome (FinishAuthLocked): the
//           listener hands the connection to OnAccepted;
//   client  the kAuthOk arrives in kVerifying: the server's arena and door applied, the
//           connection opens, the outcome wakes Connect.
// Until its outcome is OK a connection's failure is the handshake's: FailLocked settles the
// outcome with it, and OnClosed is not dispatched (DispatchOne): the layer above never knew it.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "transport/auth.h"
#include "transport/connection.h"
#include "transport/log.h"
#include "transport/poller.h"

namespace zrpc::transport {

absl::StatusOr<Hello> Connection::CheckServerAuth(const rdma_cm_event& event, Hello peer) {
  const bool server_authenticates = (peer.flags & kHelloAuth) != 0;
  if (auth_ == nullptr) {
    // A server with keys refuses a client without one at the request; an answer that says it
    // authenticates all the same is not from a zrpc server that keeps to the protocol.
    return absl::FailedPreconditionError(
        "zrpc handshake: the server authenticates, but this client presents no key");
  }
  if (!server_authenticates) {
    return absl::FailedPreconditionError(
        absl::StrCat("zrpc handshake: the server did not authenticate itself (its Hello does not "
                     "say so), but this client presents key ",
                     auth_->key_id()));
  }
  const auto* data = static_cast<const uint8_t*>(event.param.conn.private_data);
  const size_t length = event.param.conn.private_data_len;
  absl::StatusOr<AuthReply> reply = DecodeAuthReply(
      data != nullptr && length > AuthReply::kOffset
          ? absl::MakeConstSpan(data + AuthReply::kOffset, length - AuthReply::kOffset)
          : absl::Span<const uint8_t>());
  if (!reply.ok()) return reply.status();
  AuthTranscript& transcript = auth_->transcript();
  transcript.server_nonce = reply->nonce;
  // The server's queue pair as the CM's reply names it: the one this side's is connected to.
  transcript.server_qp = event.param.conn.qp_num;
  std::copy(data, data + Hello::kSize, transcript.server_hello.begin());
  if (absl::Status s = auth_->CheckPeerTag(reply->tag); !s.ok()) return s;
  return peer;
}

bool Connection::VerifyPeerLocked(const ibv_wc& wc, const uint8_t* frame) {
  const bool server = accepted_;
  const FrameKind expected = server ? FrameKind::kAuth : FrameKind::kAuthOk;
  if (wc.opcode != IBV_WC_RECV) {
    FailLocked(absl::FailedPreconditionError(
        server ? "the client wrote a bulk payload before its tag"
               : "the server wrote a bulk payload before confirming this client's tag"));
    return false;
  }
  if (absl::Status s = credits_.OnConsumed(); !s.ok()) {
    FailLocked(s);
    return false;
  }
  absl::StatusOr<FrameHeader> header = DecodeFrameHeader(absl::MakeConstSpan(frame, wc.byte_len));
  if (!header.ok()) {
    FailLocked(header.status());
    return false;
  }
  if (header->kind != expected) {
    FailLocked(absl::FailedPreconditionError(absl::StrCat(
        server ? "the client sent a frame of kind " : "the server sent a frame of kind ",
        static_cast<int>(header->kind),
        server ? " before its tag (kAuth)" : " before confirming this client's tag (kAuthOk)")));
    return false;
  }
  if (absl::Status s = credits_.OnReturned(header->credits); !s.ok()) {
    FailLocked(s);
    return false;
  }
  if (absl::Status s = arena_writer_.OnReleased(header->arena_released); !s.ok()) {
    FailLocked(s);
    return false;
  }
  const auto payload =
      absl::MakeConstSpan(frame + FrameHeader::kSize, wc.byte_len - FrameHeader::kSize);
  uint64_t arena_addr = 0;
  uint32_t arena_rkey = 0;
  if (server) {
    absl::StatusOr<AuthFrame> auth = DecodeAuthFrame(payload);
    if (!auth.ok()) {
      FailLocked(auth.status());
      return false;
    }
    if (absl::Status s = auth_->CheckPeerTag(auth->tag); !s.ok()) {
      FailLocked(s);
      return false;
    }
    arena_addr = auth->arena_addr;
    arena_rkey = auth->arena_rkey;
  } else {
    absl::StatusOr<AuthOkFrame> ok = DecodeAuthOkFrame(payload, (peer_.flags & kHelloParks) != 0);
    if (!ok.ok()) {
      FailLocked(ok.status());
      return false;
    }
    arena_addr = ok->arena_addr;
    arena_rkey = ok->arena_rkey;
    peer_door_ = ok->door;
  }
  if (absl::Status s = CheckAuthArena(peer_, arena_addr, arena_rkey); !s.ok()) {
    FailLocked(s);
    return false;
  }
  peer_.arena_addr = arena_addr;
  peer_.arena_rkey = arena_rkey;
  write_wr_.wr.rdma.rkey = arena_rkey;
  SetStateLocked(State::kOpen);
  if (server) {
    // The window is the client's now: what it owes (all but the credit the kAuth spent, and that
    // one once its receive is back) goes in the kAuthOk, which the credit frame's path sends.
    credits_.Confirm();
    auth_frame_owed_ = true;
  } else {
    FinishAuthLocked();
  }
  return true;
}

void Connection::SendAuthFrameLocked() {
  auth_frame_owed_ = false;
  uint8_t* payload = device_.slots().data(control_slot_) + FrameHeader::kSize;
  if (!accepted_) {
    absl::StatusOr<AuthTag> tag = auth_->OwnTag();
    if (!tag.ok()) return FailLocked(tag.status());
    AuthFrame frame;
    frame.tag = *tag;
    if (arena_mr_ != nullptr) {
      frame.arena_addr = reinterpret_cast<uintptr_t>(arena_.get());
      frame.arena_rkey = arena_mr_->rkey;
    }
    EncodeAuthFrame(frame, payload);
    PostMessageLocked(control_slot_, AuthFrame::kSize, FrameKind::kAuth, 0, false,
                      /*signal=*/true);
    return;
  }
  AuthOkFrame frame;
  if (arena_mr_ != nullptr) {
    frame.arena_addr = reinterpret_cast<uintptr_t>(arena_.get());
    frame.arena_rkey = arena_mr_->rkey;
  }
  if (door_.has_value()) frame.door = poller_.doors()->Describe(*door_);
  EncodeAuthOkFrame(frame, payload);
  PostMessageLocked(control_slot_, AuthOkFrame::kSize, FrameKind::kAuthOk, 0, false,
                    /*signal=*/true);
  FinishAuthLocked();
}

void Connection::FinishAuthLocked() {
  if (auth_->Finish(absl::OkStatus())) return;
  // Settled already: the listener gave up waiting (its deadline), or the client's Connect did.
  FailLocked(auth_->outcome());
}

}  // namespace zrpc::transport
