// Future<T>: the handle non-coroutine callers (an autograd hook, a plain training loop)
// get for work running on a Runtime. wait(), wait_for(), ready(), and get(), which
// returns the value or rethrows the operation's exception.
//
// Waiting on the runtime thread that must complete the future would deadlock; it throws
// InvariantError instead (co_await the awaitable there).
#pragma once

#include <chrono>
#include <condition_variable>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <type_traits>
#include <utility>
#include <variant>

#include <braid/core/enforce.hpp>

namespace braid {

namespace detail {

template <class T>
using FutureValue = std::conditional_t<std::is_void_v<T>, std::monostate, T>;

template <class T>
struct FutureState {
  std::mutex mutex;
  std::condition_variable done_changed;
  bool done = false;
  std::optional<FutureValue<T>> value;
  std::exception_ptr error;
  // The thread that completes this future; waiting there would never return.
  std::thread::id completing_thread;

  void check_waiter() const {
    BRAID_ENFORCE(std::this_thread::get_id() != completing_thread,
                  "waiting on a braid::Future from the runtime thread that completes it would "
                  "deadlock; co_await the operation instead");
  }
};

}  // namespace detail

template <class T>
class Future {
 public:
  Future() = default;

  bool valid() const noexcept { return state_ != nullptr; }

  bool ready() const {
    check_valid();
    std::lock_guard lock(state_->mutex);
    return state_->done;
  }

  void wait() const {
    check_valid();
    std::unique_lock lock(state_->mutex);
    if (state_->done) return;
    state_->check_waiter();
    state_->done_changed.wait(lock, [&] { return state_->done; });
  }

  // True if the future became ready within `timeout`.
  template <class Rep, class Period>
  bool wait_for(const std::chrono::duration<Rep, Period>& timeout) const {
    check_valid();
    std::unique_lock lock(state_->mutex);
    if (state_->done) return true;
    state_->check_waiter();
    return state_->done_changed.wait_for(lock, timeout, [&] { return state_->done; });
  }

  // Waits, then returns the value or rethrows the error. The value is moved out: call
  // get() once.
  T get() {
    wait();
    std::lock_guard lock(state_->mutex);
    if (state_->error) std::rethrow_exception(state_->error);
    BRAID_ENFORCE(state_->value.has_value(), "Future::get() called twice");
    if constexpr (std::is_void_v<T>) {
      state_->value.reset();
    } else {
      T out = std::move(*state_->value);
      state_->value.reset();
      return out;
    }
  }

 private:
  template <class U>
  friend class Promise;
  explicit Future(std::shared_ptr<detail::FutureState<T>> state) : state_(std::move(state)) {}
  void check_valid() const { BRAID_ENFORCE(state_ != nullptr, "use of an empty braid::Future"); }

  std::shared_ptr<detail::FutureState<T>> state_;
};

// The completing side of a Future. Completing twice is an invariant violation.
template <class T>
class Promise {
 public:
  explicit Promise(std::thread::id completing_thread = {})
      : state_(std::make_shared<detail::FutureState<T>>()) {
    state_->completing_thread = completing_thread;
  }

  Future<T> get_future() const { return Future<T>(state_); }

  template <class... V>
  void set_value(V&&... value) {
    finish([&] { state_->value.emplace(std::forward<V>(value)...); });
  }
  void set_exception(std::exception_ptr error) {
    finish([&] { state_->error = std::move(error); });
  }

 private:
  template <class F>
  void finish(F&& store) {
    // Once `done` is set, the waiter may return and destroy this Promise (Runtime::run
    // keeps it on the waiter's stack), so the notify goes through a local reference.
    const std::shared_ptr<detail::FutureState<T>> state = state_;
    {
      std::lock_guard lock(state->mutex);
      BRAID_ENFORCE(!state->done, "a braid::Promise was completed twice");
      store();
      state->done = true;
    }
    state->done_changed.notify_all();
  }

  std::shared_ptr<detail::FutureState<T>> state_;
};

}  // namespace braid
