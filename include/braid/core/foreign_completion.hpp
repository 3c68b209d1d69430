// Awaiting something that a foreign thread completes: a host stream's worker, a CUDA
// host function, a UCX completion callback. The foreign side gets a ForeignSignal and
// calls it from whatever thread it runs on; the coroutine resumes on its own executor,
// never inside the foreign callback.
//
//   co_await braid::await_foreign(
//       [&](braid::ForeignSignal<> signal) { api_register_callback(std::move(signal)); },
//       deadline, {.operation = "event wait"});
//
// Rules the helper keeps so that callers need not:
// - The signal only posts to the awaiting executor (no inline resumption), so it is safe
//   to call from a thread that must not block or re-enter the caller's code.
// - The first of {signal, deadline} wins; the other is ignored. A signal that arrives after
//   the deadline fired (or twice) touches only shared state that it co-owns: no dangling
//   references, no second resumption.
// - If the awaiting executor's io_context is destroyed while the coroutine is suspended,
//   the suspended coroutine is dropped with it (as Asio does with every pending operation)
//   and a later signal does nothing; it never posts into a dead io_context.
//
// Cost per await: one shared state allocation, one type-erased handler, one steady_timer
// wait (a timer-queue insert and cancel), and one post from the foreign thread; a few
// hundred nanoseconds of CPU. It is not cancellable other than by its deadline.
#pragma once

#include <concepts>
#include <exception>
#include <memory>
#include <mutex>
#include <type_traits>
#include <utility>

#include <boost/asio/any_completion_handler.hpp>
#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/append.hpp>
#include <boost/asio/async_result.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <braid/core/deadline.hpp>
#include <braid/core/error.hpp>

namespace braid {

namespace asio = boost::asio;

namespace detail {

// The completion signature for an await of T; use_awaitable rethrows the exception_ptr.
template <class T>
struct ForeignSignatureOf {
  using type = void(std::exception_ptr, T);
};
template <>
struct ForeignSignatureOf<void> {
  using type = void(std::exception_ptr);
};
template <class T>
using ForeignSignature = typename ForeignSignatureOf<T>::type;

// Shared by the awaiting coroutine, its deadline timer and the foreign side. Whoever
// takes the handler first completes the await; everyone else finds it empty.
template <class T>
class ForeignCompletionState {
 public:
  using Handler = asio::any_completion_handler<ForeignSignature<T>>;

  ForeignCompletionState(asio::any_io_executor executor, Handler handler)
      : executor_(std::move(executor)), handler_(std::move(handler)) {}

  // Completes the await by posting the handler to the awaiting executor. Any thread.
  template <class... Value>
  void finish(std::exception_ptr error, Value&&... value) {
    Handler handler = take();
    if (!handler) return;
    asio::post(executor_,
               asio::append(std::move(handler), std::move(error), std::forward<Value>(value)...));
  }

  // Takes the handler away so nobody completes it; the caller destroys it (which drops a
  // suspended coroutine). Any thread.
  Handler take() {
    std::lock_guard lock(mutex_);
    return std::move(handler_);
  }

 private:
  asio::any_io_executor executor_;
  std::mutex mutex_;
  Handler handler_;
};

// Lives in the deadline timer's completion handler. Asio destroys that handler without
// calling it only when the io_context shuts down; then the await is abandoned so that a
// later foreign signal cannot post into the dying io_context.
template <class T>
class AbandonOnDrop {
 public:
  explicit AbandonOnDrop(std::shared_ptr<ForeignCompletionState<T>> state)
      : state_(std::move(state)) {}
  AbandonOnDrop(AbandonOnDrop&&) noexcept = default;
  AbandonOnDrop& operator=(AbandonOnDrop&&) = delete;
  ~AbandonOnDrop() {
    if (state_) state_->take();
  }
  ForeignCompletionState<T>& state() const { return *state_; }

 private:
  std::shared_ptr<ForeignCompletionState<T>> state_;
};

}  // namespace detail

// The foreign side's handle. Copyable; call it from any thread. Only the first call
// after the await started has an effect; later calls (or calls after the deadline) are
// ignored.
template <class T = void>
class ForeignSignal {
 public:
  explicit ForeignSignal(std::shared_ptr<detail::ForeignCompletionState<T>> state)
      : state_(std::move(state)) {}

  void set_value() const requires std::is_void_v<T> { state_->finish(nullptr); }
  template <class V>
  requires(!std::is_void_v<T> && std::convertible_to<V, T>) void set_value(V&& value) const {
    state_->finish(nullptr, T(std::forward<V>(value)));
  }
  // The await rethrows `error`.
  void set_error(std::exception_ptr error) const {
    if constexpr (std::is_void_v<T>) {
      state_->finish(std::move(error));
    } else {
      state_->finish(std::move(error), T{});
    }
  }

 private:
  std::shared_ptr<detail::ForeignCompletionState<T>> state_;
};

// Suspends the calling coroutine, calls start(ForeignSignal<T>) on the coroutine's
// executor to hand the signal to the foreign API, and resumes on that executor with the
// signalled value or error. Throws Error(Errc::timeout, context) when `deadline` passes
// first; an exception thrown by `start` is rethrown here. T must be default-constructible
// when not void (the error paths need a placeholder value).
template <class T = void, class Start>
requires std::invocable<Start&, ForeignSignal<T>> &&
    (std::is_void_v<T> ||
     std::default_initializable<T>)asio::awaitable<T> await_foreign(Start start, Deadline deadline,
                                                                    ErrorContext context) {
  using State = detail::ForeignCompletionState<T>;
  // The lambda below uses frame locals, not the parameters: GCC 12 binds a lambda's
  // reference to a coroutine parameter to the caller's copy, gone after suspension.
  Start start_foreign = std::move(start);
  ErrorContext timeout_context = std::move(context);
  asio::any_io_executor executor = co_await asio::this_coro::executor;
  asio::steady_timer timer(executor, deadline);
  auto initiate = [&](typename State::Handler handler) {
    auto state = std::make_shared<State>(executor, std::move(handler));
    timer.async_wait([guard = detail::AbandonOnDrop<T>(state),
                      context = std::move(timeout_context)](const boost::system::error_code& ec) {
      // operation_aborted: the coroutine resumed (the signal won) and destroyed the timer.
      if (ec) return;
      auto timeout = std::make_exception_ptr(
          Error(Errc::timeout, "did not complete before its deadline", context));
      if constexpr (std::is_void_v<T>) {
        guard.state().finish(std::move(timeout));
      } else {
        guard.state().finish(std::move(timeout), T{});
      }
    });
    try {
      start_foreign(ForeignSignal<T>(state));
    } catch (...) {
      ForeignSignal<T>(state).set_error(std::current_exception());
    }
  };
  // `timer` lives in this frame, which stays alive while the await is pending; it is
  // destroyed (its wait cancelled) right after the resumption.
  co_return co_await asio::async_initiate<decltype(asio::use_awaitable),
                                          detail::ForeignSignature<T>>(initiate,
                                                                       asio::use_awaitable);
}

}  // namespace braid
