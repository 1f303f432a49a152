// PooledMessage: a request or response message of a blocking handler's call, taken from a
// thread's spares of that type and given back cleared, so that a server in steady state
// allocates nothing for its messages.
//
// A fresh message per call (as HandleUnary had on its stack) allocates every string and bytes
// field it parses or is given, and every sub-message: two allocations per 64 B echo, the
// larger part of what zrpc_bench's server allocated per call (benchmarks/count_calls.sh).
// protobuf's Clear() keeps a string field's capacity and a repeated field's elements, so a
// message cleared and parsed again reuses them. Each thread keeps up to kSpares messages per
// type (a handler that calls a method of its own server on this thread takes another), and never
// keeps one whose wire size passed kMaxKeptBytes: a single 1 MiB request must not pin 1 MiB per
// handler thread for the life of the process. The size is the caller's hint (the request's wire
// size, the serialized response's), not a walk of the message.
//
// rpc/impl/ is for generated code and the runtime, not for applications: nothing here is a
// stable API, and any of it may change in any release (rpc/impl/README.md).
#ifndef ZRPC_RPC_IMPL_MESSAGE_POOL_H_
#define ZRPC_RPC_IMPL_MESSAGE_POOL_H_

#include <cstddef>

namespace zrpc {

namespace internal {

template <typename Message>
class PooledMessage {
 public:
  static constexpr int kSpares = 4;
  static constexpr size_t kMaxKeptBytes = size_t{64} << 10;

  PooledMessage() : message_(Take()) {}
  // Gives the message back, cleared, unless `kept_bytes_hint` (set through Keep) is too large.
  ~PooledMessage() { Give(message_, hint_); }
  PooledMessage(const PooledMessage&) = delete;
  PooledMessage& operator=(const PooledMessage&) = delete;

  Message& operator*() const { return *message_; }
  Message* operator->() const { return message_; }
  Message* get() const { return message_; }
  // The message's wire size, or an estimate of what it holds: past kMaxKeptBytes it is deleted
  // instead of kept. Unset, the message is deleted (a call that failed before sizing it).
  void set_size_hint(size_t bytes) { hint_ = bytes; }

 private:
  // A thread's spares of this type; deleted when the thread ends.
  struct Spares {
    Message* messages[kSpares] = {};
    int count = 0;
    ~Spares() {
      for (int i = 0; i < count; ++i) delete messages[i];
    }
  };

  static Spares& ThreadSpares() {
    static thread_local Spares spares;
    return spares;
  }

  static Message* Take() {
    Spares& spares = ThreadSpares();
    if (spares.count == 0) return new Message();
    return spares.messages[--spares.count];
  }

  static void Give(Message* message, size_t hint) {
    Spares& spares = ThreadSpares();
    if (hint > kMaxKeptBytes || spares.count == kSpares) {
      delete message;
      return;
    }
    message->Clear();
    spares.messages[spares.count++] = message;
  }

  Message* message_;
  size_t hint_ = ~size_t{0};
};

}  // namespace internal

}  // namespace zrpc

#endif  // ZRPC_RPC_IMPL_MESSAGE_POOL_H_
