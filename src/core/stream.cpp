#include <braid/core/error.hpp>
#include <braid/core/foreign_completion.hpp>
#include <braid/core/stream.hpp>

namespace braid {

asio::awaitable<void> wait(Event& event, Deadline deadline) {
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
