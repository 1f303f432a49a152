// The options a user of zrpc sets for the transport: a connection's (credits, queue depths, its
// receive arena), a poller's (busy or event mode), a listener's (admission limits) and the
// registered slot pool's. They are plain values with no verbs types, so rpc/options.h can offer
// them without bringing <infiniband/verbs.h> into an application; the transport's classes that
// take them (Connection, Poller, Listener, SlotPool) say how each is used.
#ifndef ZRPC_TRANSPORT_OPTIONS_H_
#define ZRPC_TRANSPORT_OPTIONS_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/time/time.h"

namespace zrpc::transport {

// A pre-shared key for peer authentication (auth.h): `id` names it on the wire (nonzero: 0 means
// "no key"), `secret` (16 to 64 bytes, random) is never sent.
struct AuthKey {
  uint32_t id = 0;
  std::string secret;
};

// The defaults size an idle connection at 33 pool slots (132 KiB with 4 KiB slots) plus its
// arena (256 KiB), all registered, and 33 completion-queue entries reserved on its poller (its
// receives and its drain marker; its sends take entries only while they are in flight): a server
// takes hundreds of idle connections per poller with them (transport/README.md, "Capacity", has
// the figures).
struct ConnectionOptions {
  // RECVs kept posted for the peer: its credits, so the messages it may have in flight. At
  // least kMinCredits. Each holds a pool slot for the connection's lifetime. With the poller's
  // shared receive queue the queue holds them, the connection only the messages it holds, and
  // this is the most its window grows to (credits.h, "Elastic windows").
  uint32_t recv_credits = 32;
  // With the poller's shared receive queue: the window the connection starts with and shrinks
  // back to when idle, its floor, which the poller reserves of its queue at admission. In
  // [kMinCredits (3), recv_credits]. Without a shared queue the window is recv_credits, fixed.
  uint32_t idle_recv_credits = 3;
  // Send queue entries. Must be at least 2 * kSignalInterval so selective signalling frees
  // entries before the queue fills.
  uint32_t send_queue_depth = 64;
  // Bytes the peer may RDMA WRITE into; a multiple of 64 up to 1 GiB, or 0 for no bulk payloads
  // from the peer. Registered per connection (count it against RLIMIT_MEMLOCK) unless lent on
  // demand; it bounds the largest bulk payload the peer can send.
  uint32_t arena_size = 256 << 10;
  // Lend the arena on demand (arena.h, "Loans"): none is registered for the connection; while
  // its peer writes bulk payloads it borrows a piece of its poller's arena pool
  // (PollerOptions::arena_pool_pieces, of arena_size bytes), opened to the
  // peer through a type-2 memory window bound to this connection's queue pair. The poller must
  // have that pool (a device without type-2 windows has none: Poller::arena_pool()).
  bool arena_on_demand = false;
  // Inline bytes requested. A device that refuses it is asked for half as much, and so on down
  // to none (below 16 bytes, nothing fits beside the frame header); max_inline() says what was
  // granted.
  uint32_t max_inline = 220;
  // Operations allowed to wait for credits or space before Send/WriteBulk refuse more. An
  // operation left to the holder of the connection's domain (connection.h, "Threads") is
  // checked only when carried out and queued past this bound then (it was accepted already);
  // messages stay bounded by max_send_slots.
  uint32_t max_waiting = 4096;
  // The smallest message payload (bytes a Send carries) the layer above needs: a peer whose
  // Hello offers RECVs too small for it is refused at the handshake, on either side, instead of
  // leaving that layer to find out with its first message. The device's own slots must hold it.
  uint32_t min_message_size = 0;
  // Pool slots this connection's outgoing messages may hold at once (being built, waiting for
  // credits, or in flight): a peer that stops returning credits stalls its own connection at
  // this many, and the device-wide pool stays available to every other connection.
  uint32_t max_send_slots = 128;
  // Payloads exposed to the peer through memory windows at once (Connection::Expose): each holds
  // a window (a device object) until the peer says it is done. Past it Expose answers
  // kResourceExhausted (the RPC layer then registers the payload instead). At least 1.
  uint32_t max_exposures = 2048;
  // Retry timing of the queue pair (transport/README.md, "Retry timing"), chosen here rather than
  // inherited from rdma_cm. A packet the peer has not acknowledged within 4.096 us x
  // 2^ack_timeout_exponent is sent again, up to retry_count times; then the connection fails
  // (IBV_WC_RETRY_EXC_ERR). A peer that vanished without a word is thus found dead about
  // (retry_count + 1) x that timeout after its last acknowledgement: 7 x 268 ms = 1.9 s by
  // default (hardware may wait up to 4x the timeout a try, as the IB spec allows). ack_timeout_
  // exponent applies to each side's own queue pair, in [12, 24] (17 ms to 69 s a try); lower
  // risks spurious failures over a congested or emulated fabric, higher finds a dead peer late.
  uint8_t ack_timeout_exponent = 16;
  // In [1, 6]. The connect request carries it and both queue pairs take it (the IB CM gives the
  // accepting side the count its peer asked for): a listener's own value is not used, and it
  // refuses a peer asking for 7, which rxe takes to mean "retry forever".
  uint8_t retry_count = 6;
  // Receiver-not-ready retries asked of the peer, in [0, 6] (each side's queue pair gets the
  // count the other asked for; 7 would mean forever and is refused). With credits, a peer that
  // keeps to them never meets RNR: a retry is a bug or a lying peer, and 0 fails such a
  // connection at the first (IBV_WC_RNR_RETRY_EXC_ERR on the peer's side).
  uint8_t rnr_retry_count = 6;
  // Peer authentication by pre-shared keys (auth.h), opt-in. Empty: none (anyone who reaches the
  // port may connect, within the listener's admission limits). On the accepting side: the keys it
  // accepts (several while a key rotates); a client without a key, or with one not among them, is
  // refused, saying why. On the connecting side: the key it presents, the first one (a server
  // that holds no keys refuses it). Each side checks the other's tag before it runs anything for
  // it or tells it a memory key.
  std::vector<AuthKey> auth_keys;
};

enum class PollMode { kBusy, kEvent };

struct PollerOptions {
  PollMode mode = PollMode::kBusy;
  // Completion queue entries (capped at the device's maximum: 32767 on rxe, millions on
  // ConnectX). A connection reserves what it completes while idle, recv_credits + 1 (33 with
  // default options: 868 connections on rxe), or 1 with a shared receive queue, whose receives
  // are reserved once; its sends take entries while they are in flight, and an eighth of the
  // queue is kept for them (poller.h, "Capacity"). A few MiB of memory.
  int cq_size = 65536;
  // Event mode: the most the loop keeps polling after its last completion before it arms the CQ
  // and sleeps, in [0, 1s]. Within it the loop polls for about twice its recent idle stretches,
  // and hardly at all once they outlast it (adaptive_spin.h). A reply that comes while it polls
  // costs no interrupt and no wake-up; an idle poller sleeps. Zero: sleep at the first empty
  // pass. The default covers a hardware round trip (2-5 us) and a short handler many times over.
  absl::Duration spin = absl::Microseconds(50);
  // Receives of one queue shared by every connection on the poller (shared_receive_queue.h), or 0
  // for a receive queue per connection. With it an idle connection keeps no receive posted: the
  // queue's receives hold this many pool slots for the poller's lifetime, its connections'
  // windows are claims on them that never sum to more (receive_budget.h), and the poller admits
  // a connection while its floor (idle_recv_credits) fits in the three quarters of them that
  // back floors (the rest is for windows to grow into). Its
  // completion-queue entries are reserved once, and a connection then reserves only its send
  // queue's. At most the device's max_srq_wr and half of cq_size (as the device caps it).
  uint32_t shared_receive_queue = 0;
  // With a shared receive queue: the device is asked to report the queue's falling below this
  // many posted receives (shared_receive_queue.h, "Low water"); 0 for an eighth of the queue.
  uint32_t shared_receive_low_water = 0;
  // Arenas this poller lends its connections at once (ConnectionOptions::arena_on_demand), each
  // of arena_piece_size bytes (a multiple of 64 up to 1 GiB), or 0 for none. A piece is
  // registered when first lent and kept for the next loan: at most pieces * size bytes. When
  // all are lent, a connection asking waits while the poller recalls loans idle since its last
  // look (arena_pool.h). Needs type-2 memory windows: on a device without them, none is made.
  uint32_t arena_pool_pieces = 0;
  uint32_t arena_piece_size = 256 << 10;
  // With a shared receive queue: the windows of the connections a Listener accepts on this
  // poller may be parked (credits.h, "Parked windows"). Admission is then bounded by the
  // completion queue alone: a connection whose floor does not fit starts parked, and while some
  // wait for a floor, windows idle for 10-20 ms give theirs up and open again when their peer
  // knocks (park_doors.h: one door of 8 bytes per connection, registered once, cq_size of them).
  // While any window is parked the loop looks at their doors every millisecond (in event mode it
  // sleeps at most that long). Peers must speak wire version 7 or later (every peer of this
  // build speaks 8). A connection that authenticates (ConnectionOptions::auth_keys) never starts
  // parked: with no floor free it is refused.
  bool park_windows = false;
};

struct SlotPoolOptions {
  // Bytes per slot, rounded up to a multiple of 64 (a cache line), at most 1 GiB. It bounds the
  // largest SEND (frame header included) the transport accepts and is what each posted RECV
  // holds.
  size_t slot_size = 4096;
  // Slots per chunk, rounded up to a power of two: the first chunk, registered at Create, and
  // every chunk added later. Smaller pins less memory in a process with few connections; larger
  // means fewer registrations (and fewer MRs for the NIC to cache) as a server grows. 256 slots
  // of 4 KiB is 1 MiB: the RECVs of three connections with the default 64 credits, and their
  // sends.
  uint32_t slot_count = 256;
  // The cap: the pool never holds more slots than this (the last chunk is cut short to fit). At
  // least slot_count, at most 2^31. Set it equal to slot_count for a pool that never grows. At 4
  // KiB slots the default is 512 MiB of registered memory when full: a server's 16 shared receive
  // queues of 4096 (rpc/options.h) take half, and the rest is for its connections' credit frames
  // and sends (see RLIMIT_MEMLOCK above).
  uint32_t max_slots = 131072;
};

// Admission limits of a Listener, and the options of the connections it accepts.
struct ListenerOptions {
  // Options of every accepted connection.
  ConnectionOptions connection;
  // Time a peer has from its connection request to the end of the handshake.
  absl::Duration handshake_timeout = absl::Seconds(5);
  // Connections open or handshaking at once; requests beyond are refused ("server full"). What
  // the pollers can hold and the registered memory the process may lock bound it too (the RPC
  // server lowers it to those at creation, and says so).
  uint32_t max_connections = 16384;
  // The same, from one IP address.
  uint32_t max_connections_per_peer = 512;
  // Connection requests admitted from one IP address: on average per second, and at once after
  // a quiet spell. Requests beyond are refused ("server busy for <ip>"), so that one address
  // reconnecting in a loop cannot take the listener's thread (each handshake creates a queue
  // pair and registers memory) from everyone else. A client's channel backs off and retries.
  uint32_t accepts_per_second_per_peer = 1024;
  uint32_t accept_burst_per_peer = 1024;
  // Connection requests the kernel queues while the listener thread is busy.
  int backlog = 1024;
};

}  // namespace zrpc::transport

#endif  // ZRPC_TRANSPORT_OPTIONS_H_
