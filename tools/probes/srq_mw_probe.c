// srq_mw_probe: what a verbs device does with a shared receive queue and type-2 memory windows,
// the two features issue 35 (scale) builds on. One process, two RC connections over rdma_cm
// loopback on $ZRPC_RDMA_ADDR (tools/softroce sets it); the server's QPs take their receives
// from one SRQ. It prints what it saw and exits 0 if it ran to the end; it asserts nothing about
// the answers, which differ by device.
//
//   bazel build //tools/probes:srq_mw_probe && tools/softroce run --
//   bazel-bin/tools/probes/srq_mw_probe
//
// What rxe in the test guest (Debian's 6.1.0-57 kernel) answered on 2026-11-30:
//   - max_srq 917,503, max_srq_wr 1,048,576, max_mw 524,287, max_cqe 32,767; type-2B windows
//     (not 2A), SRQ resize.
//   - srq_limit arms, and IBV_EVENT_SRQ_LIMIT_REACHED comes once the posted receives drop below
//     it; the limit then reads 0 (disarmed: re-arm after each event).
//   - A sender that overruns the SRQ by one message with rnr_retry 1 gets RNR_RETRY_EXC_ERR on
//     that message: it fails its own connection, the receiver's QP is unaffected.
//   - A window bound on QP A (IBV_WR_BIND_MW, a fresh key byte from ibv_inc_rkey) takes an RDMA
//     WRITE arriving on A; the same rkey on another QP B gets a remote access error, the target
//     bytes unchanged, and B's receiving QP goes to ERR (the user of a foreign key loses its own
//     connection). Local invalidation completes.
//   - No IBV_EVENT_QP_LAST_WQE_REACHED within 1 s of moving an SRQ-attached QP to ERR with
//     ibv_modify_qp (none either after posting another SRQ receive), and no flushed receives on
//     its CQ: the SRQ keeps its receives. So teardown cannot wait for that event on rxe without a
//     bound: whatever relies on it needs a timeout or another proof the QP consumes no more.
#include <arpa/inet.h>
#include <errno.h>
#include <infiniband/verbs.h>
#include <poll.h>
#include <rdma/rdma_cma.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define CHECK(x)                                                                       \
  do {                                                                                 \
    if (!(x)) {                                                                        \
      fprintf(stderr, "FAIL %s:%d: %s (errno %d %s)\n", __FILE__, __LINE__, #x, errno, \
              strerror(errno));                                                        \
      exit(1);                                                                         \
    }                                                                                  \
  } while (0)

static struct rdma_cm_event* expect(struct rdma_event_channel* ch, enum rdma_cm_event_type t) {
  struct rdma_cm_event* e;
  CHECK(rdma_get_cm_event(ch, &e) == 0);
  if (e->event != t) {
    fprintf(stderr, "FAIL want %s got %s (status %d)\n", rdma_event_str(t),
            rdma_event_str(e->event), e->status);
    exit(1);
  }
  return e;
}

// Waits up to ms for an async event of type `want` (-1: any); returns its type or -1. Events of
// other types that come first are printed and passed over, so none is taken for another.
static int async_event(struct ibv_context* ctx, int want, int ms) {
  for (;;) {
    struct pollfd p = {.fd = ctx->async_fd, .events = POLLIN};
    if (poll(&p, 1, ms) <= 0) return -1;
    struct ibv_async_event ev;
    if (ibv_get_async_event(ctx, &ev) != 0) return -1;
    int type = ev.event_type;
    ibv_ack_async_event(&ev);
    if (want < 0 || type == want) return type;
    printf("  (async event passed over: %s)\n", ibv_event_type_str(type));
  }
}

static int poll_n(struct ibv_cq* cq, int n, int ms, struct ibv_wc* out) {
  int got = 0;
  for (int i = 0; i < ms * 10 && got < n; ++i) {
    int r = ibv_poll_cq(cq, n - got, out + got);
    CHECK(r >= 0);
    got += r;
    if (got < n) usleep(100);
  }
  return got;
}

// Posts `n` signalled 64-byte SENDs from `data` on `qp`, wr_ids first_id, first_id + 1, ...
static void post_sends(struct ibv_qp* qp, char* data, uint32_t lkey, uint64_t first_id, int n) {
  for (int i = 0; i < n; ++i) {
    struct ibv_sge sge = {(uintptr_t)data, 64, lkey};
    struct ibv_send_wr wr = {.wr_id = first_id + i,
                             .sg_list = &sge,
                             .num_sge = 1,
                             .opcode = IBV_WR_SEND,
                             .send_flags = IBV_SEND_SIGNALED},
                       *bad;
    CHECK(ibv_post_send(qp, &wr, &bad) == 0);
  }
}

int main(void) {
  const char* addr = getenv("ZRPC_RDMA_ADDR");
  CHECK(addr != NULL);
  struct sockaddr_in sin = {.sin_family = AF_INET, .sin_port = htons(18515)};
  CHECK(inet_pton(AF_INET, addr, &sin.sin_addr) == 1);

  struct rdma_event_channel* sch = rdma_create_event_channel();
  struct rdma_event_channel* cch = rdma_create_event_channel();
  struct rdma_cm_id *listen_id, *cid;
  CHECK(rdma_create_id(sch, &listen_id, NULL, RDMA_PS_TCP) == 0);
  CHECK(rdma_bind_addr(listen_id, (struct sockaddr*)&sin) == 0);
  CHECK(rdma_listen(listen_id, 4) == 0);
  CHECK(rdma_create_id(cch, &cid, NULL, RDMA_PS_TCP) == 0);
  CHECK(rdma_resolve_addr(cid, NULL, (struct sockaddr*)&sin, 2000) == 0);
  rdma_ack_cm_event(expect(cch, RDMA_CM_EVENT_ADDR_RESOLVED));
  CHECK(rdma_resolve_route(cid, 2000) == 0);
  rdma_ack_cm_event(expect(cch, RDMA_CM_EVENT_ROUTE_RESOLVED));

  struct ibv_context* ctx = cid->verbs;
  struct ibv_device_attr dattr;
  CHECK(ibv_query_device(ctx, &dattr) == 0);
  printf("device %s: max_srq %d max_srq_wr %d max_srq_sge %d max_mw %d max_qp %d max_cqe %d\n",
         ibv_get_device_name(ctx->device), dattr.max_srq, dattr.max_srq_wr, dattr.max_srq_sge,
         dattr.max_mw, dattr.max_qp, dattr.max_cqe);
  struct ibv_device_attr_ex xattr;
  memset(&xattr, 0, sizeof xattr);
  if (ibv_query_device_ex(ctx, NULL, &xattr) == 0) {
    printf("device_cap_flags 0x%llx: MEM_WINDOW %d MW_TYPE_2A %d MW_TYPE_2B %d SRQ_RESIZE %d\n",
           (unsigned long long)xattr.orig_attr.device_cap_flags,
           !!(xattr.orig_attr.device_cap_flags & IBV_DEVICE_MEM_WINDOW),
           !!(xattr.orig_attr.device_cap_flags & IBV_DEVICE_MEM_WINDOW_TYPE_2A),
           !!(xattr.orig_attr.device_cap_flags & IBV_DEVICE_MEM_WINDOW_TYPE_2B),
           !!(xattr.orig_attr.device_cap_flags & IBV_DEVICE_SRQ_RESIZE));
  }
  struct ibv_pd* pd = ibv_alloc_pd(ctx);
  CHECK(pd);
  enum { kSlot = 4096, kPosted = 8, kLimit = 4 };
  char* buf = aligned_alloc(4096, kSlot * 64);
  memset(buf, 0, kSlot * 64);
  struct ibv_mr* mr = ibv_reg_mr(pd, buf, kSlot * 64,
                                 IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
                                     IBV_ACCESS_REMOTE_READ | IBV_ACCESS_MW_BIND);
  CHECK(mr);
  struct ibv_cq* scq = ibv_create_cq(ctx, 256, NULL, NULL, 0);
  struct ibv_cq* ccq = ibv_create_cq(ctx, 256, NULL, NULL, 0);
  CHECK(scq && ccq);
  struct ibv_srq_init_attr sia = {.attr = {.max_wr = 16, .max_sge = 1}};
  struct ibv_srq* srq = ibv_create_srq(pd, &sia);
  CHECK(srq);
  for (int i = 0; i < kPosted; ++i) {
    struct ibv_sge sge = {(uintptr_t)(buf + i * kSlot), kSlot, mr->lkey};
    struct ibv_recv_wr wr = {.wr_id = (uint64_t)i, .sg_list = &sge, .num_sge = 1}, *bad;
    CHECK(ibv_post_srq_recv(srq, &wr, &bad) == 0);
  }
  struct ibv_srq_attr limit = {.srq_limit = kLimit};
  int arm = ibv_modify_srq(srq, &limit, IBV_SRQ_LIMIT);
  printf("arm srq_limit %d: %s\n", kLimit, arm == 0 ? "ok" : strerror(arm));

  // Client QP and connect.
  struct ibv_qp_init_attr cqa = {
      .send_cq = ccq,
      .recv_cq = ccq,
      .qp_type = IBV_QPT_RC,
      .cap = {.max_send_wr = 64, .max_recv_wr = 16, .max_send_sge = 1, .max_recv_sge = 1}};
  CHECK(rdma_create_qp(cid, pd, &cqa) == 0);
  struct rdma_conn_param cp = {
      .responder_resources = 1, .initiator_depth = 1, .retry_count = 7, .rnr_retry_count = 1};
  CHECK(rdma_connect(cid, &cp) == 0);
  struct rdma_cm_event* req = expect(sch, RDMA_CM_EVENT_CONNECT_REQUEST);
  struct rdma_cm_id* sid = req->id;
  rdma_ack_cm_event(req);
  CHECK(sid->verbs == ctx);
  struct ibv_qp_init_attr sqa = {.send_cq = scq,
                                 .recv_cq = scq,
                                 .srq = srq,
                                 .qp_type = IBV_QPT_RC,
                                 .cap = {.max_send_wr = 64, .max_send_sge = 1}};
  CHECK(rdma_create_qp(sid, pd, &sqa) == 0);
  struct rdma_conn_param sp = {
      .responder_resources = 1, .initiator_depth = 1, .rnr_retry_count = 1};
  CHECK(rdma_accept(sid, &sp) == 0);
  rdma_ack_cm_event(expect(cch, RDMA_CM_EVENT_ESTABLISHED));
  rdma_ack_cm_event(expect(sch, RDMA_CM_EVENT_ESTABLISHED));
  printf("connected: client qp %u, server qp %u (on the SRQ)\n", cid->qp->qp_num, sid->qp->qp_num);

  // ---- Type-2 memory window: bound on the server's QP 1, used from client 1 and client 2.
  {
    struct rdma_cm_id* cid2;
    CHECK(rdma_create_id(cch, &cid2, NULL, RDMA_PS_TCP) == 0);
    CHECK(rdma_resolve_addr(cid2, NULL, (struct sockaddr*)&sin, 2000) == 0);
    rdma_ack_cm_event(expect(cch, RDMA_CM_EVENT_ADDR_RESOLVED));
    CHECK(rdma_resolve_route(cid2, 2000) == 0);
    rdma_ack_cm_event(expect(cch, RDMA_CM_EVENT_ROUTE_RESOLVED));
    struct ibv_cq* ccq2 = ibv_create_cq(ctx, 64, NULL, NULL, 0);
    struct ibv_qp_init_attr a2 = cqa;
    a2.send_cq = a2.recv_cq = ccq2;
    CHECK(rdma_create_qp(cid2, pd, &a2) == 0);
    CHECK(rdma_connect(cid2, &cp) == 0);
    struct rdma_cm_event* r2 = expect(sch, RDMA_CM_EVENT_CONNECT_REQUEST);
    struct rdma_cm_id* sid2 = r2->id;
    rdma_ack_cm_event(r2);
    struct ibv_cq* scq2 = ibv_create_cq(ctx, 64, NULL, NULL, 0);
    struct ibv_qp_init_attr s2 = sqa;
    s2.send_cq = s2.recv_cq = scq2;
    CHECK(rdma_create_qp(sid2, pd, &s2) == 0);
    CHECK(rdma_accept(sid2, &sp) == 0);
    rdma_ack_cm_event(expect(cch, RDMA_CM_EVENT_ESTABLISHED));
    rdma_ack_cm_event(expect(sch, RDMA_CM_EVENT_ESTABLISHED));

    struct ibv_mw* mw = ibv_alloc_mw(pd, IBV_MW_TYPE_2);
    printf("alloc type-2 MW: %s\n", mw ? "ok" : strerror(errno));
    if (mw) {
      const uint32_t rkey = ibv_inc_rkey(mw->rkey);
      struct ibv_send_wr bind = {.wr_id = 900,
                                 .opcode = IBV_WR_BIND_MW,
                                 .send_flags = IBV_SEND_SIGNALED},
                         *bad;
      bind.bind_mw.mw = mw;
      bind.bind_mw.rkey = rkey;
      bind.bind_mw.bind_info.mr = mr;
      bind.bind_mw.bind_info.addr = (uintptr_t)(buf + 48 * kSlot);
      bind.bind_mw.bind_info.length = kSlot;
      bind.bind_mw.bind_info.mw_access_flags = IBV_ACCESS_REMOTE_WRITE;
      int rc = ibv_post_send(sid->qp, &bind, &bad);
      struct ibv_wc w;
      int got = rc == 0 ? poll_n(scq, 1, 2000, &w) : 0;
      printf("bind MW (rkey %08x) on server qp %u: post %d, completion %s\n", rkey, sid->qp->qp_num,
             rc, got ? ibv_wc_status_str(w.status) : "none");
      // Write through it from client 1 (the QP it is bound to) and client 2 (another QP).
      struct ibv_cq* cqs[2] = {ccq, ccq2};
      struct rdma_cm_id* ids[2] = {cid, cid2};
      for (int c = 0; c < 2; ++c) {
        strcpy(buf + 41 * kSlot, c == 0 ? "from client one" : "from client two");
        struct ibv_sge sge = {(uintptr_t)(buf + 41 * kSlot), 16, mr->lkey};
        struct ibv_send_wr wr = {.wr_id = 910 + c,
                                 .sg_list = &sge,
                                 .num_sge = 1,
                                 .opcode = IBV_WR_RDMA_WRITE,
                                 .send_flags = IBV_SEND_SIGNALED};
        wr.wr.rdma.remote_addr = (uintptr_t)(buf + 48 * kSlot);
        wr.wr.rdma.rkey = rkey;
        CHECK(ibv_post_send(ids[c]->qp, &wr, &bad) == 0);
        got = poll_n(cqs[c], 1, 3000, &w);
        printf("client %d RDMA WRITE with the MW's rkey: %s; target holds \"%s\"\n", c + 1,
               got ? ibv_wc_status_str(w.status) : "no completion", buf + 48 * kSlot);
      }
      // Invalidate (local) and write again from client 1.
      struct ibv_send_wr inv = {.wr_id = 920,
                                .opcode = IBV_WR_LOCAL_INV,
                                .send_flags = IBV_SEND_SIGNALED},
                         *bad2;
      inv.invalidate_rkey = rkey;
      rc = ibv_post_send(sid->qp, &inv, &bad2);
      got = rc == 0 ? poll_n(scq, 1, 2000, &w) : 0;
      printf("local invalidate: post %d, completion %s\n", rc,
             got ? ibv_wc_status_str(w.status) : "none");
    }
    struct ibv_qp_attr qa;
    struct ibv_qp_init_attr qia;
    CHECK(ibv_query_qp(sid2->qp, &qa, IBV_QP_STATE, &qia) == 0);
    printf("server qp 2 state after the foreign write: %d (6 = ERR)\n", qa.qp_state);
  }

  // Five sends take the SRQ from 8 posted to 3, below the limit of 4.
  post_sends(cid->qp, buf + 40 * kSlot, mr->lkey, 100, 5);
  struct ibv_wc wc[64];
  int n = poll_n(ccq, 5, 2000, wc);
  printf("client send completions: %d (status %s)\n", n, n ? ibv_wc_status_str(wc[0].status) : "-");
  n = poll_n(scq, 5, 2000, wc);
  printf("server recv completions: %d, wr_ids", n);
  for (int i = 0; i < n; ++i) printf(" %llu", (unsigned long long)wc[i].wr_id);
  printf(" (status %s, qp_num %u)\n", n ? ibv_wc_status_str(wc[0].status) : "-",
         n ? wc[0].qp_num : 0);
  int ev = async_event(ctx, IBV_EVENT_SRQ_LIMIT_REACHED, 1000);
  printf("async event after dropping below srq_limit: %s\n",
         ev < 0 ? "NONE within 1 s" : ibv_event_type_str(ev));
  struct ibv_srq_attr q;
  CHECK(ibv_query_srq(srq, &q) == 0);
  printf("query_srq: max_wr %u srq_limit %u (0 = disarmed after the event)\n", q.max_wr,
         q.srq_limit);

  // Overrun: 3 posted; send 4 more with rnr_retry 1.
  post_sends(cid->qp, buf + 40 * kSlot, mr->lkey, 200, 4);
  n = poll_n(ccq, 4, 5000, wc);
  printf("overrun by one with rnr_retry 1: %d client completions:", n);
  for (int i = 0; i < n; ++i)
    printf(" %llu=%s", (unsigned long long)wc[i].wr_id, ibv_wc_status_str(wc[i].status));
  printf("\n");
  n = poll_n(scq, 4, 500, wc);
  printf("server recv completions: %d\n", n);

  // The server QP to error: last WQE reached? SRQ receives flushed?
  struct ibv_qp_attr err = {.qp_state = IBV_QPS_ERR};
  CHECK(ibv_modify_qp(sid->qp, &err, IBV_QP_STATE) == 0);
  int saw_last = 0;
  for (int i = 0; i < 4; ++i) {
    ev = async_event(ctx, -1, 1000);
    if (ev < 0) break;
    printf("async event after QP to error: %s\n", ibv_event_type_str(ev));
    if (ev == IBV_EVENT_QP_LAST_WQE_REACHED) saw_last = 1;
  }
  if (!saw_last) {
    printf("async event after QP to error: no LAST_WQE_REACHED within 1 s\n");
    // Maybe it needs the SRQ touched: post one more receive and look again. (A packet arriving
    // for the QP in error is not tried: the client's QP is in error too after its RNR failure.)
    struct ibv_sge sge = {(uintptr_t)(buf + 20 * kSlot), kSlot, mr->lkey};
    struct ibv_recv_wr wr = {.wr_id = 77, .sg_list = &sge, .num_sge = 1}, *bad;
    CHECK(ibv_post_srq_recv(srq, &wr, &bad) == 0);
    ev = async_event(ctx, -1, 1000);
    printf("after one more post_srq_recv: %s\n", ev < 0 ? "no event" : ibv_event_type_str(ev));
    struct ibv_qp_attr qa;
    struct ibv_qp_init_attr qia;
    CHECK(ibv_query_qp(sid->qp, &qa, IBV_QP_STATE, &qia) == 0);
    printf("server qp state %d (6 = ERR)\n", qa.qp_state);
  }
  n = poll_n(scq, 16, 500, wc);
  printf("server completions after QP to error: %d", n);
  for (int i = 0; i < n; ++i)
    printf(" %llu=%s", (unsigned long long)wc[i].wr_id, ibv_wc_status_str(wc[i].status));
  printf(" (SRQ receives %s)\n", n == 0 ? "not flushed" : "flushed or other");
  printf("done\n");
  return 0;
}
