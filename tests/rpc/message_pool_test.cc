// PooledMessage (rpc/impl/message_pool.h): a thread's spare messages come back cleared with their
// memory, are bounded in number, and once their uses' bytes pass the bound are kept only when a
// measure finds them holding little, so a peer cannot grow what a server keeps call by call.
#include "rpc/impl/message_pool.h"

#include <google/protobuf/struct.pb.h>
#include <google/protobuf/wrappers.pb.h>

#include <catch2/catch.hpp>
#include <memory>
#include <string>
#include <thread>

namespace {

using Pooled = zrpc::internal::PooledMessage<google::protobuf::StringValue>;

TEST_CASE("a message given back is the next one taken, cleared, with its string's memory") {
  google::protobuf::StringValue* first = nullptr;
  size_t capacity = 0;
  {
    Pooled message;
    message->set_value(std::string(1000, 'x'));
    capacity = message->value().capacity();
    first = message.get();
    message.set_size_hint(1003);
  }
  Pooled again;
  CHECK(again.get() == first);
  CHECK(again->value().empty());
  CHECK(again->value().capacity() == capacity);  // Clear kept it: no allocation to refill
  again.set_size_hint(0);
}

// A message that comes back with its string's capacity was kept; one with a fresh string's (the
// short-string buffer, well under 1000) is new, whatever address the allocator gave it.
bool Kept(const Pooled& message) { return message->value().capacity() >= 1000; }

TEST_CASE("a message whose use was not sized (a failed call) is not kept") {
  {
    Pooled message;
    message->set_value(std::string(1000, 'x'));
  }
  Pooled next;
  CHECK_FALSE(Kept(next));
  next.set_size_hint(0);
}

TEST_CASE(
    "past the bound, a message that holds little is measured and kept; one large use is never "
    "kept") {
  const size_t half = Pooled::kMaxUsedBytes / 2;
  {
    Pooled message;
    message->set_value(std::string(1000, 'x'));
    message.set_size_hint(half);
  }
  {
    Pooled message;
    REQUIRE(Kept(message));  // after half the bound
    message.set_size_hint(half);
  }
  {
    Pooled message;
    REQUIRE(Kept(message));    // exactly at the bound
    message.set_size_hint(1);  // one byte past it: measured, about 1 KB held
  }
  // A steady stream of uses, far past the bound in all: the same message, measured each time
  // its count passes the bound, is never replaced (a server allocates nothing for it).
  for (int i = 0; i < 200; ++i) {
    Pooled message;
    REQUIRE(Kept(message));
    message->set_value(std::string(1000, 'x'));
    message.set_size_hint(1003);
  }
  {
    Pooled message;
    REQUIRE(Kept(message));
    message->set_value(std::string(1000, 'x'));
    message.set_size_hint(Pooled::kMaxUsedBytes + 1);  // a single use past the bound
  }
  Pooled message;
  CHECK_FALSE(Kept(message));
  message.set_size_hint(0);
}

// Cleared repeated elements stay allocated: a peer sending one large element more each call
// grows what a kept message holds, by the bytes of each use, and SpaceUsedLong() would not see
// them. So such a type is never measured: past the bound, it is replaced.
TEST_CASE("a message with a repeated message field is replaced once its uses pass the bound") {
  CHECK(zrpc::internal::MeasurableWhenCleared<google::protobuf::StringValue>());
  CHECK_FALSE(zrpc::internal::MeasurableWhenCleared<google::protobuf::ListValue>());
  using PooledList = zrpc::internal::PooledMessage<google::protobuf::ListValue>;
  bool replaced = false;
  int uses = 0;
  for (; uses < 200; ++uses) {
    PooledList message;
    // A kept message still has room for its cleared elements; a new one none.
    const bool fresh = message->values().Capacity() == 0;
    if (uses > 0 && fresh) {
      replaced = true;
      message.set_size_hint(0);
      break;
    }
    for (int i = 0; i < uses; ++i) message->add_values();
    message->add_values()->set_string_value(std::string(1000, 'x'));
    message.set_size_hint(message->ByteSizeLong());  // small: the earlier elements are empty
  }
  INFO("uses before the message was replaced: " << uses);
  CHECK(replaced);
  // Replaced when its uses' bytes (about 1000 each) passed the bound, not before.
  CHECK(uses >= static_cast<int>(Pooled::kMaxUsedBytes / 1000) - 2);
  CHECK(uses <= static_cast<int>(Pooled::kMaxUsedBytes / 1000) + 2);
}

TEST_CASE("each thread keeps at most kSpares messages, and nested uses take different ones") {
  std::thread([] {
    google::protobuf::StringValue* taken[Pooled::kSpares + 2] = {};
    {
      Pooled a, b, c, d, e, f;
      Pooled* all[] = {&a, &b, &c, &d, &e, &f};
      for (int i = 0; i < Pooled::kSpares + 2; ++i) {
        taken[i] = all[i]->get();
        all[i]->set_size_hint(1);
        for (int j = 0; j < i; ++j) CHECK(taken[i] != taken[j]);
      }
    }  // six given back: four kept, two deleted
    int found = 0;
    {
      Pooled a, b, c, d, e;
      for (Pooled* p : {&a, &b, &c, &d, &e}) {
        for (google::protobuf::StringValue* t : taken) found += p->get() == t ? 1 : 0;
        p->set_size_hint(1);
      }
    }
    // The four kept come back; a fifth is new (or reuses a freed address: at most one more).
    CHECK(found >= Pooled::kSpares);
    CHECK(found <= Pooled::kSpares + 1);
  }).join();
}

TEST_CASE("a moved message is given back once, by its last holder, to the thread that holds it") {
  google::protobuf::StringValue* message = nullptr;
  Pooled* moved_to = nullptr;
  std::thread([&] {
    auto first = std::make_unique<Pooled>();
    (*first)->set_value(std::string(1000, 'x'));
    first->set_size_hint(1000);
    message = first->get();
    // A PendingCall made on one thread (a poller) and finished on another.
    moved_to = new Pooled(std::move(*first));
    CHECK(first->get() == nullptr);
    first.reset();  // gives nothing back: nothing taken on this thread now holds `message`
    Pooled next;
    CHECK(next.get() != message);
    next.set_size_hint(0);
  }).join();
  std::thread([&] {
    CHECK(moved_to->get() == message);
    delete moved_to;  // given back here, with its string's memory
    Pooled next;
    CHECK(next.get() == message);
    CHECK(Kept(next));
    next.set_size_hint(1);
    // Move-assigned: the old message of the target is given back first.
    Pooled other;
    other.set_size_hint(1);
    google::protobuf::StringValue* other_message = other.get();
    other = std::move(next);
    CHECK(other.get() == message);
    Pooled again;
    CHECK(again.get() == other_message);
    again.set_size_hint(1);
  }).join();
}

// Destroyed after the thread's spares (a thread_local destroyed later, holding a PendingCall):
// plain delete, never the destroyed spares. ASan reports a use after free without the guard.
struct HeldAtExit {
  std::unique_ptr<Pooled> message;
  ~HeldAtExit() {
    message.reset();
    Pooled late;  // made after the spares are gone, too
    late.set_size_hint(1);
  }
};

TEST_CASE("a message given back after its thread's spares are destroyed is deleted") {
  std::thread([] {
    // Thread-locals are destroyed in the reverse order of their construction: `held` is made
    // first, the spares after it (at the first message taken), so the spares go first.
    static thread_local HeldAtExit held;
    held.message.reset();
    held.message = std::make_unique<Pooled>();
    held.message->get()->set_value("x");
    held.message->set_size_hint(1);
  }).join();
}

}  // namespace
