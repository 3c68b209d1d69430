#include <chrono>

#include <boost/asio/post.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <braid/core/error.hpp>
#include <braid/core/foreign_completion.hpp>
#include <braid/core/stream.hpp>

namespace braid {
namespace {

// A CUDA event's on_complete is a host function on a helper stream, which CUDA's callback
// thread runs 5-30 us after the work: more than a staged 64 KiB copy takes. So a CUDA
// wait first polls cudaEventQuery (a few hundred ns) this long, yielding the runtime
// thread between polls so UCX and other coroutines keep running; only a longer wait pays
// for the callback. Host events signal from their stream's worker thread at once and
// skip the poll.
constexpr auto kCudaPollWindow = std::chrono::microseconds(200);

}  // namespace

asio::awaitable<void> wait(Event& event, Deadline deadline) {
  if (event.kind() == StreamKind::cuda) {
    const auto executor = co_await asio::this_coro::executor;
    const auto poll_until = std::min(deadline, Clock::now() + kCudaPollWindow);
    do {
      if (event.query()) co_return;
      co_await asio::post(executor, asio::use_awaitable);
    } while (Clock::now() < poll_until);
  }
  // GCC 12 workarounds. The lambda captures a local pointer: a lambda's capture of a
  // coroutine parameter binds to the caller's copy, gone after the first suspension. The
  // context is a named local: an aggregate temporary inside a co_await expression is
  // copied bitwise into the frame and then freed twice.
  Event* target = &event;
  ErrorContext context{.operation = "event wait"};
  try {
    co_await await_foreign(
        [target](ForeignSignal<> signal) { target->on_complete(std::move(signal)); }, deadline,
        std::move(context));
  } catch (const Error& e) {
    if (e.code() != Errc::timeout) throw;
    // A CUDA stream that failed never runs the host function that would have signalled:
    // query() turns that silent timeout into the CUDA error. An event that completed just
    // as the deadline fired is complete, which is what the caller asked for.
    if (event.query()) co_return;
    throw;
  }
}

}  // namespace braid
