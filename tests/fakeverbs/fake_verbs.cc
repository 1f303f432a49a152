// The in-memory verbs and rdma_cm of fake_verbs.h. One lock guards the whole fabric: the fake's
// cost and contention are not what is measured, and one lock keeps every transfer atomic and in
// the order it was posted.
#include "tests/fakeverbs/fake_verbs.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <netinet/in.h>
#include <poll.h>
#include <rdma/rdma_cma.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <vector>

// verbs.h makes these macros over inline wrappers; the wrappers call the functions defined here.
#undef ibv_query_port
#undef ibv_reg_mr

namespace zrpc::fakeverbs {
namespace {

// A bug in the code under test that real hardware would punish asynchronously (a CQ overrun):
// here it stops the test at once, saying what happened.
[[noreturn]] void Die(const char* what) {
  std::fprintf(stderr, "fakeverbs: %s\n", what);
  std::abort();
}

struct FakeQp;

}  // namespace

namespace entry {
int PostSend(ibv_qp* qp, ibv_send_wr* wr, ibv_send_wr** bad);
int PostRecv(ibv_qp* qp, ibv_recv_wr* wr, ibv_recv_wr** bad);
int PostSrqRecv(ibv_srq* srq, ibv_recv_wr* wr, ibv_recv_wr** bad);
int PollCq(ibv_cq* cq, int n, ibv_wc* wc);
int ReqNotifyCq(ibv_cq* cq, int solicited_only);
ibv_mw* AllocMw(ibv_pd* pd, ibv_mw_type type);
int DeallocMw(ibv_mw* mw);
}  // namespace entry

namespace {

struct FakeCq {
  ibv_cq cq{};  // first: an ibv_cq* is a FakeCq*
  std::deque<ibv_wc> wcs;
  int capacity = 0;
  bool armed = false;
};

struct FakeCompChannel {
  ibv_comp_channel channel{};
  std::deque<FakeCq*> events;  // one per arming that fired, in order
};

struct FakeMr {
  ibv_mr mr{};
  int access = 0;
};

// A type-2 memory window: free, or bound to one QP over a range of a region. Its rkey's upper 24
// bits are its index; the low byte is what the last bind set.
struct FakeMw {
  ibv_mw mw{};  // first: an ibv_mw* is a FakeMw*
  // The device's key for it, which the consumer's ibv_mw::rkey must name in a bind (as rxe's
  // kernel checks): verbs leave updating that field after a type-2 bind to the consumer.
  uint32_t key = 0;
  FakeQp* qp = nullptr;  // bound to it; null while free
  uint64_t addr = 0, length = 0;
  int access = 0;
};

// A SEND or WRITE WITH IMMEDIATE that found no RECV posted: it waits at its receiver, as an RC
// requester retries a receiver-not-ready NAK (forever: zrpc asks for RNR retry 7).
struct Pending {
  FakeQp* from = nullptr;
  uint64_t wr_id = 0;
  bool signaled = false;
  bool with_imm = false;
  uint32_t imm = 0;       // network order, as posted
  bool with_inv = false;  // a SEND_WITH_INV: the window key it invalidates at its receiver
  uint32_t inv_rkey = 0;
  ibv_wr_opcode opcode = IBV_WR_SEND;
  std::vector<uint8_t> bytes;  // a SEND's gathered bytes
  uint32_t write_length = 0;   // a WRITE WITH IMMEDIATE's length (its bytes already landed)
};

struct RecvWr {
  uint64_t wr_id = 0;
  std::vector<ibv_sge> sges;
};

// A shared receive queue: its RECVs serve every QP attached to it, in the order posted. As on rxe,
// a QP's error flushes none of them.
struct FakeSrq {
  ibv_srq srq{};  // first: an ibv_srq* is a FakeSrq*
  uint32_t max_wr = 0, max_sge = 0;
  std::deque<RecvWr> recvs;
  std::vector<FakeQp*> qps;  // attached and not yet destroyed
};

struct FakeQp {
  ibv_qp qp{};  // first: an ibv_qp* is a FakeQp*
  FakeQp* peer = nullptr;
  FakeSrq* srq = nullptr;  // its RECVs' queue when set, else `recvs`
  bool error = false;
  bool lose_flushes = false;  // HangUp's Flushes::kLost: sends posted in error vanish
  bool sq_sig_all = false;
  uint32_t max_send_wr = 0, max_recv_wr = 0, max_send_sge = 0, max_recv_sge = 0;
  uint32_t max_inline = 0;
  // Retry timing as the CM leaves it (rdma_connect, rdma_accept): what ibv_query_qp reports.
  uint8_t timeout = 0, retry_cnt = 0, rnr_retry = 0;
  std::deque<RecvWr> recvs;
  std::deque<Pending> waiting;  // the peer's sends that found no RECV here
  // Asynchronous events naming it that were fetched and not yet acked: its destruction waits for
  // them, as a real device's does (an event's reader may look at the QP until it acks).
  uint64_t events_out = 0;
  // Capabilities::like_rxe: the send work requests posted and not known to be retired (no
  // signalled completion at or after one was polled yet), oldest first, and whether each is a bind.
  std::deque<std::pair<uint64_t, bool>> unretired;
};

struct FakeId;

struct FakeEvent {
  rdma_cm_event event{};  // first: an rdma_cm_event* is a FakeEvent*
  std::vector<uint8_t> private_data;
  // The id whose destruction waits for this event's ack once it is fetched: the listening id
  // for a connect request, else the event's id (librdmacm counts them the same way).
  FakeId* owner = nullptr;
};

struct FakeEventChannel {
  rdma_event_channel channel{};
  std::deque<FakeEvent*> events;
};

struct FakeId {
  rdma_cm_id id{};  // first: an rdma_cm_id* is a FakeId*
  FakeId* peer = nullptr;
  bool listening = false;
  bool bound = false;
  bool connected = false;
  bool disconnected = false;  // DISCONNECTED was queued to this id
  bool passive = false;       // made by a connect request, on the listening side
  uint64_t ordinal = 0;       // the calling end's Counters::connects after its rdma_connect
  uint16_t port = 0;          // host order
  // Events fetched (rdma_get_cm_event) and acked (rdma_ack_cm_event): rdma_destroy_id waits
  // until they are equal, as librdmacm's does, so a thread that fetched an event may read its id
  // until it acks it.
  uint64_t events_fetched = 0;
  uint64_t events_acked = 0;
  // rdma_set_option(RDMA_OPTION_ID_ACK_TIMEOUT), or, when nobody chose, a stand-in for the one
  // the kernel derives from the route (a value no zrpc option has as its default).
  uint8_t ack_timeout = 17;
  uint8_t requested_rnr_retry = 0;  // a connecting id's rdma_conn_param::rnr_retry_count
};

std::mutex mu;
std::condition_variable acked;  // an event was acked (FakeId::events_acked), under mu

// Asynchronous events (Capabilities::async_events): queued here, the context's async_fd (an
// eventfd) readable while any waits. LAST_WQE_REACHED events are kept apart while
// HoldLastWqeEvents holds them. Under mu.
std::deque<ibv_async_event> async_queue;
std::deque<ibv_async_event> async_held;
bool hold_last_wqe = false;
std::condition_variable async_acked;  // an async event naming a QP was acked (FakeQp::events_out)
Counters stats;
ibv_device device{};
ibv_context context{};
ibv_context* device_list[2] = {&context, nullptr};
uint32_t next_key = 0x1000;
uint32_t next_qp_num = 0x11;
uint16_t next_port = 40000;
std::map<uint32_t, FakeMr*> mrs;  // by key (lkey == rkey)
// Windows by index (rkey >> 8). Indexes start far above any region's key, so the two never meet.
std::map<uint32_t, FakeMw*> mws;
uint32_t next_mw_index = 0x100000;
std::map<uint16_t, FakeId*> listeners;
std::map<uint64_t, FakeId*> by_ordinal;  // calling ends (FakeId::ordinal) not yet destroyed
std::map<uint32_t, FakeQp*> qps;         // by number, not yet destroyed

void Signal(int fd) {
  uint64_t one = 1;
  if (write(fd, &one, sizeof(one)) != sizeof(one)) Die("cannot write an eventfd");
}
void Unsignal(int fd) {
  uint64_t count = 0;
  // EFD_SEMAPHORE: each read takes one. Non-blocking: only called when one is there.
  if (read(fd, &count, sizeof(count)) != sizeof(count)) Die("cannot read an eventfd");
}
int MakeEventFd() { return eventfd(0, EFD_SEMAPHORE | EFD_CLOEXEC); }
bool NonBlocking(int fd) { return (fcntl(fd, F_GETFL) & O_NONBLOCK) != 0; }

// The oldest event of a channel (completion or cm) whose readiness is eventfd `fd`: at once, or
// -1 with EAGAIN when there is none and `fd` is non-blocking, or after waiting for one.
// `taken` runs on the event under the lock that took it.
template <typename T, typename Taken>
int TakeEvent(std::deque<T*>* events, int fd, T** out, Taken taken) {
  for (;;) {
    {
      std::lock_guard<std::mutex> lock(mu);
      if (!events->empty()) {
        *out = events->front();
        events->pop_front();
        Unsignal(fd);
        taken(*out);
        return 0;
      }
      if (NonBlocking(fd)) {
        errno = EAGAIN;
        return -1;
      }
    }
    pollfd pfd{fd, POLLIN, 0};
    poll(&pfd, 1, -1);
  }
}

void Complete(ibv_cq* cq, const ibv_wc& wc) {
  auto* fake = reinterpret_cast<FakeCq*>(cq);
  if (static_cast<int>(fake->wcs.size()) >= fake->capacity) Die("completion queue overrun");
  fake->wcs.push_back(wc);
  ++stats.completions;
  if (wc.status != IBV_WC_SUCCESS) ++stats.errors;
  if (fake->armed && cq->channel != nullptr) {
    fake->armed = false;
    reinterpret_cast<FakeCompChannel*>(cq->channel)->events.push_back(fake);
    ++stats.cq_events;
    Signal(cq->channel->fd);
  }
}

ibv_wc Wc(const FakeQp* qp, uint64_t wr_id, ibv_wc_status status, ibv_wc_opcode opcode) {
  ibv_wc wc{};
  wc.wr_id = wr_id;
  wc.status = status;
  wc.opcode = opcode;
  wc.qp_num = qp->qp.qp_num;
  return wc;
}

void ToError(FakeQp* qp);

// Completes the requester's side of `p` with `status` (when signalled or failed).
void CompleteRequester(const Pending& p, ibv_wc_status status) {
  if (p.from == nullptr) return;
  if (status == IBV_WC_SUCCESS && !p.signaled) return;
  Complete(p.from->qp.send_cq, Wc(p.from, p.wr_id, status,
                                  p.opcode == IBV_WR_SEND || p.opcode == IBV_WR_SEND_WITH_IMM ||
                                          p.opcode == IBV_WR_SEND_WITH_INV
                                      ? IBV_WC_SEND
                                      : IBV_WC_RDMA_WRITE));
}

// Queues `event` for the context's reader (or, a LAST_WQE_REACHED while held, keeps it).
void RaiseAsync(const ibv_async_event& event) {
  if (context.async_fd < 0) return;  // no event file: nothing raised
  if (hold_last_wqe && event.event_type == IBV_EVENT_QP_LAST_WQE_REACHED) {
    async_held.push_back(event);
    return;
  }
  async_queue.push_back(event);
  Signal(context.async_fd);
}

void RaiseLastWqe(FakeQp* qp) {
  ibv_async_event event{};
  event.event_type = IBV_EVENT_QP_LAST_WQE_REACHED;
  event.element.qp = &qp->qp;
  RaiseAsync(event);
}

// The peer's sends waiting at `qp` fail as a dead peer's do, and put their requester in error.
void FailWaiting(FakeQp* qp) {
  std::deque<Pending> waiting = std::move(qp->waiting);
  qp->waiting.clear();
  for (const Pending& p : waiting) {
    CompleteRequester(p, IBV_WC_RETRY_EXC_ERR);
    if (p.from != nullptr) ToError(p.from);
  }
}

// Every posted RECV comes back flushed; the peer's sends waiting here fail as a dead peer's do.
void ToError(FakeQp* qp) {
  if (qp->error) return;
  qp->error = true;
  qp->qp.state = IBV_QPS_ERR;
  // A QP of a shared receive queue in error: none of the queue's receives can complete for it
  // any more (the stand-in completes each when it arrives), which the specification's
  // LAST_WQE_REACHED says.
  if (qp->srq != nullptr) RaiseLastWqe(qp);
  while (!qp->recvs.empty()) {
    Complete(qp->qp.recv_cq, Wc(qp, qp->recvs.front().wr_id, IBV_WC_WR_FLUSH_ERR, IBV_WC_RECV));
    qp->recvs.pop_front();
  }
  FailWaiting(qp);
  // This side's own sends waiting at the peer: flushed.
  if (qp->peer != nullptr) {
    auto& theirs = qp->peer->waiting;
    for (auto it = theirs.begin(); it != theirs.end();) {
      if (it->from != qp) {
        ++it;
        continue;
      }
      CompleteRequester(*it, IBV_WC_WR_FLUSH_ERR);
      it = theirs.erase(it);
    }
  }
}

// The registered region [addr, addr + length) lies in, with `access`, or null.
FakeMr* FindMr(uint32_t key, uint64_t addr, uint64_t length, int access) {
  auto it = mrs.find(key);
  if (it == mrs.end()) return nullptr;
  FakeMr* mr = it->second;
  const auto start = reinterpret_cast<uint64_t>(mr->mr.addr);
  if (addr < start || addr + length > start + mr->mr.length || addr + length < addr) {
    return nullptr;
  }
  if (access != 0 && (mr->access & access) != access) return nullptr;
  return mr;
}

// Whether a remote access with `key` to [addr, addr + length) for `access`, arriving on `at`, is
// allowed: by a region's key (any QP of the device, as a region's rkey is), or by a window bound
// to `at` under exactly that key (another QP's key, a stale key byte or a free window: no).
bool RemoteAccessOk(uint32_t key, uint64_t addr, uint64_t length, int access, const FakeQp* at) {
  if (FindMr(key, addr, length, access) != nullptr) return true;
  auto it = mws.find(key >> 8);
  if (it == mws.end()) return false;
  const FakeMw* mw = it->second;
  if (mw->qp == nullptr || mw->qp != at || mw->key != key) return false;
  if (addr < mw->addr || addr + length > mw->addr + mw->length || addr + length < addr) {
    return false;
  }
  return (mw->access & access) == access;
}

// Windows bound to `qp` become free (the QP is gone: its keys must open nothing).
void FreeWindowsOf(const FakeQp* qp) {
  for (auto& [index, mw] : mws) {
    if (mw->qp == qp) mw->qp = nullptr;
  }
}

// The RECVs a SEND to `qp` lands in: its shared queue's, or its own.
std::deque<RecvWr>& Recvs(FakeQp* qp) { return qp->srq != nullptr ? qp->srq->recvs : qp->recvs; }

// Lands `p` in the RECV at the front of `to`'s queue (which must have one).
void Deliver(FakeQp* to, const Pending& p) {
  RecvWr recv = std::move(Recvs(to).front());
  Recvs(to).pop_front();
  ibv_wc wc = Wc(to, recv.wr_id, IBV_WC_SUCCESS, IBV_WC_RECV);
  wc.src_qp = p.from != nullptr ? p.from->qp.qp_num : 0;
  if (p.with_imm) {
    wc.wc_flags |= IBV_WC_WITH_IMM;
    wc.imm_data = p.imm;
  }
  if (p.with_inv) {
    // As the specification has it for a type-2B window (o10-37.2.x): only a window bound to the
    // receiving QP, under exactly that key; anything else is an invalid request, and both sides
    // go to error.
    auto it = mws.find(p.inv_rkey >> 8);
    FakeMw* mw = it != mws.end() ? it->second : nullptr;
    if (mw == nullptr || mw->qp != to || mw->key != p.inv_rkey) {
      Recvs(to).push_front(std::move(recv));
      CompleteRequester(p, IBV_WC_REM_INV_REQ_ERR);
      if (p.from != nullptr) ToError(p.from);
      ToError(to);
      return;
    }
    mw->qp = nullptr;  // invalidated: its key opens nothing until bound again
    wc.wc_flags |= IBV_WC_WITH_INV;
    wc.invalidated_rkey = p.inv_rkey;
  }
  if (p.opcode == IBV_WR_RDMA_WRITE_WITH_IMM) {
    wc.opcode = IBV_WC_RECV_RDMA_WITH_IMM;
    wc.byte_len = p.write_length;
  } else {
    size_t room = 0;
    for (const ibv_sge& sge : recv.sges) room += sge.length;
    if (p.bytes.size() > room) {
      Complete(to->qp.recv_cq, Wc(to, recv.wr_id, IBV_WC_LOC_LEN_ERR, IBV_WC_RECV));
      CompleteRequester(p, IBV_WC_REM_INV_REQ_ERR);
      if (p.from != nullptr) ToError(p.from);
      ToError(to);
      return;
    }
    size_t done = 0;
    for (const ibv_sge& sge : recv.sges) {
      const size_t n = std::min<size_t>(sge.length, p.bytes.size() - done);
      if (n == 0) break;
      std::memcpy(reinterpret_cast<void*>(sge.addr), p.bytes.data() + done, n);
      done += n;
    }
    wc.byte_len = static_cast<uint32_t>(p.bytes.size());
    ++stats.sends;
  }
  Complete(to->qp.recv_cq, wc);
  CompleteRequester(p, IBV_WC_SUCCESS);
}

// Sends a request that consumes a RECV at the peer, now or when one is posted.
void SendToPeer(FakeQp* qp, Pending p) {
  FakeQp* peer = qp->peer;
  if (peer == nullptr || peer->error) {
    CompleteRequester(p, IBV_WC_RETRY_EXC_ERR);
    ToError(qp);
    return;
  }
  if (Recvs(peer).empty()) {
    peer->waiting.push_back(std::move(p));
    return;
  }
  Deliver(peer, p);
}

// ibv_reg_mr and ibv_reg_mr_iova2 (neither calls the other: no entry point calls another).
ibv_mr* RegisterMemory(ibv_pd* pd, void* addr, size_t length, int access) {
  std::lock_guard<std::mutex> lock(mu);
  auto* mr = new FakeMr;
  mr->mr.context = pd->context;
  mr->mr.pd = pd;
  mr->mr.addr = addr;
  mr->mr.length = length;
  mr->mr.lkey = mr->mr.rkey = next_key++;
  mr->access = access;
  mrs[mr->mr.lkey] = mr;
  return &mr->mr;
}

void InitDevice() {
  static std::once_flag once;
  std::call_once(once, [] {
    std::snprintf(device.name, sizeof(device.name), "fake0");
    std::snprintf(device.dev_name, sizeof(device.dev_name), "fake0");
    device.node_type = IBV_NODE_CA;
    device.transport_type = IBV_TRANSPORT_IB;
    context.device = &device;
    context.ops.poll_cq = entry::PollCq;
    context.ops.req_notify_cq = entry::ReqNotifyCq;
    context.ops.post_send = entry::PostSend;
    context.ops.post_recv = entry::PostRecv;
    context.ops.post_srq_recv = entry::PostSrqRecv;
    context.ops.alloc_mw = entry::AllocMw;
    context.ops.dealloc_mw = entry::DeallocMw;
    context.cmd_fd = -1;
    context.async_fd = -1;
    context.num_comp_vectors = 1;
  });
}

// The IPv4 address of kAddress as a RoCE v2 GID (::ffff:a.b.c.d).
ibv_gid AddressGid() {
  ibv_gid gid{};
  gid.raw[10] = 0xff;
  gid.raw[11] = 0xff;
  inet_pton(AF_INET, kAddress, gid.raw + 12);
  return gid;
}

bool IsFakeAddress(const sockaddr* addr) {
  if (addr == nullptr || addr->sa_family != AF_INET) return false;
  in_addr mine{};
  inet_pton(AF_INET, kAddress, &mine);
  return reinterpret_cast<const sockaddr_in*>(addr)->sin_addr.s_addr == mine.s_addr;
}

void SetPort(sockaddr_storage* where, uint16_t port) {
  reinterpret_cast<sockaddr_in*>(where)->sin_port = htons(port);
}
uint16_t PortOf(const sockaddr_storage& where) {
  return ntohs(reinterpret_cast<const sockaddr_in*>(&where)->sin_port);
}

uint16_t EphemeralPort() {
  while (listeners.count(next_port) != 0) ++next_port;
  return next_port++;
}

// Queues `type` for `id` on its channel (an id without one, made for rdma_bind_addr alone, gets
// no events).
void Queue(FakeId* id, rdma_cm_event_type type, int status = 0,
           const rdma_conn_param* param = nullptr, FakeId* listen_id = nullptr) {
  auto* channel = reinterpret_cast<FakeEventChannel*>(id->id.channel);
  if (channel == nullptr) return;
  auto* e = new FakeEvent;
  e->event.id = &id->id;
  e->event.listen_id = listen_id != nullptr ? &listen_id->id : nullptr;
  e->owner = listen_id != nullptr ? listen_id : id;
  e->event.event = type;
  e->event.status = status;
  if (param != nullptr) {
    e->event.param.conn = *param;
    const auto* data = static_cast<const uint8_t*>(param->private_data);
    if (data != nullptr) e->private_data.assign(data, data + param->private_data_len);
    e->event.param.conn.private_data = e->private_data.empty() ? nullptr : e->private_data.data();
    e->event.param.conn.private_data_len = static_cast<uint8_t>(e->private_data.size());
  }
  channel->events.push_back(e);
  Signal(channel->channel.fd);
}

// Drops the events `id` has not fetched from `channel`. A connect request to a listening `id`
// goes with its unaccepted id, and the caller hears it was rejected (as the kernel does).
void DropEvents(FakeEventChannel* channel, FakeId* id) {
  if (channel == nullptr) return;
  for (auto it = channel->events.begin(); it != channel->events.end();) {
    FakeEvent* e = *it;
    if (e->event.id != &id->id && e->owner != id) {
      ++it;
      continue;
    }
    if (e->event.id != &id->id) {
      auto* child = reinterpret_cast<FakeId*>(e->event.id);
      if (child->peer != nullptr) {
        Queue(child->peer, RDMA_CM_EVENT_REJECTED, 28);
        child->peer->peer = nullptr;
      }
      delete child;
    }
    Unsignal(channel->channel.fd);
    delete e;
    it = channel->events.erase(it);
  }
}

// Queues DISCONNECTED to a connected `id`, once.
void TellDisconnected(FakeId* id) {
  if (id == nullptr || !id->connected || id->disconnected) return;
  id->disconnected = true;
  Queue(id, RDMA_CM_EVENT_DISCONNECTED);
}

void Hangup(FakeId* id) {
  if (id->id.qp != nullptr) ToError(reinterpret_cast<FakeQp*>(id->id.qp));
  TellDisconnected(id->peer);
  TellDisconnected(id);
}

std::atomic<const std::function<void()>*> post_send_hook{nullptr};
std::atomic<bool> lose_flushes{false};
std::atomic<bool> offers_srq{true};      // Capabilities::shared_receive_queues
std::atomic<bool> offers_windows{true};  // Capabilities::windows
std::atomic<bool> like_rxe{false};       // Capabilities::like_rxe

}  // namespace

// The device's data path, reached through ibv_context::ops (verbs.h's inline ibv_post_send and
// friends call these). A namespace of their own: count_instructions.sh leaves out what runs
// inside them (and inside the entry points below that the data path calls) by name.
namespace entry {

int PostSend(ibv_qp* ibqp, ibv_send_wr* wr, ibv_send_wr** bad) {
  if (const std::function<void()>* hook = post_send_hook.load(std::memory_order_acquire)) {
    (*hook)();
  }
  std::lock_guard<std::mutex> lock(mu);
  ++stats.send_posts;
  auto* qp = reinterpret_cast<FakeQp*>(ibqp);
  for (; wr != nullptr; wr = wr->next) {
    if (static_cast<uint32_t>(wr->num_sge) > qp->max_send_sge) {
      *bad = wr;
      return EINVAL;
    }
    uint64_t length = 0;
    for (int i = 0; i < wr->num_sge; ++i) length += wr->sg_list[i].length;
    const bool inlined = (wr->send_flags & IBV_SEND_INLINE) != 0;
    if (inlined && length > qp->max_inline) {
      *bad = wr;
      return EINVAL;
    }
    Pending p;
    p.from = qp;
    p.wr_id = wr->wr_id;
    p.signaled = qp->sq_sig_all || (wr->send_flags & IBV_SEND_SIGNALED) != 0;
    p.opcode = wr->opcode;
    const ibv_wc_opcode wc_opcode = wr->opcode == IBV_WR_RDMA_READ ? IBV_WC_RDMA_READ
                                    : wr->opcode == IBV_WR_SEND ||
                                            wr->opcode == IBV_WR_SEND_WITH_IMM ||
                                            wr->opcode == IBV_WR_SEND_WITH_INV
                                        ? IBV_WC_SEND
                                    : wr->opcode == IBV_WR_BIND_MW   ? IBV_WC_BIND_MW
                                    : wr->opcode == IBV_WR_LOCAL_INV ? IBV_WC_LOCAL_INV
                                                                     : IBV_WC_RDMA_WRITE;
    if (qp->error) {
      if (!qp->lose_flushes && !lose_flushes.load(std::memory_order_relaxed)) {
        Complete(qp->qp.send_cq, Wc(qp, wr->wr_id, IBV_WC_WR_FLUSH_ERR, wc_opcode));
      }
      continue;
    }
    if (like_rxe.load(std::memory_order_relaxed)) {
      // rxe retransmits from its oldest unretired work request and executes every bind it meets
      // on the way again, which fails: a bind behind other work not known to be retired fails
      // here at once, as a loss there would make it, and so does other work behind a bind not
      // known to be retired, as a stale retransmission timer there can (Capabilities::like_rxe).
      const bool bind = wr->opcode == IBV_WR_BIND_MW;
      if (std::any_of(qp->unretired.begin(), qp->unretired.end(),
                      [bind](const std::pair<uint64_t, bool>& e) { return e.second != bind; })) {
        ++stats.binds_replayed;
        Complete(qp->qp.send_cq, Wc(qp, wr->wr_id, IBV_WC_MW_BIND_ERR, IBV_WC_BIND_MW));
        ToError(qp);
        continue;
      }
      qp->unretired.emplace_back(wr->wr_id, bind);
    }
    // The local buffers must be registered (inline data is copied at post time and need not be).
    bool local_ok = true;
    for (int i = 0; i < wr->num_sge && !inlined; ++i) {
      const ibv_sge& sge = wr->sg_list[i];
      const int need = wr->opcode == IBV_WR_RDMA_READ ? IBV_ACCESS_LOCAL_WRITE : 0;
      if (sge.length > 0 && FindMr(sge.lkey, sge.addr, sge.length, need) == nullptr) {
        local_ok = false;
      }
    }
    if (!local_ok) {
      Complete(qp->qp.send_cq, Wc(qp, wr->wr_id, IBV_WC_LOC_PROT_ERR, wc_opcode));
      ToError(qp);
      continue;
    }
    switch (wr->opcode) {
      case IBV_WR_SEND:
      case IBV_WR_SEND_WITH_INV:
      case IBV_WR_SEND_WITH_IMM: {
        p.bytes.reserve(length);
        for (int i = 0; i < wr->num_sge; ++i) {
          const auto* from = reinterpret_cast<const uint8_t*>(wr->sg_list[i].addr);
          p.bytes.insert(p.bytes.end(), from, from + wr->sg_list[i].length);
        }
        p.with_imm = wr->opcode == IBV_WR_SEND_WITH_IMM;
        p.with_inv = wr->opcode == IBV_WR_SEND_WITH_INV;
        if (p.with_inv) {
          p.inv_rkey = wr->invalidate_rkey;
        } else {
          p.imm = wr->imm_data;
        }
        SendToPeer(qp, std::move(p));
        break;
      }
      case IBV_WR_RDMA_WRITE:
      case IBV_WR_RDMA_WRITE_WITH_IMM: {
        FakeQp* peer = qp->peer;
        if (peer == nullptr || peer->error) {
          CompleteRequester(p, IBV_WC_RETRY_EXC_ERR);
          ToError(qp);
          break;
        }
        // A zero-length WRITE skips the key check, as IB C9-88 allows.
        if (length > 0 && !RemoteAccessOk(wr->wr.rdma.rkey, wr->wr.rdma.remote_addr, length,
                                          IBV_ACCESS_REMOTE_WRITE, peer)) {
          CompleteRequester(p, IBV_WC_REM_ACCESS_ERR);
          ToError(qp);
          break;
        }
        auto* to = reinterpret_cast<uint8_t*>(wr->wr.rdma.remote_addr);
        for (int i = 0; i < wr->num_sge; ++i) {
          // A zero-length WRITE's address is not checked: it may be null.
          if (wr->sg_list[i].length == 0) continue;
          std::memcpy(to, reinterpret_cast<const void*>(wr->sg_list[i].addr),
                      wr->sg_list[i].length);
          to += wr->sg_list[i].length;
        }
        ++stats.writes;
        if (wr->opcode == IBV_WR_RDMA_WRITE) {
          CompleteRequester(p, IBV_WC_SUCCESS);
          break;
        }
        p.with_imm = true;
        p.imm = wr->imm_data;
        p.write_length = static_cast<uint32_t>(length);
        SendToPeer(qp, std::move(p));
        break;
      }
      case IBV_WR_RDMA_READ: {
        FakeQp* peer = qp->peer;
        if (peer == nullptr || peer->error) {
          Complete(qp->qp.send_cq, Wc(qp, wr->wr_id, IBV_WC_RETRY_EXC_ERR, IBV_WC_RDMA_READ));
          ToError(qp);
          break;
        }
        if (!RemoteAccessOk(wr->wr.rdma.rkey, wr->wr.rdma.remote_addr, length,
                            IBV_ACCESS_REMOTE_READ, peer)) {
          Complete(qp->qp.send_cq, Wc(qp, wr->wr_id, IBV_WC_REM_ACCESS_ERR, IBV_WC_RDMA_READ));
          ToError(qp);
          break;
        }
        const auto* from = reinterpret_cast<const uint8_t*>(wr->wr.rdma.remote_addr);
        for (int i = 0; i < wr->num_sge; ++i) {
          std::memcpy(reinterpret_cast<void*>(wr->sg_list[i].addr), from, wr->sg_list[i].length);
          from += wr->sg_list[i].length;
        }
        ++stats.reads;
        if (p.signaled) {
          ibv_wc wc = Wc(qp, wr->wr_id, IBV_WC_SUCCESS, IBV_WC_RDMA_READ);
          wc.byte_len = static_cast<uint32_t>(length);
          Complete(qp->qp.send_cq, wc);
        }
        break;
      }
      case IBV_WR_BIND_MW: {
        // A type-2 window binds only while free, to a range of a region registered for binding
        // (and for local write when it grants remote write), with its own index in the new key.
        auto it = mws.find(wr->bind_mw.rkey >> 8);
        FakeMw* mw = reinterpret_cast<FakeMw*>(wr->bind_mw.mw);
        const ibv_mw_bind_info& info = wr->bind_mw.bind_info;
        const auto* mr = reinterpret_cast<const FakeMr*>(info.mr);
        const int access = static_cast<int>(info.mw_access_flags);
        const bool ok =
            it != mws.end() && it->second == mw && mw->qp == nullptr && mw->mw.rkey == mw->key &&
            mr != nullptr && (mr->access & IBV_ACCESS_MW_BIND) != 0 &&
            ((access & IBV_ACCESS_REMOTE_WRITE) == 0 || (mr->access & IBV_ACCESS_LOCAL_WRITE)) &&
            FindMr(mr->mr.lkey, info.addr, info.length, 0) != nullptr;
        if (!ok) {
          Complete(qp->qp.send_cq, Wc(qp, wr->wr_id, IBV_WC_MW_BIND_ERR, IBV_WC_BIND_MW));
          ToError(qp);
          break;
        }
        mw->qp = qp;
        mw->addr = info.addr;
        mw->length = info.length;
        mw->access = access;
        mw->key = wr->bind_mw.rkey;
        ++stats.binds;
        if (p.signaled) Complete(qp->qp.send_cq, Wc(qp, wr->wr_id, IBV_WC_SUCCESS, IBV_WC_BIND_MW));
        break;
      }
      case IBV_WR_LOCAL_INV: {
        // Only the key a window bound to this QP has now.
        auto it = mws.find(wr->invalidate_rkey >> 8);
        if (it == mws.end() || it->second->qp != qp || it->second->key != wr->invalidate_rkey) {
          Complete(qp->qp.send_cq, Wc(qp, wr->wr_id, IBV_WC_MW_BIND_ERR, IBV_WC_LOCAL_INV));
          ToError(qp);
          break;
        }
        it->second->qp = nullptr;
        ++stats.invalidations;
        if (p.signaled) {
          Complete(qp->qp.send_cq, Wc(qp, wr->wr_id, IBV_WC_SUCCESS, IBV_WC_LOCAL_INV));
        }
        break;
      }
      default:
        *bad = wr;
        return EINVAL;
    }
  }
  return 0;
}

int PostRecv(ibv_qp* ibqp, ibv_recv_wr* wr, ibv_recv_wr** bad) {
  std::lock_guard<std::mutex> lock(mu);
  ++stats.recv_posts;
  auto* qp = reinterpret_cast<FakeQp*>(ibqp);
  for (; wr != nullptr; wr = wr->next) {
    if (static_cast<uint32_t>(wr->num_sge) > qp->max_recv_sge ||
        qp->recvs.size() >= qp->max_recv_wr) {
      *bad = wr;
      return qp->recvs.size() >= qp->max_recv_wr ? ENOMEM : EINVAL;
    }
    ++stats.recvs_posted;
    if (qp->error) {
      Complete(qp->qp.recv_cq, Wc(qp, wr->wr_id, IBV_WC_WR_FLUSH_ERR, IBV_WC_RECV));
      continue;
    }
    RecvWr recv;
    recv.wr_id = wr->wr_id;
    recv.sges.assign(wr->sg_list, wr->sg_list + wr->num_sge);
    qp->recvs.push_back(std::move(recv));
    if (!qp->waiting.empty()) {
      Pending p = std::move(qp->waiting.front());
      qp->waiting.pop_front();
      Deliver(qp, p);
    }
  }
  return 0;
}

int PostSrqRecv(ibv_srq* ibsrq, ibv_recv_wr* wr, ibv_recv_wr** bad) {
  std::lock_guard<std::mutex> lock(mu);
  ++stats.recv_posts;
  auto* srq = reinterpret_cast<FakeSrq*>(ibsrq);
  for (; wr != nullptr; wr = wr->next) {
    if (static_cast<uint32_t>(wr->num_sge) > srq->max_sge || srq->recvs.size() >= srq->max_wr) {
      *bad = wr;
      return srq->recvs.size() >= srq->max_wr ? ENOMEM : EINVAL;
    }
    ++stats.recvs_posted;
    RecvWr recv;
    recv.wr_id = wr->wr_id;
    recv.sges.assign(wr->sg_list, wr->sg_list + wr->num_sge);
    srq->recvs.push_back(std::move(recv));
    // A send waiting at one of its QPs (the first found: no fairness is modelled) takes it.
    for (FakeQp* qp : srq->qps) {
      if (qp->waiting.empty() || qp->error) continue;
      Pending p = std::move(qp->waiting.front());
      qp->waiting.pop_front();
      Deliver(qp, p);
      break;
    }
  }
  return 0;
}

int PollCq(ibv_cq* cq, int n, ibv_wc* wc) {
  std::lock_guard<std::mutex> lock(mu);
  auto* fake = reinterpret_cast<FakeCq*>(cq);
  int got = 0;
  while (got < n && !fake->wcs.empty()) {
    const ibv_wc& polled = wc[got++] = fake->wcs.front();
    fake->wcs.pop_front();
    // A send's completion retires it and everything before it on its queue pair (like_rxe).
    if (!like_rxe.load(std::memory_order_relaxed) || polled.opcode == IBV_WC_RECV ||
        polled.opcode == IBV_WC_RECV_RDMA_WITH_IMM) {
      continue;
    }
    auto it = qps.find(polled.qp_num);
    if (it == qps.end()) continue;
    auto& unretired = it->second->unretired;
    auto last = std::find_if(
        unretired.begin(), unretired.end(),
        [&polled](const std::pair<uint64_t, bool>& e) { return e.first == polled.wr_id; });
    if (last != unretired.end()) unretired.erase(unretired.begin(), last + 1);
  }
  return got;
}

int ReqNotifyCq(ibv_cq* cq, int) {
  std::lock_guard<std::mutex> lock(mu);
  reinterpret_cast<FakeCq*>(cq)->armed = true;
  return 0;
}

ibv_mw* AllocMw(ibv_pd* pd, ibv_mw_type type) {
  if (type != IBV_MW_TYPE_2 || !offers_windows.load(std::memory_order_relaxed)) {
    errno = EOPNOTSUPP;  // the fake models type-2 windows only
    return nullptr;
  }
  std::lock_guard<std::mutex> lock(mu);
  auto* mw = new FakeMw;
  mw->mw.context = pd->context;
  mw->mw.pd = pd;
  mw->mw.type = type;
  const uint32_t index = next_mw_index++;
  mw->mw.rkey = mw->key = index << 8;
  mws[index] = mw;
  ++stats.windows_alive;
  return &mw->mw;
}

int DeallocMw(ibv_mw* ibmw) {
  std::lock_guard<std::mutex> lock(mu);
  mws.erase(ibmw->rkey >> 8);
  delete reinterpret_cast<FakeMw*>(ibmw);
  --stats.windows_alive;
  return 0;
}

}  // namespace entry

void SetPostSendHook(const std::function<void()>* hook) {
  post_send_hook.store(hook, std::memory_order_release);
}

void SetLoseFlushes(bool lose) { lose_flushes.store(lose, std::memory_order_relaxed); }

void SetCapabilities(const Capabilities& capabilities) {
  offers_srq.store(capabilities.shared_receive_queues, std::memory_order_relaxed);
  offers_windows.store(capabilities.windows, std::memory_order_relaxed);
  like_rxe.store(capabilities.like_rxe, std::memory_order_relaxed);
  InitDevice();
  std::lock_guard<std::mutex> lock(mu);
  if (capabilities.async_events && context.async_fd < 0) {
    context.async_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  }
}

void HoldLastWqeEvents(bool hold) {
  std::lock_guard<std::mutex> lock(mu);
  hold_last_wqe = hold;
  if (hold) return;
  while (!async_held.empty()) {
    const ibv_async_event event = async_held.front();
    async_held.pop_front();
    RaiseAsync(event);
  }
}

bool HangUp(uint64_t ordinal, Flushes flushes) {
  std::lock_guard<std::mutex> lock(mu);
  auto it = by_ordinal.find(ordinal);
  if (it == by_ordinal.end() || !it->second->connected || it->second->disconnected) return false;
  FakeId* id = it->second;
  if (flushes == Flushes::kLost) {
    for (FakeId* end : {id, id->peer}) {
      if (end != nullptr && end->id.qp != nullptr) {
        reinterpret_cast<FakeQp*>(end->id.qp)->lose_flushes = true;
      }
    }
  }
  Hangup(id);
  return true;
}

Counters counters() {
  std::lock_guard<std::mutex> lock(mu);
  return stats;
}

}  // namespace zrpc::fakeverbs

using namespace zrpc::fakeverbs;  // NOLINT: the C entry points below are the fake's API

extern "C" {

// ---- devices ----------------------------------------------------------------------------------

ibv_context** rdma_get_devices(int* num_devices) {
  InitDevice();
  if (num_devices != nullptr) *num_devices = 1;
  return device_list;
}
void rdma_free_devices(ibv_context**) {}
int ibv_close_device(ibv_context*) { return 0; }
const char* ibv_get_device_name(ibv_device*) { return "fake0"; }

int ibv_query_device(ibv_context*, ibv_device_attr* attr) {
  *attr = ibv_device_attr{};
  std::snprintf(attr->fw_ver, sizeof(attr->fw_ver), "fakeverbs");
  attr->max_mr_size = uint64_t{1} << 40;
  attr->page_size_cap = 4096;
  attr->max_qp = 1 << 16;
  attr->max_qp_wr = 16384;
  attr->max_sge = 32;
  attr->max_cq = 1 << 16;
  attr->max_cqe = 1 << 20;
  attr->max_mr = 1 << 20;
  attr->max_pd = 1 << 16;
  attr->max_qp_rd_atom = 128;
  attr->max_qp_init_rd_atom = 128;
  attr->max_srq = 1 << 16;
  attr->max_srq_wr = 1 << 20;
  attr->max_srq_sge = 32;
  attr->max_mw = 1 << 16;
  attr->device_cap_flags = IBV_DEVICE_MEM_WINDOW | IBV_DEVICE_MEM_WINDOW_TYPE_2B;
  attr->phys_port_cnt = 1;
  if (like_rxe.load(std::memory_order_relaxed)) attr->vendor_id = 0xffffff;  // rxe's
  if (!offers_srq.load(std::memory_order_relaxed)) {
    attr->max_srq = attr->max_srq_wr = attr->max_srq_sge = 0;
  }
  if (!offers_windows.load(std::memory_order_relaxed)) {
    attr->max_mw = 0;
    attr->device_cap_flags = 0;
  }
  return 0;
}

int ibv_query_port(ibv_context*, uint8_t port, _compat_ibv_port_attr* compat) {
  if (port != 1) return EINVAL;
  // The caller (verbs.h's wrapper) passes a whole, zeroed ibv_port_attr.
  auto* attr = reinterpret_cast<ibv_port_attr*>(compat);
  attr->state = IBV_PORT_ACTIVE;
  attr->max_mtu = IBV_MTU_4096;
  attr->active_mtu = IBV_MTU_1024;
  attr->gid_tbl_len = 2;
  attr->max_msg_sz = 1u << 31;
  attr->link_layer = IBV_LINK_LAYER_ETHERNET;
  return 0;
}

int _ibv_query_gid_ex(ibv_context*, uint32_t port, uint32_t index, ibv_gid_entry* entry, uint32_t,
                      size_t) {
  if (port != 1 || index > 1) return ENODATA;
  *entry = ibv_gid_entry{};
  entry->gid_index = index;
  entry->port_num = port;
  entry->ndev_ifindex = 1;
  if (index == 0) {  // link-local, RoCE v1: never chosen
    entry->gid.raw[0] = 0xfe;
    entry->gid.raw[1] = 0x80;
    entry->gid.raw[15] = 1;
    entry->gid_type = IBV_GID_TYPE_ROCE_V1;
  } else {
    entry->gid = AddressGid();
    entry->gid_type = IBV_GID_TYPE_ROCE_V2;
  }
  return 0;
}

const char* ibv_port_state_str(ibv_port_state state) {
  return state == IBV_PORT_ACTIVE ? "PORT_ACTIVE" : "PORT_DOWN";
}

const char* ibv_wc_status_str(ibv_wc_status status) {
  switch (status) {
    case IBV_WC_SUCCESS:
      return "success";
    case IBV_WC_LOC_LEN_ERR:
      return "local length error";
    case IBV_WC_LOC_PROT_ERR:
      return "local protection error";
    case IBV_WC_WR_FLUSH_ERR:
      return "Work Request Flushed Error";
    case IBV_WC_REM_INV_REQ_ERR:
      return "remote invalid request error";
    case IBV_WC_REM_ACCESS_ERR:
      return "remote access error";
    case IBV_WC_RETRY_EXC_ERR:
      return "transport retry counter exceeded";
    case IBV_WC_MW_BIND_ERR:
      return "memory bind operation error";
    default:
      return "other error";
  }
}

// Asynchronous events: none unless Capabilities::async_events gave the context an event file
// (otherwise its async_fd is -1, nothing reads them, and these answer as an empty non-blocking
// file would). A QP named by a fetched event is not destroyed until the event is acked.
int ibv_get_async_event(ibv_context*, ibv_async_event* event) {
  std::lock_guard<std::mutex> lock(mu);
  if (async_queue.empty()) {
    errno = EAGAIN;
    return -1;
  }
  *event = async_queue.front();
  async_queue.pop_front();
  if (async_queue.empty()) {
    uint64_t count = 0;  // not readable until more come: the count goes back to 0
    if (read(context.async_fd, &count, sizeof(count)) != sizeof(count)) {
      Die("cannot read the event file");
    }
  }
  if (event->event_type == IBV_EVENT_QP_LAST_WQE_REACHED) {
    ++reinterpret_cast<FakeQp*>(event->element.qp)->events_out;
  }
  return 0;
}
void ibv_ack_async_event(ibv_async_event* event) {
  std::lock_guard<std::mutex> lock(mu);
  if (event->event_type == IBV_EVENT_QP_LAST_WQE_REACHED) {
    --reinterpret_cast<FakeQp*>(event->element.qp)->events_out;
    async_acked.notify_all();
  }
}
// Nor a shared receive queue's low-water report: refused, so the queue goes without (as on a
// device that cannot, shared_receive_queue.h).
int ibv_modify_srq(ibv_srq*, ibv_srq_attr*, int) { return EOPNOTSUPP; }
const char* ibv_event_type_str(ibv_event_type) { return "fake device event"; }

// ---- protection domains, memory regions ---------------------------------------------------------

ibv_pd* ibv_alloc_pd(ibv_context* ctx) {
  auto* pd = new ibv_pd{};
  pd->context = ctx;
  return pd;
}
int ibv_dealloc_pd(ibv_pd* pd) {
  delete pd;
  return 0;
}

ibv_mr* ibv_reg_mr_iova2(ibv_pd* pd, void* addr, size_t length, uint64_t, unsigned int access) {
  return RegisterMemory(pd, addr, length, static_cast<int>(access));
}
ibv_mr* ibv_reg_mr(ibv_pd* pd, void* addr, size_t length, int access) {
  return RegisterMemory(pd, addr, length, access);
}
int ibv_dereg_mr(ibv_mr* mr) {
  std::lock_guard<std::mutex> lock(mu);
  mrs.erase(mr->lkey);
  delete reinterpret_cast<FakeMr*>(mr);
  return 0;
}

// ---- completion queues and channels ---------------------------------------------------------

ibv_comp_channel* ibv_create_comp_channel(ibv_context* ctx) {
  auto* channel = new FakeCompChannel;
  channel->channel.context = ctx;
  channel->channel.fd = MakeEventFd();
  if (channel->channel.fd < 0) {
    delete channel;
    return nullptr;
  }
  return &channel->channel;
}
int ibv_destroy_comp_channel(ibv_comp_channel* channel) {
  close(channel->fd);
  delete reinterpret_cast<FakeCompChannel*>(channel);
  return 0;
}

ibv_cq* ibv_create_cq(ibv_context* ctx, int cqe, void* cq_context, ibv_comp_channel* channel, int) {
  if (cqe <= 0) {
    errno = EINVAL;
    return nullptr;
  }
  auto* cq = new FakeCq;
  cq->cq.context = ctx;
  cq->cq.channel = channel;
  cq->cq.cq_context = cq_context;
  cq->cq.cqe = cqe;
  cq->capacity = cqe;
  return &cq->cq;
}
int ibv_destroy_cq(ibv_cq* cq) {
  std::lock_guard<std::mutex> lock(mu);
  auto* fake = reinterpret_cast<FakeCq*>(cq);
  if (cq->channel != nullptr) {
    auto& events = reinterpret_cast<FakeCompChannel*>(cq->channel)->events;
    events.erase(std::remove(events.begin(), events.end(), fake), events.end());
  }
  delete fake;
  return 0;
}

int ibv_get_cq_event(ibv_comp_channel* channel, ibv_cq** cq, void** cq_context) {
  FakeCq* got = nullptr;
  if (TakeEvent(&reinterpret_cast<FakeCompChannel*>(channel)->events, channel->fd, &got,
                [](auto*) {}) != 0) {
    return -1;
  }
  *cq = &got->cq;
  *cq_context = got->cq.cq_context;
  return 0;
}
void ibv_ack_cq_events(ibv_cq*, unsigned int) {}

// ---- queue pairs ------------------------------------------------------------------------------

int ibv_modify_qp(ibv_qp* qp, ibv_qp_attr* attr, int mask) {
  std::lock_guard<std::mutex> lock(mu);
  if ((mask & IBV_QP_STATE) != 0 && attr->qp_state == IBV_QPS_ERR) {
    ToError(reinterpret_cast<FakeQp*>(qp));
  }
  return 0;
}

int ibv_query_qp(ibv_qp* qp, ibv_qp_attr* attr, int, ibv_qp_init_attr* init) {
  std::lock_guard<std::mutex> lock(mu);
  auto* fake = reinterpret_cast<FakeQp*>(qp);
  *attr = ibv_qp_attr{};
  *init = ibv_qp_init_attr{};
  attr->qp_state = fake->error ? IBV_QPS_ERR : qp->state;
  attr->timeout = fake->timeout;
  attr->retry_cnt = fake->retry_cnt;
  attr->rnr_retry = fake->rnr_retry;
  return 0;
}

int rdma_create_qp(rdma_cm_id* id, ibv_pd* pd, ibv_qp_init_attr* attr) {
  std::lock_guard<std::mutex> lock(mu);
  // rxe's limit: devices refuse an inline request above theirs rather than grant less.
  if (attr->cap.max_inline_data > 512 || attr->qp_type != IBV_QPT_RC) {
    errno = EINVAL;
    return -1;
  }
  auto* qp = new FakeQp;
  qp->qp.context = id->verbs;
  qp->qp.qp_context = attr->qp_context;
  qp->qp.pd = pd;
  qp->qp.send_cq = attr->send_cq;
  qp->qp.recv_cq = attr->recv_cq;
  qp->qp.qp_num = next_qp_num++;
  qps[qp->qp.qp_num] = qp;
  qp->qp.state = IBV_QPS_INIT;
  qp->qp.qp_type = IBV_QPT_RC;
  qp->sq_sig_all = attr->sq_sig_all != 0;
  qp->max_send_wr = attr->cap.max_send_wr;
  qp->max_recv_wr = attr->cap.max_recv_wr;
  qp->max_send_sge = attr->cap.max_send_sge;
  qp->max_recv_sge = attr->cap.max_recv_sge;
  qp->max_inline = attr->cap.max_inline_data;
  if (attr->srq != nullptr) {
    qp->srq = reinterpret_cast<FakeSrq*>(attr->srq);
    qp->srq->qps.push_back(qp);
    qp->qp.srq = attr->srq;
  }
  id->qp = &qp->qp;
  ++stats.qps_alive;
  id->pd = pd;
  id->send_cq = attr->send_cq;
  id->recv_cq = attr->recv_cq;
  return 0;
}

void rdma_destroy_qp(rdma_cm_id* id) {
  std::unique_lock<std::mutex> lock(mu);
  auto* qp = reinterpret_cast<FakeQp*>(id->qp);
  if (qp == nullptr) return;
  // Its events not fetched yet go with it; those fetched are waited for (their reader may look).
  for (std::deque<ibv_async_event>* queue : {&async_queue, &async_held}) {
    queue->erase(std::remove_if(queue->begin(), queue->end(),
                                [qp](const ibv_async_event& e) { return e.element.qp == &qp->qp; }),
                 queue->end());
  }
  async_acked.wait(lock, [qp] { return qp->events_out == 0; });
  // The peer's sends waiting here fail; this side's waiting there vanish with the QP.
  FailWaiting(qp);
  if (qp->peer != nullptr) {
    auto& theirs = qp->peer->waiting;
    theirs.erase(std::remove_if(theirs.begin(), theirs.end(),
                                [qp](const Pending& p) { return p.from == qp; }),
                 theirs.end());
    qp->peer->peer = nullptr;
  }
  if (qp->srq != nullptr) {
    auto& qps = qp->srq->qps;
    qps.erase(std::remove(qps.begin(), qps.end(), qp), qps.end());
  }
  FreeWindowsOf(qp);
  qps.erase(qp->qp.qp_num);
  delete qp;
  --stats.qps_alive;
  id->qp = nullptr;
}

int ibv_destroy_qp(ibv_qp*) { return EINVAL; }  // zrpc's QPs belong to cm ids

ibv_srq* ibv_create_srq(ibv_pd* pd, ibv_srq_init_attr* attr) {
  if (!offers_srq.load(std::memory_order_relaxed)) {
    errno = EOPNOTSUPP;
    return nullptr;
  }
  std::lock_guard<std::mutex> lock(mu);
  if (attr->attr.max_wr == 0 || attr->attr.max_wr > (1u << 20) || attr->attr.max_sge == 0) {
    errno = EINVAL;
    return nullptr;
  }
  auto* srq = new FakeSrq;
  srq->srq.context = pd->context;
  srq->srq.pd = pd;
  srq->srq.srq_context = attr->srq_context;
  srq->max_wr = attr->attr.max_wr;
  srq->max_sge = attr->attr.max_sge;
  return &srq->srq;
}

int ibv_destroy_srq(ibv_srq* ibsrq) {
  std::lock_guard<std::mutex> lock(mu);
  auto* srq = reinterpret_cast<FakeSrq*>(ibsrq);
  if (!srq->qps.empty()) return EBUSY;  // as devices refuse while a QP is attached
  delete srq;
  return 0;
}

// ---- rdma_cm ----------------------------------------------------------------------------------

rdma_event_channel* rdma_create_event_channel() {
  auto* channel = new FakeEventChannel;
  channel->channel.fd = MakeEventFd();
  if (channel->channel.fd < 0) {
    delete channel;
    return nullptr;
  }
  return &channel->channel;
}

void rdma_destroy_event_channel(rdma_event_channel* channel) {
  auto* fake = reinterpret_cast<FakeEventChannel*>(channel);
  {
    std::lock_guard<std::mutex> lock(mu);
    for (FakeEvent* e : fake->events) delete e;
  }
  close(channel->fd);
  delete fake;
}

int rdma_create_id(rdma_event_channel* channel, rdma_cm_id** id, void* context,
                   rdma_port_space ps) {
  InitDevice();
  auto* fake = new FakeId;
  fake->id.channel = channel;
  fake->id.context = context;
  fake->id.ps = ps;
  fake->id.qp_type = IBV_QPT_RC;
  *id = &fake->id;
  return 0;
}

int rdma_destroy_id(rdma_cm_id* id) {
  std::unique_lock<std::mutex> lock(mu);
  auto* fake = reinterpret_cast<FakeId*>(id);
  if (fake->listening) listeners.erase(fake->port);
  if (fake->ordinal != 0) by_ordinal.erase(fake->ordinal);
  if (fake->peer != nullptr) {
    FakeId* peer = fake->peer;
    if (fake->connected) {
      TellDisconnected(peer);
    } else if (fake->passive) {
      // A connect request destroyed before it was answered: the caller hears it was rejected.
      Queue(peer, RDMA_CM_EVENT_REJECTED, 28);
    }
    peer->peer = nullptr;
  }
  DropEvents(reinterpret_cast<FakeEventChannel*>(id->channel), fake);
  // librdmacm frees the id only once every event fetched for it is acked: a thread reading a
  // fetched event's id (Poller::HandleCmEvents) may do so until its ack.
  acked.wait(lock, [&] { return fake->events_acked == fake->events_fetched; });
  delete fake;
  return 0;
}

int rdma_bind_addr(rdma_cm_id* id, sockaddr* addr) {
  std::lock_guard<std::mutex> lock(mu);
  auto* fake = reinterpret_cast<FakeId*>(id);
  auto* storage = &id->route.addr.src_storage;
  std::memset(storage, 0, sizeof(*storage));
  std::memcpy(storage, addr,
              addr->sa_family == AF_INET6 ? sizeof(sockaddr_in6) : sizeof(sockaddr_in));
  uint16_t port = PortOf(*storage);
  if (port != 0 && listeners.count(port) != 0) {
    errno = EADDRINUSE;
    return -1;
  }
  if (port == 0) port = EphemeralPort();
  SetPort(storage, port);
  fake->port = port;
  fake->bound = true;
  // librdmacm binds any local address; only the device's own leads to it.
  if (IsFakeAddress(addr)) {
    id->verbs = &context;
    id->port_num = 1;
  }
  return 0;
}

int rdma_listen(rdma_cm_id* id, int) {
  std::lock_guard<std::mutex> lock(mu);
  auto* fake = reinterpret_cast<FakeId*>(id);
  if (!fake->bound || id->verbs == nullptr) {
    errno = EINVAL;
    return -1;
  }
  if (listeners.count(fake->port) != 0) {
    errno = EADDRINUSE;
    return -1;
  }
  fake->listening = true;
  listeners[fake->port] = fake;
  return 0;
}

int rdma_resolve_addr(rdma_cm_id* id, sockaddr* src, sockaddr* dst, int) {
  std::lock_guard<std::mutex> lock(mu);
  auto* fake = reinterpret_cast<FakeId*>(id);
  if (dst == nullptr || dst->sa_family != AF_INET) {
    errno = EINVAL;
    return -1;
  }
  std::memset(&id->route.addr.dst_storage, 0, sizeof(id->route.addr.dst_storage));
  std::memcpy(&id->route.addr.dst_storage, dst, sizeof(sockaddr_in));
  if (!fake->bound) {
    sockaddr_in local{};
    local.sin_family = AF_INET;
    if (src != nullptr) {
      local = *reinterpret_cast<const sockaddr_in*>(src);
    } else {
      inet_pton(AF_INET, kAddress, &local.sin_addr);
    }
    std::memset(&id->route.addr.src_storage, 0, sizeof(id->route.addr.src_storage));
    std::memcpy(&id->route.addr.src_storage, &local, sizeof(local));
    fake->port = EphemeralPort();
    SetPort(&id->route.addr.src_storage, fake->port);
    fake->bound = true;
  }
  if (!IsFakeAddress(dst)) {
    Queue(fake, RDMA_CM_EVENT_ADDR_ERROR, -EHOSTUNREACH);
    return 0;
  }
  id->verbs = &context;
  id->port_num = 1;
  Queue(fake, RDMA_CM_EVENT_ADDR_RESOLVED);
  return 0;
}

int rdma_resolve_route(rdma_cm_id* id, int) {
  std::lock_guard<std::mutex> lock(mu);
  Queue(reinterpret_cast<FakeId*>(id), RDMA_CM_EVENT_ROUTE_RESOLVED);
  return 0;
}

int rdma_connect(rdma_cm_id* id, rdma_conn_param* param) {
  std::lock_guard<std::mutex> lock(mu);
  auto* client = reinterpret_cast<FakeId*>(id);
  if (id->qp == nullptr) {
    errno = EINVAL;
    return -1;
  }
  auto it = listeners.find(PortOf(id->route.addr.dst_storage));
  if (it == listeners.end()) {
    Queue(client, RDMA_CM_EVENT_REJECTED, 8);  // IB_CM_REJ_INVALID_SERVICE_ID
    return 0;
  }
  FakeId* listener = it->second;
  if (client->ordinal != 0) by_ordinal.erase(client->ordinal);  // an id connected again
  client->ordinal = ++stats.connects;
  by_ordinal[client->ordinal] = client;
  auto* child = new FakeId;
  child->id.verbs = &context;
  child->id.channel = listener->id.channel;
  child->id.context = listener->id.context;
  child->id.ps = listener->id.ps;
  child->id.port_num = 1;
  child->id.qp_type = IBV_QPT_RC;
  child->id.route.addr.src_storage = listener->id.route.addr.src_storage;
  child->id.route.addr.dst_storage = id->route.addr.src_storage;
  child->port = listener->port;
  child->passive = true;
  child->peer = client;
  client->peer = child;
  rdma_conn_param request = *param;
  request.qp_num = id->qp->qp_num;
  // As the IB CM does: the connecting side's retry count is both queue pairs', and its RNR
  // retry count the accepting side's.
  auto* client_qp = reinterpret_cast<FakeQp*>(id->qp);
  client_qp->timeout = client->ack_timeout;
  client_qp->retry_cnt = param->retry_count;
  client->requested_rnr_retry = param->rnr_retry_count;
  Queue(child, RDMA_CM_EVENT_CONNECT_REQUEST, 0, &request, listener);
  return 0;
}

int rdma_accept(rdma_cm_id* id, rdma_conn_param* param) {
  std::lock_guard<std::mutex> lock(mu);
  auto* child = reinterpret_cast<FakeId*>(id);
  FakeId* client = child->peer;
  if (id->qp == nullptr || client == nullptr || client->id.qp == nullptr) {
    errno = client == nullptr ? ECONNRESET : EINVAL;
    return -1;
  }
  auto* server_qp = reinterpret_cast<FakeQp*>(id->qp);
  auto* client_qp = reinterpret_cast<FakeQp*>(client->id.qp);
  server_qp->peer = client_qp;
  client_qp->peer = server_qp;
  server_qp->qp.state = client_qp->qp.state = IBV_QPS_RTS;
  server_qp->timeout = child->ack_timeout;
  server_qp->retry_cnt = client_qp->retry_cnt;
  server_qp->rnr_retry = client->requested_rnr_retry;
  client_qp->rnr_retry = param != nullptr ? param->rnr_retry_count : 0;
  child->connected = client->connected = true;
  rdma_conn_param reply = param != nullptr ? *param : rdma_conn_param{};
  reply.qp_num = id->qp->qp_num;
  Queue(client, RDMA_CM_EVENT_ESTABLISHED, 0, &reply);
  Queue(child, RDMA_CM_EVENT_ESTABLISHED);
  return 0;
}

int rdma_set_option(rdma_cm_id* id, int level, int optname, void* optval, size_t optlen) {
  std::lock_guard<std::mutex> lock(mu);
  if (level != RDMA_OPTION_ID || optname != RDMA_OPTION_ID_ACK_TIMEOUT ||
      optlen != sizeof(uint8_t)) {
    errno = ENOSYS;  // only what zrpc sets is modelled
    return -1;
  }
  reinterpret_cast<FakeId*>(id)->ack_timeout = *static_cast<const uint8_t*>(optval);
  return 0;
}

int rdma_reject(rdma_cm_id* id, const void* private_data, uint8_t length) {
  std::lock_guard<std::mutex> lock(mu);
  auto* child = reinterpret_cast<FakeId*>(id);
  FakeId* client = child->peer;
  child->peer = nullptr;
  if (client == nullptr) return 0;
  client->peer = nullptr;
  rdma_conn_param reason{};
  reason.private_data = private_data;
  reason.private_data_len = length;
  Queue(client, RDMA_CM_EVENT_REJECTED, 28, &reason);  // IB_CM_REJ_CONSUMER_DEFINED
  return 0;
}

int rdma_disconnect(rdma_cm_id* id) {
  std::lock_guard<std::mutex> lock(mu);
  auto* fake = reinterpret_cast<FakeId*>(id);
  if (!fake->connected) {
    errno = EINVAL;
    return -1;
  }
  Hangup(fake);
  return 0;
}

int rdma_migrate_id(rdma_cm_id* id, rdma_event_channel* channel) {
  std::lock_guard<std::mutex> lock(mu);
  auto* from = reinterpret_cast<FakeEventChannel*>(id->channel);
  auto* to = reinterpret_cast<FakeEventChannel*>(channel);
  if (from != nullptr) {
    for (auto it = from->events.begin(); it != from->events.end();) {
      if ((*it)->event.id != id) {
        ++it;
        continue;
      }
      Unsignal(from->channel.fd);
      to->events.push_back(*it);  // moved without a wake-up, as librdmacm moves them
      Signal(to->channel.fd);
      it = from->events.erase(it);
    }
  }
  id->channel = channel;
  return 0;
}

int rdma_get_cm_event(rdma_event_channel* channel, rdma_cm_event** event) {
  FakeEvent* got = nullptr;
  if (TakeEvent(&reinterpret_cast<FakeEventChannel*>(channel)->events, channel->fd, &got,
                [](FakeEvent* e) { ++e->owner->events_fetched; }) != 0) {
    return -1;
  }
  *event = &got->event;
  return 0;
}

int rdma_ack_cm_event(rdma_cm_event* event) {
  auto* fake = reinterpret_cast<FakeEvent*>(event);
  {
    std::lock_guard<std::mutex> lock(mu);
    ++fake->owner->events_acked;
  }
  acked.notify_all();
  delete fake;
  return 0;
}

__be16 rdma_get_src_port(rdma_cm_id* id) {
  return reinterpret_cast<sockaddr_in*>(&id->route.addr.src_storage)->sin_port;
}
__be16 rdma_get_dst_port(rdma_cm_id* id) {
  return reinterpret_cast<sockaddr_in*>(&id->route.addr.dst_storage)->sin_port;
}

const char* rdma_event_str(rdma_cm_event_type event) {
  switch (event) {
    case RDMA_CM_EVENT_ADDR_RESOLVED:
      return "RDMA_CM_EVENT_ADDR_RESOLVED";
    case RDMA_CM_EVENT_ADDR_ERROR:
      return "RDMA_CM_EVENT_ADDR_ERROR";
    case RDMA_CM_EVENT_ROUTE_RESOLVED:
      return "RDMA_CM_EVENT_ROUTE_RESOLVED";
    case RDMA_CM_EVENT_CONNECT_REQUEST:
      return "RDMA_CM_EVENT_CONNECT_REQUEST";
    case RDMA_CM_EVENT_ESTABLISHED:
      return "RDMA_CM_EVENT_ESTABLISHED";
    case RDMA_CM_EVENT_REJECTED:
      return "RDMA_CM_EVENT_REJECTED";
    case RDMA_CM_EVENT_DISCONNECTED:
      return "RDMA_CM_EVENT_DISCONNECTED";
    default:
      return "RDMA_CM_EVENT_OTHER";
  }
}

}  // extern "C"
