// InlineFunction (DoneCallback's type), on the host: what fits stays inside with no allocation,
// what does not goes to the heap and is freed, every callable is destroyed exactly once however
// the function is moved, reset or assigned, and empty sources make empty functions.
#include "rpc/impl/inline_function.h"

#include <array>
#include <catch2/catch.hpp>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "rpc/generated_api.h"
#include "tests/counting_new.h"

namespace zrpc::internal {
namespace {

using Function = InlineFunction<int(int), 48>;
using zrpc::testing::AllocationCount;

// Counts the live copies of itself, so a test sees each destroyed exactly once.
struct Tracked {
  static inline int live = 0;
  int value;
  explicit Tracked(int v) : value(v) { ++live; }
  Tracked(const Tracked& other) : value(other.value) { ++live; }
  Tracked(Tracked&& other) noexcept : value(other.value) { ++live; }
  ~Tracked() { --live; }
};

TEST_CASE("a callable of up to 48 bytes is kept inside: no allocation to make, move or call it") {
  std::array<int64_t, 5> words{1, 2, 3, 4, 5};  // 40 bytes, plus the Tracked: 48
  Tracked tracked(10);
  const uint64_t before = AllocationCount();
  {
    Function f = [words, tracked](int x) { return x + static_cast<int>(words[4]) + tracked.value; };
    Function g = std::move(f);
    CHECK_FALSE(f);  // NOLINT(bugprone-use-after-move): moved-from is empty, as documented
    CHECK(g(1) == 16);
    Function h;
    h = std::move(g);
    CHECK(h(2) == 17);
  }
  CHECK(AllocationCount() == before);
  CHECK(Tracked::live == 1);  // only `tracked` itself
  // Six words fit DoneCallback inline (UnaryCall's callback takes two; zrpc_bench checks its own).
  struct SixWords {
    void* a[6];
    void operator()(absl::Status) const {}
  };
  static_assert(DoneCallback::StoresInline<SixWords>());
}

TEST_CASE("a larger callable goes to the heap, once, and is freed with the function") {
  std::array<int64_t, 8> words{};  // 64 bytes: past the inline size
  words[7] = 7;
  const uint64_t before = AllocationCount();
  auto large = [words](int x) { return x + static_cast<int>(words[7]); };
  static_assert(!Function::StoresInline<decltype(large)>());
  {
    Function f = large;
    Function g = std::move(f);  // moves the pointer, allocates nothing more
    CHECK(g(1) == 8);
    CHECK(AllocationCount() - before == 1);
  }
  // ASan's leak check sees a heap callable that is never freed.
}

TEST_CASE("every callable is destroyed exactly once: moves, reassignment, reset, self-move") {
  Tracked::live = 0;
  {
    Function a = [t = Tracked(1)](int x) { return x + t.value; };
    Function big = [t = Tracked(2), pad = std::array<char, 64>{}](int x) {
      return x + t.value + pad[0];
    };
    CHECK(Tracked::live == 2);
    a = std::move(big);  // a's own callable is destroyed, big's moves in
    CHECK(Tracked::live == 1);
    CHECK(a(0) == 2);
    Function& alias = a;
    a = std::move(alias);  // self-move keeps it
    CHECK(a(0) == 2);
    a = nullptr;
    CHECK(Tracked::live == 0);
    CHECK_FALSE(a);
    a = [t = Tracked(3)](int x) { return x * t.value; };
    CHECK(a(2) == 6);
  }
  CHECK(Tracked::live == 0);
}

TEST_CASE("move-only captures are taken, and empty sources make empty functions") {
  auto owned = std::make_unique<int>(41);
  Function f = [p = std::move(owned)](int x) { return *p + x; };
  CHECK(f(1) == 42);

  CHECK_FALSE(Function());
  CHECK_FALSE(Function(nullptr));
  int (*null_pointer)(int) = nullptr;
  CHECK_FALSE(Function(null_pointer));
  CHECK_FALSE(Function(std::function<int(int)>()));
  CHECK(Function(std::function<int(int)>([](int x) { return x; }))(3) == 3);
  int (*twice)(int) = [](int x) { return 2 * x; };
  CHECK(Function(twice)(4) == 8);
}

int Twice(int x) { return 2 * x; }

TEST_CASE("a function named directly, and a value-returning callable for a void signature") {
  Function by_name = Twice;  // not tested for null: a function's address never is
  CHECK(by_name(5) == 10);
  int calls = 0;
  InlineFunction<void(int), 16> discards = [&calls](int x) {
    ++calls;
    return x;  // discarded, as std::function<void(int)> does
  };
  discards(1);
  CHECK(calls == 1);
}

TEST_CASE("moving a function in from inside the callable it replaces") {
  // The callable being replaced owns the source: the source must be taken before it goes.
  struct Holder {
    std::shared_ptr<Function> inner;
    int operator()(int x) const { return (*inner)(x); }
  };
  auto inner = std::make_shared<Function>([](int x) { return x + 100; });
  Function outer = Holder{inner};
  Function* source = inner.get();
  inner.reset();  // only `outer`'s callable owns the source now
  outer = std::move(*source);
  CHECK(outer(1) == 101);
}

TEST_CASE("a mutable callable keeps its state between calls") {
  Function counter = [n = 0](int x) mutable { return n += x; };
  counter(1);
  counter(2);
  CHECK(counter(3) == 6);
}

}  // namespace
}  // namespace zrpc::internal
