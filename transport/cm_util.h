// librdmacm plumbing shared by every connection type: event channels that honour deadlines,
// typed event waits, and address parsing. Connection setup only; nothing here is on a datapath.
#ifndef ZRPC_TRANSPORT_CM_UTIL_H_
#define ZRPC_TRANSPORT_CM_UTIL_H_

#include <rdma/rdma_cma.h>
#include <sys/socket.h>

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "transport/options.h"
#include "transport/verbs_owners.h"

namespace zrpc::transport {

// Milliseconds left until `deadline`, rounded up, at least 0 (for poll() and rdma_resolve_*).
int RemainingMs(absl::Time deadline);

// Puts `fd` in non-blocking mode; `what` names it in the error.
absl::Status SetNonBlocking(int fd, const char* what);

// A GID as an IPv6 address ("fe80::..." or "::ffff:198.18.0.1").
std::string GidText(const ibv_gid& gid);

// A non-blocking event channel, so every wait can honour a deadline with poll().
absl::StatusOr<CmChannelOwner> CreateCmChannel();

// A non-blocking event channel and a TCP-port-space id reporting to it.
absl::Status CreateCmChannelAndId(CmChannelOwner* channel, CmIdOwner* id);

// The next event on `channel`, waiting until `deadline` (kDeadlineExceeded). The caller must
// rdma_ack_cm_event it.
absl::StatusOr<rdma_cm_event*> NextCmEvent(rdma_event_channel* channel, absl::Time deadline);

// Waits for an event of type `expected`; any other event is an error naming both, acked here.
// A rejection carrying text from a zrpc peer (its reason) quotes it. On success the caller must
// ack the returned event.
absl::StatusOr<rdma_cm_event*> ExpectCmEvent(rdma_event_channel* channel,
                                             rdma_cm_event_type expected, absl::Time deadline);

// Resolves `id` (reporting to `channel`) to `addr`:`port`: address, then route, by `deadline`.
// `src` is the local address to connect from; empty lets the routing table choose.
absl::Status ResolveRoute(rdma_event_channel* channel, rdma_cm_id* id, const std::string& src,
                          const std::string& addr, uint16_t port, absl::Time deadline);

// The most receiver-not-ready retries a side accepts being asked for (ConnectionOptions::
// rnr_retry_count; 6 by default). 7 would mean "forever"; with credits an RNR is a bug or a lying
// peer, so at most 6 retries and then an error that names it (IBV_WC_RNR_RETRY_EXC_ERR). Each
// side's queue pair gets the count the *other* side asked for, so both check it.
inline constexpr uint8_t kRnrRetryCount = 6;
// The most transport retries (ConnectionOptions::retry_count) a listener accepts from a
// connecting peer, whose count both queue pairs take. The IB spec makes 7 seven tries, but rxe
// takes it to mean "retry forever" (its completer never counts down from 7): a peer that stops
// acknowledging would never be found dead.
inline constexpr uint8_t kMaxRetryCount = 6;

// RDMA READs a queue pair may have outstanding, as initiator and as responder, at most: enough to
// keep a large transfer's pipeline full (each READ carries up to the port's max_msg_size).
inline constexpr uint8_t kMaxReadsInFlight = 16;

// Connection parameters carrying `data` as private data, with the retry counts `options` ask
// for (ConnectionOptions::retry_count, rnr_retry_count), RDMA READ with `initiator_depth`
// outstanding as initiator and `responder_resources` as responder (what the device allows, and
// on accept what the connecting side offered), and no atomics. `data` must outlive the
// rdma_connect / rdma_accept call.
rdma_conn_param ConnParam(const void* data, uint8_t length, uint8_t initiator_depth,
                          uint8_t responder_resources,
                          const ConnectionOptions& options = ConnectionOptions());

// The queue pair `id` will have, once connected or accepted, an ACK timeout of 4.096 us x
// 2^exponent (rdma_set_option RDMA_OPTION_ID_ACK_TIMEOUT; without it the kernel derives one
// from the route's packet lifetime). Call before rdma_connect or rdma_accept.
absl::Status SetAckTimeout(rdma_cm_id* id, uint8_t exponent);

// The queue pair's retry timing as the device holds it (ibv_query_qp).
struct RetryTiming {
  uint8_t ack_timeout_exponent = 0;
  uint8_t retry_count = 0;
  uint8_t rnr_retry_count = 0;
};
absl::StatusOr<RetryTiming> QueryRetryTiming(ibv_qp* qp);

// Refuses a connection request, telling the peer why in the rejection's private data (prefixed
// "zrpc: " so ExpectCmEvent on the other side quotes it).
void Reject(rdma_cm_id* id, const absl::Status& why);

// The peer of a connected or connecting id as "ip:port" (an IPv6 address in brackets:
// "[fe80::1]:4791"), and its IP alone (without brackets).
std::string PeerAddress(rdma_cm_id* id);
std::string PeerIp(rdma_cm_id* id);

// `addr` (numeric or a name) and `port` as a socket address.
absl::Status ResolveSockaddr(const std::string& addr, uint16_t port, sockaddr_storage* out);

}  // namespace zrpc::transport

#endif  // ZRPC_TRANSPORT_CM_UTIL_H_
