// InlineFunction: a move-only std::function that keeps callables up to kInline bytes inside
// itself, so that a call's completion callback costs no heap allocation (DoneCallback).
//
// std::function stores inline only what fits two pointers (libstdc++), so any callback that
// captures three words -- a pointer to a window, an index and a start time, say -- allocates
// per call. 48 bytes holds six words; a larger callable (or one whose move may throw, or that
// needs more than max_align_t's alignment) goes to the heap as std::function would. Move-only
// suits a callback run exactly once, and takes move-only captures (a unique_ptr) that
// std::function refuses.
#ifndef ZRPC_RPC_IMPL_INLINE_FUNCTION_H_
#define ZRPC_RPC_IMPL_INLINE_FUNCTION_H_

#include <cstddef>
#include <functional>
#include <new>
#include <type_traits>
#include <utility>

namespace zrpc::internal {

template <typename Signature, size_t kInline>
class InlineFunction;

template <typename R, typename... Args, size_t kInline>
class InlineFunction<R(Args...), kInline> {
 public:
  InlineFunction() noexcept = default;
  InlineFunction(std::nullptr_t) noexcept {}  // NOLINT: as std::function

  template <typename F, typename D = std::decay_t<F>,
            typename = std::enable_if_t<!std::is_same_v<D, InlineFunction> &&
                                        std::is_invocable_r_v<R, D&, Args...>>>
  InlineFunction(F&& f) {  // NOLINT: implicit, as std::function
    if constexpr ((std::is_pointer_v<D> || std::is_member_pointer_v<D> ||
                   IsStdFunction<D>::value) &&
                  !std::is_function_v<std::remove_reference_t<F>>) {
      if (!f) return;  // an empty function pointer or std::function makes an empty one
    }
    if constexpr (kFitsInline<D>) {
      ::new (static_cast<void*>(storage_)) D(std::forward<F>(f));
      ops_ = &kInlineOps<D>;
    } else {
      *reinterpret_cast<D**>(storage_) = new D(std::forward<F>(f));
      ops_ = &kHeapOps<D>;
    }
  }

  InlineFunction(InlineFunction&& other) noexcept : ops_(other.ops_) {
    if (ops_ != nullptr) {
      ops_->move(other.storage_, storage_);
      other.ops_ = nullptr;
    }
  }
  InlineFunction& operator=(InlineFunction&& other) noexcept {
    if (this != &other) {
      // Take `other` first: it may live inside the callable that Reset destroys.
      InlineFunction taken(std::move(other));
      Reset();
      if (taken.ops_ != nullptr) {
        taken.ops_->move(taken.storage_, storage_);
        ops_ = std::exchange(taken.ops_, nullptr);
      }
    }
    return *this;
  }
  InlineFunction& operator=(std::nullptr_t) noexcept {
    Reset();
    return *this;
  }
  InlineFunction(const InlineFunction&) = delete;
  InlineFunction& operator=(const InlineFunction&) = delete;
  ~InlineFunction() { Reset(); }

  explicit operator bool() const noexcept { return ops_ != nullptr; }

  // Calls the callable; it must not be empty (std::function would throw; this is undefined).
  R operator()(Args... args) const {
    return ops_->invoke(const_cast<unsigned char*>(storage_), std::forward<Args>(args)...);
  }

  // Whether a callable of type F is kept inside (no allocation).
  template <typename F>
  static constexpr bool StoresInline() {
    return kFitsInline<std::decay_t<F>>;
  }

 private:
  template <typename T>
  struct IsStdFunction : std::false_type {};
  template <typename S>
  struct IsStdFunction<std::function<S>> : std::true_type {};

  template <typename D>
  static constexpr bool kFitsInline =
      sizeof(D) <= kInline &&
      alignof(D) <= alignof(std::max_align_t) && std::is_nothrow_move_constructible_v<D>;

  // Calls `d`; with R void, a value it returns is discarded (as std::function does).
  template <typename D>
  static R Invoke(D& d, Args&&... args) {
    if constexpr (std::is_void_v<R>) {
      std::invoke(d, std::forward<Args>(args)...);
    } else {
      return std::invoke(d, std::forward<Args>(args)...);
    }
  }

  struct Ops {
    R (*invoke)(void* storage, Args&&... args);
    // Moves the callable from `from` to `to` (raw storage) and destroys what is left in `from`.
    void (*move)(void* from, void* to) noexcept;
    void (*destroy)(void* storage) noexcept;
  };

  template <typename D>
  static constexpr Ops kInlineOps = {
      [](void* storage, Args&&... args) -> R {
        return Invoke(*static_cast<D*>(storage), std::forward<Args>(args)...);
      },
      [](void* from, void* to) noexcept {
        ::new (to) D(std::move(*static_cast<D*>(from)));
        static_cast<D*>(from)->~D();
      },
      [](void* storage) noexcept { static_cast<D*>(storage)->~D(); },
  };

  template <typename D>
  static constexpr Ops kHeapOps = {
      [](void* storage, Args&&... args) -> R {
        return Invoke(**static_cast<D**>(storage), std::forward<Args>(args)...);
      },
      [](void* from, void* to) noexcept { *static_cast<D**>(to) = *static_cast<D**>(from); },
      [](void* storage) noexcept { delete *static_cast<D**>(storage); },
  };

  void Reset() noexcept {
    if (ops_ != nullptr) std::exchange(ops_, nullptr)->destroy(storage_);
  }

  alignas(
      std::max_align_t) unsigned char storage_[kInline < sizeof(void*) ? sizeof(void*) : kInline];
  const Ops* ops_ = nullptr;
};

}  // namespace zrpc::internal

#endif  // ZRPC_RPC_IMPL_INLINE_FUNCTION_H_
