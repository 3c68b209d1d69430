// How NcclCommunicator waits on NCCL and the GPU: its calls are non-blocking, so it polls
// (spinning briefly, then napping) until a call has settled (ncclCommGetAsyncError) or an
// operation's event has passed on the GPU, watching NCCL's asynchronous error meanwhile;
// past the deadline it aborts the communicator.
#include <algorithm>
#include <chrono>

#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <fmt/format.h>

#include <braid/collectives/nccl_communicator.hpp>
#include <braid/core/error.hpp>

namespace braid::collectives {
namespace {

// Completion polling: spin (yielding to the runtime) this long, then nap, doubling.
// Spinning keeps an 8-byte all-reduce's added latency to a few microseconds, where a
// host-function callback would add 5-30; naps keep a long wait off the CPU.
constexpr auto kSpinWindow = std::chrono::microseconds(200);
constexpr auto kFirstNap = std::chrono::microseconds(20);
constexpr auto kLongestNap = std::chrono::milliseconds(1);
// ncclCommGetAsyncError is a few hundred ns: checked every this many event polls.
constexpr unsigned kAsyncErrorEvery = 64;

}  // namespace

template <class Done>
asio::awaitable<void> NcclCommunicator::poll(std::string_view what, std::string_view late,
                                             Deadline deadline, Done done) {
  const auto executor = co_await asio::this_coro::executor;
  asio::steady_timer timer(executor);
  const auto started = Clock::now();
  auto nap = std::chrono::duration_cast<Clock::duration>(kFirstNap);
  for (unsigned round = 1;; ++round) {
    check_usable(what);
    if (done(round)) co_return;
    const auto now = Clock::now();
    if (now > deadline) {
      const std::string why = fmt::format("{} {}", what, late);
      abort(why);
      throw error(Errc::timeout, why, what);
    }
    if (now - started < kSpinWindow) {
      co_await asio::post(executor, asio::use_awaitable);
    } else {
      timer.expires_after(nap);
      co_await timer.async_wait(asio::use_awaitable);
      nap = std::min<Clock::duration>(nap * 2, kLongestNap);
    }
  }
}

bool NcclCommunicator::settled(std::string_view what) {
  ncclResult_t state = ncclSuccess;
  const ncclResult_t queried = ncclCommGetAsyncError(comm_, &state);
  if (queried != ncclSuccess) fail(what, queried);
  if (state != ncclSuccess && state != ncclInProgress) fail(what, state);
  return state == ncclSuccess;
}

asio::awaitable<void> NcclCommunicator::settle(std::string_view what, Deadline deadline) {
  co_await poll(what, "did not finish within the timeout", deadline,
                [this, what](unsigned) { return settled(what); });
}

asio::awaitable<void> NcclCommunicator::await_done(CudaEvent& done, std::string_view what,
                                                   Deadline deadline) {
  co_await poll(what,
                "did not complete within the timeout (a rank missing, or ranks disagreeing on "
                "the call or its counts)",
                deadline, [this, &done, what](unsigned round) {
                  if (done.query()) return true;
                  if (round % kAsyncErrorEvery == 0) (void)settled(what);
                  return false;
                });
}

std::unique_ptr<CudaEvent> NcclCommunicator::take_event() {
  if (free_events_.empty()) return std::make_unique<CudaEvent>(device_);
  auto event = std::move(free_events_.back());
  free_events_.pop_back();
  return event;
}

void NcclCommunicator::give_back(std::unique_ptr<CudaEvent> event) {
  free_events_.push_back(std::move(event));
}

}  // namespace braid::collectives
