// PooledMessage: a request or response message of a server's unary call, taken from a thread's
// spares of that type and given back cleared, so that a server in steady state allocates nothing
// for its messages. A blocking handler's are on HandleUnary's stack; an asynchronous handler's are
// in its PendingCall, which may be finished and destroyed on another thread: the message then
// joins that thread's spares (each thread keeps at most kSpares of a type, so a thread that only
// finishes calls does not hoard them).
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
// the request's wire size, the serialized response's; no walk of the message), and once they
// pass kMaxUsedBytes the bound is no longer good enough:
//   - a message with reflection (the default, not optimize_for = LITE_RUNTIME) and no repeated
//     string, bytes or message field and no map, at any depth, is measured then, cleared:
//     SpaceUsedLong(), protobuf's own count of what it holds (cleared strings' capacity, a
//     repeated number field's). Kept when that is within kMaxUsedBytes, counting from the
//     measure; deleted otherwise. What it holds is never more than the measure plus the bytes of
//     the uses since, so at most twice the bound. A 64 B echo's messages are never replaced;
//   - any other message is deleted: a lite one cannot be measured, and SpaceUsedLong() leaves
//     out the cleared elements a repeated string or message field keeps for reuse, the very
//     memory a peer could grow.
// A peer cannot grow a kept message call by call (a repeated field with one large element more
// each time, whose wire size stays small): the measure sees it. A single use past the bound is
// never kept.
//
// Why not SpaceUsedLong() on every call: it walks every field. Once per kMaxUsedBytes of uses,
// its cost is a few instructions per call.
//
// rpc/impl/ is for generated code and the runtime, not for applications: nothing here is a
// stable API, and any of it may change in any release (rpc/impl/README.md).
#ifndef ZRPC_RPC_IMPL_MESSAGE_POOL_H_
#define ZRPC_RPC_IMPL_MESSAGE_POOL_H_

#include <google/protobuf/descriptor.h>
#include <google/protobuf/message.h>

#include <cstddef>
#include <type_traits>
#include <utility>
#include <vector>

namespace zrpc {

namespace internal {

// Whether SpaceUsedLong() of a cleared message of this type counts all it holds: no repeated
// string, bytes or message field and no map in it, at any depth (see the top).
inline bool MeasurableWhenCleared(const google::protobuf::Descriptor* type,
                                  std::vector<const google::protobuf::Descriptor*>& seen) {
  for (const google::protobuf::Descriptor* done : seen) {
    if (done == type) return true;  // a recursive type: its fields are being looked at
  }
  seen.push_back(type);
  for (int i = 0; i < type->field_count(); ++i) {
    const google::protobuf::FieldDescriptor* field = type->field(i);
    const auto cpp_type = field->cpp_type();
    const bool held_by_pointer = cpp_type == google::protobuf::FieldDescriptor::CPPTYPE_STRING ||
                                 cpp_type == google::protobuf::FieldDescriptor::CPPTYPE_MESSAGE;
    if (field->is_repeated() && held_by_pointer) return false;
    if (cpp_type == google::protobuf::FieldDescriptor::CPPTYPE_MESSAGE &&
        !MeasurableWhenCleared(field->message_type(), seen)) {
      return false;
    }
  }
  return true;
}

template <typename Message>
bool MeasurableWhenCleared() {
  if constexpr (std::is_base_of_v<google::protobuf::Message, Message>) {
    // Once per type; also makes protobuf build the type's reflection now, at its first message,
    // rather than at the first measure.
    static const bool measurable = [] {
      std::vector<const google::protobuf::Descriptor*> seen;
      return MeasurableWhenCleared(Message::descriptor(), seen);
    }();
    return measurable;
  } else {
    return false;
  }
}

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
  // The moved-from one holds nothing (get() is null) and gives nothing back.
  PooledMessage(PooledMessage&& other) noexcept
      : message_(other.message_), used_(other.used_), hint_(other.hint_) {
    other.message_ = nullptr;
  }
  PooledMessage& operator=(PooledMessage&& other) noexcept {
    if (this != &other) {
      Give();
      message_ = ::std::exchange(other.message_, nullptr);
      used_ = other.used_;
      hint_ = other.hint_;
    }
    return *this;
  }

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
      count = 0;
      gone = true;
    }
  };

  static Spares& ThreadSpares() {
    static thread_local Spares spares;
    return spares;
  }
  // Set once the thread's spares are destroyed (thread exit): a message made or given back later
  // (a PendingCall destroyed by another thread_local's destructor) is plain new and delete. Not
  // a member of Spares: a trivially destructible thread_local is never destroyed.
  static inline thread_local bool gone = false;

  void Take() {
    if (gone) {
      message_ = new Message();
      used_ = 0;
      return;
    }
    Spares& spares = ThreadSpares();
    if (spares.count == 0) {
      message_ = new Message();
      used_ = 0;
      static_cast<void>(MeasurableWhenCleared<Message>());
      return;
    }
    --spares.count;
    message_ = spares.messages[spares.count];
    used_ = spares.used[spares.count];
  }

  void Give() {
    if (message_ == nullptr) return;  // moved from
    if (gone) {
      delete message_;
      return;
    }
    Spares& spares = ThreadSpares();
    size_t used = hint_ > kMaxUsedBytes ? hint_ : used_ + hint_;
    if (spares.count == kSpares || hint_ > kMaxUsedBytes) {
      delete message_;
      return;
    }
    message_->Clear();
    if (used > kMaxUsedBytes) {
      if constexpr (std::is_base_of_v<google::protobuf::Message, Message>) {
        if (MeasurableWhenCleared<Message>()) {
          used = message_->SpaceUsedLong();  // what it holds, cleared (see the top)
        }
      }
      if (used > kMaxUsedBytes) {
        delete message_;
        return;
      }
    }
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
