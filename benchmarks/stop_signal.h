#ifndef ZRPC_BENCHMARKS_STOP_SIGNAL_H_
#define ZRPC_BENCHMARKS_STOP_SIGNAL_H_

// How a benchmark server waits for SIGINT or SIGTERM: the signals are blocked before any thread
// starts (threads inherit the mask, so none of them takes the signal) and the serving thread
// sleeps in sigwait. It wakes once, for the signal: a loop polling a flag would wake the process
// on a timer and add context switches that count_calls.sh would charge to the calls.

#include <pthread.h>
#include <signal.h>

namespace zrpc::bench {

class StopSignal {
 public:
  // Call before starting any thread.
  StopSignal() {
    sigemptyset(&set_);
    sigaddset(&set_, SIGINT);
    sigaddset(&set_, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &set_, nullptr);
  }

  // Returns when SIGINT or SIGTERM arrives.
  void Wait() const {
    int signal = 0;
    sigwait(&set_, &signal);
  }

 private:
  sigset_t set_;
};

}  // namespace zrpc::bench

#endif  // ZRPC_BENCHMARKS_STOP_SIGNAL_H_
