// fakeverbs: an in-memory stand-in for libibverbs and librdmacm, linked into a test binary in
// their place, so that zrpc's real transport and RPC runtime run with no RDMA device, no kernel
// and no emulator. It exists to count: with every transfer done at post time, in the poster's
// thread, a round trip's work is the same every time, so instructions, locks and allocations per
// call can be counted exactly (tests/benchmarks/README.md, "Counting without a device"). See
// README.md beside this file for what it models and what it does not.
//
// Linking: a cc_test that depends on //tests/fakeverbs gets this library's definitions of every
// ibv_* and rdma_* function zrpc's transport calls; the linker resolves the transport's calls to
// them before it looks at libibverbs and librdmacm. The device is "fake0", port 1, RoCE v2,
// address kAddress.
#ifndef ZRPC_TESTS_FAKEVERBS_FAKE_VERBS_H_
#define ZRPC_TESTS_FAKEVERBS_FAKE_VERBS_H_

#include <cstdint>
#include <functional>

namespace zrpc::fakeverbs {

// The one address of the fake device (a RoCE v2 GID at index 1 holds it).
inline constexpr char kAddress[] = "127.0.0.1";

// What the fake has done since the process started: its own work, to be told apart from the
// transport's. Read while nothing posts.
struct Counters {
  uint64_t sends = 0;           // SEND work requests delivered
  uint64_t writes = 0;          // RDMA WRITEs (with or without immediate) performed
  uint64_t reads = 0;           // RDMA READs performed
  uint64_t recvs_posted = 0;    // RECV work requests posted, to a QP or a shared receive queue
  uint64_t send_posts = 0;      // ibv_post_send calls (doorbells), whatever their chains' length
  uint64_t recv_posts = 0;      // ibv_post_recv and ibv_post_srq_recv calls (doorbells)
  uint64_t completions = 0;     // work completions made, successful or not
  uint64_t cq_events = 0;       // completion-channel events raised (an armed CQ got a completion)
  uint64_t errors = 0;          // work completions with an error status
  uint64_t qps_alive = 0;       // queue pairs created and not yet destroyed: connections alive
  uint64_t connects = 0;        // rdma_connect calls that found a listener: connection attempts
  uint64_t binds = 0;           // memory windows bound (IBV_WR_BIND_MW that succeeded)
  uint64_t invalidations = 0;   // memory windows invalidated (IBV_WR_LOCAL_INV that succeeded)
  uint64_t windows_alive = 0;   // memory windows allocated and not yet deallocated
  uint64_t binds_replayed = 0;  // binds refused as rxe's retransmission would break them (like_rxe)
};
Counters counters();

// Runs `*hook` at the start of every ibv_post_send, on the posting thread, before the stand-in
// does anything (outside its lock); nullptr: nothing. For a test that must hold a thread at a
// known point of the transport: a send is posted inside the connection's domain, so a hook that
// waits there keeps that thread holding it. The hook decides which threads it holds (by thread
// id, say) and must outlive its installation and every post that may still be running it.
void SetPostSendHook(const std::function<void()>* hook);

// What the device offers, as ibv_query_device reports it, for the runtime's fallbacks: without
// shared receive queues, max_srq and max_srq_wr are 0 and ibv_create_srq fails EOPNOTSUPP;
// without memory windows, neither MEM_WINDOW flag is set, max_mw is 0 and allocating a window
// fails EOPNOTSUPP. Set it before the device is opened (Device::Open reads it once); the process's
// devices are shared (rpc/common/shared_device.h), so a test binary that sets it sets it for all.
// With async_events the context gets an event file (an eventfd, so poll works) on which the
// stand-in raises IBV_EVENT_QP_LAST_WQE_REACHED for a queue pair of a shared receive queue when it
// enters the error state, as the specification has a device do; without (the default) the context
// has none (async_fd -1), as before. Once given, the file stays for the process.
// like_rxe: the device reports rxe's vendor id (so Device treats it as rxe: device.h), and models
// what rxe (Linux 6.1) does to a bind when it retransmits: it goes back to its oldest
// unacknowledged work request and executes every bind from there again, which fails the queue
// pair. With no loss here, the stand-in fails a BIND_MW at once when send work other than binds
// posted before it on its queue pair is not known to be retired (no signalled completion at or
// after it polled yet): with a loss at the wrong time, rxe would fail it. It fails other work
// posted behind a bind not known to be retired too: a stale retransmission timer can make rxe
// replay a bind at the head of its queue as work behind it goes out (Counters::binds_replayed).
struct Capabilities {
  bool shared_receive_queues = true;
  bool windows = true;
  bool async_events = false;
  bool like_rxe = false;
};
void SetCapabilities(const Capabilities& capabilities);
// While set, LAST_WQE_REACHED events are kept instead of raised: a device slow to say it. Clearing
// it raises what was kept, in order. Events of a queue pair destroyed meanwhile are dropped.
void HoldLastWqeEvents(bool hold);

// While set, a work request posted to a queue pair in the error state is dropped without a
// completion: a device that loses its flushes (rxe did, for some of hundreds of queue pairs
// closing while others connected). What was posted before the error still comes back flushed.
void SetLoseFlushes(bool lose);

// What a connection hung up by HangUp does with the sends posted to its queue pairs once they are
// in error: kept (each comes back flushed) or lost (as SetLoseFlushes, for this pair alone).
// Receives come back flushed either way.
enum class Flushes { kKept, kLost };

// The connection made by the process's `ordinal`-th rdma_connect (1-based: Counters::connects
// after it) hangs up as if the wire between them broke: the calling end's queue pair goes to the
// error state and both ends hear DISCONNECTED, once. So a test fails one connection of many,
// chosen by when it was made. False when that connection is not connected (never accepted,
// already hung up, or destroyed).
bool HangUp(uint64_t ordinal, Flushes flushes = Flushes::kKept);

}  // namespace zrpc::fakeverbs

#endif  // ZRPC_TESTS_FAKEVERBS_FAKE_VERBS_H_
