// Manual pollers: a seam for counting programs and tests (benchmarks/count_instructions.cc), not
// an API. While manual mode is on, the runtimes (channels and servers) opened afterwards create
// their pollers without starting their threads, and DriveManualPollersOnce runs one pass of each
// such poller still alive (transport::Poller::RunOnce, no wait) on the calling thread. With a
// device where every transfer completes when it is posted (tests/fakeverbs), a driver that
// alternates passes runs a round trip the same way every time, so its cost can be counted
// exactly: no poller spins a varying number of empty passes, no thread is woken.
//
// Calls that wait (a blocking stub, Connect from a poller) still need another thread to drive
// the pollers; a runtime made in manual mode never polls by itself. Its teardown waits for its
// pollers too (a channel's for its connections to close): StartManualPollers first hands the
// pollers their threads, and the runtime then closes as any other.
//
// Threads: any; DriveManualPollersOnce from one thread at a time.
#ifndef ZRPC_RPC_COMMON_MANUAL_POLLERS_H_
#define ZRPC_RPC_COMMON_MANUAL_POLLERS_H_

#include <memory>
#include <vector>

#include "transport/poller.h"

namespace zrpc::internal {

// Turns manual mode on or off for the runtimes opened afterwards.
void SetManualPollers(bool manual);
bool ManualPollers();
// Records a poller made in manual mode (OpenRuntime does): DriveManualPollersOnce polls it
// while it lives.
void AddManualPoller(const std::shared_ptr<transport::Poller>& poller);
// One pass of every manual poller still alive, in the order they were made; the completions
// they handled.
int DriveManualPollersOnce();
// The manual pollers alive now, in the order they were made. For a driver that passes them
// itself, many times over a set that does not change (count_instructions): DriveManualPollersOnce
// looks the set up on every pass, a lock and a reference count per poller, which a counted pass
// would then include though no poller thread pays it. The caller drops them before the runtimes
// close (a runtime's teardown does not wait for references held elsewhere).
std::vector<std::shared_ptr<transport::Poller>> ManualPollersAlive();
// Starts the thread of every manual poller still alive (transport::Poller::Start) and forgets
// them: from then on they run as a runtime's pollers always do. Not during a pass.
void StartManualPollers();

}  // namespace zrpc::internal

#endif  // ZRPC_RPC_COMMON_MANUAL_POLLERS_H_
