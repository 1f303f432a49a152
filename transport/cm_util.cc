#include "transport/cm_util.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "transport/verbs_error.h"

namespace zrpc::transport {
namespace {

// The printable prefix of a rejection's private data, if a zrpc peer put its reason there.
std::string RejectReason(const rdma_cm_event& event) {
  const auto* data = static_cast<const char*>(event.param.conn.private_data);
  size_t len = event.param.conn.private_data_len;
  if (data == nullptr || len < 4 || std::strncmp(data, "zrpc", 4) != 0) return "";
  std::string reason;
  for (size_t i = 0; i < len && data[i] != '\0'; ++i) {
    reason += (data[i] >= 0x20 && data[i] < 0x7f) ? data[i] : '?';
  }
  return reason;
}

// Private data a rejection can carry (IB CM REJ).
constexpr size_t kMaxRejectData = 148;

}  // namespace

int RemainingMs(absl::Time deadline) {
  absl::Duration left = deadline - absl::Now();
  if (left <= absl::ZeroDuration()) return 0;
  return static_cast<int>(std::min<int64_t>(absl::ToInt64Milliseconds(left) + 1, 1 << 30));
}

absl::Status SetNonBlocking(int fd, const char* what) {
  int flags = fcntl(fd, F_GETFL);
  if (flags < 0 || fcntl(fd, F_SETFL, flags | O_NONBLOCK) < 0) {
    return VerbsError(absl::StrCat("fcntl(O_NONBLOCK) on ", what), errno);
  }
  return absl::OkStatus();
}

std::string GidText(const ibv_gid& gid) {
  char text[INET6_ADDRSTRLEN] = "?";
  inet_ntop(AF_INET6, gid.raw, text, sizeof(text));
  return text;
}

absl::StatusOr<CmChannelOwner> CreateCmChannel() {
  CmChannelOwner channel(rdma_create_event_channel());
  if (channel == nullptr) return VerbsError("rdma_create_event_channel", errno);
  if (auto s = SetNonBlocking(channel->fd, "the rdma_cm channel"); !s.ok()) return s;
  return channel;
}

absl::Status CreateCmChannelAndId(CmChannelOwner* channel, CmIdOwner* id) {
  auto created = CreateCmChannel();
  if (!created.ok()) return created.status();
  *channel = std::move(*created);
  rdma_cm_id* raw = nullptr;
  if (rdma_create_id(channel->get(), &raw, nullptr, RDMA_PS_TCP) != 0) {
    return VerbsError("rdma_create_id", errno);
  }
  id->reset(raw);
  return absl::OkStatus();
}

absl::StatusOr<rdma_cm_event*> NextCmEvent(rdma_event_channel* channel, absl::Time deadline) {
  for (;;) {
    rdma_cm_event* event = nullptr;
    if (rdma_get_cm_event(channel, &event) == 0) return event;
    if (errno != EAGAIN && errno != EINTR) return VerbsError("rdma_get_cm_event", errno);
    int ms = RemainingMs(deadline);
    if (ms == 0) return absl::DeadlineExceededError("timed out waiting for an rdma_cm event");
    pollfd pfd{channel->fd, POLLIN, 0};
    if (poll(&pfd, 1, ms) < 0 && errno != EINTR) return VerbsError("poll", errno);
  }
}

absl::StatusOr<rdma_cm_event*> ExpectCmEvent(rdma_event_channel* channel,
                                             rdma_cm_event_type expected, absl::Time deadline) {
  absl::StatusOr<rdma_cm_event*> event = NextCmEvent(channel, deadline);
  if (!event.ok()) {
    return absl::Status(event.status().code(), absl::StrCat(event.status().message(), " (",
                                                            rdma_event_str(expected), ")"));
  }
  if ((*event)->event == expected) return event;
  rdma_cm_event_type got = (*event)->event;
  std::string what = absl::StrCat("expected ", rdma_event_str(expected), ", got ",
                                  rdma_event_str(got), " (status ", (*event)->status, ")");
  std::string reason = got == RDMA_CM_EVENT_REJECTED ? RejectReason(**event) : "";
  rdma_ack_cm_event(*event);
  if (!reason.empty()) return absl::UnavailableError("connection refused by the peer: " + reason);
  if (got == RDMA_CM_EVENT_REJECTED) {
    return absl::UnavailableError("connection refused (nothing listening there?): " + what);
  }
  return absl::UnavailableError(what);
}

absl::Status ResolveRoute(rdma_event_channel* channel, rdma_cm_id* id, const std::string& src,
                          const std::string& addr, uint16_t port, absl::Time deadline) {
  sockaddr_storage local{}, remote{};
  if (!src.empty()) {
    if (auto s = ResolveSockaddr(src, 0, &local); !s.ok()) return s;
  }
  if (auto s = ResolveSockaddr(addr, port, &remote); !s.ok()) return s;
  // The kernel refuses a timeout of 0 with EINVAL: a deadline that passed between two steps
  // must read as what it is, not as a broken address.
  auto passed = [&](const char* step) {
    return absl::DeadlineExceededError(
        absl::StrCat("the connect deadline passed before ", step, " (", addr, ")"));
  };
  if (RemainingMs(deadline) == 0) return passed("rdma_resolve_addr");
  if (rdma_resolve_addr(id, src.empty() ? nullptr : reinterpret_cast<sockaddr*>(&local),
                        reinterpret_cast<sockaddr*>(&remote), RemainingMs(deadline)) != 0) {
    return VerbsError("rdma_resolve_addr", errno);
  }
  auto event = ExpectCmEvent(channel, RDMA_CM_EVENT_ADDR_RESOLVED, deadline);
  if (!event.ok()) return event.status();
  rdma_ack_cm_event(*event);
  if (RemainingMs(deadline) == 0) return passed("rdma_resolve_route");
  if (rdma_resolve_route(id, RemainingMs(deadline)) != 0) {
    return VerbsError("rdma_resolve_route", errno);
  }
  event = ExpectCmEvent(channel, RDMA_CM_EVENT_ROUTE_RESOLVED, deadline);
  if (!event.ok()) return event.status();
  rdma_ack_cm_event(*event);
  return absl::OkStatus();
}

rdma_conn_param ConnParam(const void* data, uint8_t length, uint8_t initiator_depth,
                          uint8_t responder_resources, const ConnectionOptions& options) {
  rdma_conn_param param{};
  param.private_data = data;
  param.private_data_len = length;
  param.retry_count = options.retry_count;
  param.rnr_retry_count = options.rnr_retry_count;
  param.initiator_depth = initiator_depth;
  param.responder_resources = responder_resources;
  return param;
}

absl::Status SetAckTimeout(rdma_cm_id* id, uint8_t exponent) {
  if (rdma_set_option(id, RDMA_OPTION_ID, RDMA_OPTION_ID_ACK_TIMEOUT, &exponent,
                      sizeof(exponent)) != 0) {
    return VerbsError(absl::StrCat("rdma_set_option(RDMA_OPTION_ID_ACK_TIMEOUT, ", exponent, ")"),
                      errno);
  }
  return absl::OkStatus();
}

absl::StatusOr<RetryTiming> QueryRetryTiming(ibv_qp* qp) {
  ibv_qp_attr attr{};
  ibv_qp_init_attr init{};
  if (const int rc =
          ibv_query_qp(qp, &attr, IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY, &init);
      rc != 0) {
    return VerbsError("ibv_query_qp", rc);
  }
  return RetryTiming{attr.timeout, attr.retry_cnt, attr.rnr_retry};
}

void Reject(rdma_cm_id* id, const absl::Status& why) {
  std::string text(why.message());
  if (text.rfind("zrpc", 0) != 0) text = "zrpc: " + text;  // the peer looks for this prefix
  text.resize(std::min(text.size(), kMaxRejectData - 1));
  rdma_reject(id, text.c_str(), static_cast<uint8_t>(text.size() + 1));
}

std::string PeerIp(rdma_cm_id* id) {
  char text[INET6_ADDRSTRLEN] = "?";
  sockaddr* sa = rdma_get_peer_addr(id);
  if (sa->sa_family == AF_INET) {
    inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(sa)->sin_addr, text, sizeof(text));
  } else if (sa->sa_family == AF_INET6) {
    inet_ntop(AF_INET6, &reinterpret_cast<sockaddr_in6*>(sa)->sin6_addr, text, sizeof(text));
  }
  return text;
}

std::string PeerAddress(rdma_cm_id* id) {
  const bool v6 = rdma_get_peer_addr(id)->sa_family == AF_INET6;
  return absl::StrCat(v6 ? "[" : "", PeerIp(id), v6 ? "]:" : ":", ntohs(rdma_get_dst_port(id)));
}

absl::Status ResolveSockaddr(const std::string& addr, uint16_t port, sockaddr_storage* out) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* res = nullptr;
  std::string service = std::to_string(port);
  int rc = getaddrinfo(addr.c_str(), service.c_str(), &hints, &res);
  if (rc != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot resolve '", addr, "': ", gai_strerror(rc)));
  }
  std::memcpy(out, res->ai_addr, res->ai_addrlen);
  freeaddrinfo(res);
  return absl::OkStatus();
}

}  // namespace zrpc::transport
