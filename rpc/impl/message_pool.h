// PooledMessage: a request or response message of a blocking handler's call, taken from a
// thread's spares of that type and given back cleared, so that a server in steady state
// allocates nothing for its messages.
//
// A fresh message per call (as HandleUnary had on its stack) allocates every string and bytes
// field it parses or is given, and every sub-message: two allocations per 64 B echo, the
// larger part of what zrpc_bench's server allocated per call (benchmarks/count_calls.sh).
// protobuf's Clear() keeps a string field's capacity and a repeated field's elements, so a
// message cleared and parsed again reuses them. Each thread keeps up to kSpares messages per
// type (a handler that calls a method of its own server on this thread takes another).
//
// What a spare may hold is bounded by what was ever parsed or serialized into it: the memory it
// keeps grew for those bytes. So each spare counts the wire bytes of its uses (the caller's hint:
// the request's wire size, the serialized response's; no walk of the message) and is deleted
// once they pass kMaxUsedBytes. A peer cannot grow a kept message call by call (a repeated
// field with one large element more each time, whose wire size stays small), and a single large
// request is not kept at all. A 64 B echo's messages are replaced once per ~500 calls.
//
// Why not SpaceUsedLong(): it needs reflection (not in lite messages) and walks every field on
// every call.
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
  static constexpr size_t kMaxUsedBytes = size_t{32} << 10;

  PooledMessage() { Take(); }
  // Gives the message back, cleared, unless its uses' bytes passed kMaxUsedBytes.
  ~PooledMessage() { Give(); }
  PooledMessage(const PooledMessage&) = delete;
  PooledMessage& operator=(const PooledMessage&) = delete;

  Message& operator*() const { return *message_; }
  Message* operator->() const { return message_; }
  Message* get() const { return message_; }
  // This use's wire size: added to the message's count. Unset, the message is deleted (a call
  // that failed before sizing it).
  void set_size_hint(size_t bytes) { hint_ = bytes; }

 private:
  // A thread's spares of this type, with their uses' bytes; deleted when the thread ends.
  struct Spares {
    Message* messages[kSpares] = {};
    size_t used[kSpares] = {};
    int count = 0;
    ~Spares() {
      for (int i = 0; i < count; ++i) delete messages[i];
    }
  };

  static Spares& ThreadSpares() {
    static thread_local Spares spares;
    return spares;
  }

  void Take() {
    Spares& spares = ThreadSpares();
    if (spares.count == 0) {
      message_ = new Message();
      used_ = 0;
      return;
    }
    --spares.count;
    message_ = spares.messages[spares.count];
    used_ = spares.used[spares.count];
  }

  void Give() {
    Spares& spares = ThreadSpares();
    const size_t used = hint_ > kMaxUsedBytes ? hint_ : used_ + hint_;
    if (used > kMaxUsedBytes || spares.count == kSpares) {
      delete message_;
      return;
    }
    message_->Clear();
    spares.messages[spares.count] = message_;
    spares.used[spares.count] = used;
    ++spares.count;
  }

  Message* message_ = nullptr;
  size_t used_ = 0;           // bytes of its earlier uses
  size_t hint_ = ~size_t{0};  // this use's
};

}  // namespace internal

}  // namespace zrpc

#endif  // ZRPC_RPC_IMPL_MESSAGE_POOL_H_
