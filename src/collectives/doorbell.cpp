#include "collectives/doorbell.hpp"

#include <cerrno>
#include <sys/eventfd.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <utility>
#include <vector>

#include <boost/asio/experimental/awaitable_operators.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <braid/core/error.hpp>

namespace braid::collectives::detail {
namespace {

// glibc 2.36 wraps both, older ones do not: the system calls themselves (x86-64 and
// aarch64 share the numbers, as every architecture added since 5.3 does).
#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif
#ifndef SYS_pidfd_getfd
#define SYS_pidfd_getfd 438
#endif

void close_quietly(int fd) noexcept {
  if (fd >= 0) ::close(fd);
}

// One ring of an eventfd. A full counter (2^64 - 2 unread rings) would refuse with EAGAIN;
// nothing else can fail here but a bad descriptor, and a missed ring costs only the
// sleeper's fallback.
void ring_eventfd(int fd) noexcept {
  const std::uint64_t one = 1;
  [[maybe_unused]] const ssize_t written = ::write(fd, &one, sizeof one);
}

}  // namespace

struct Doorbell::OnReactor {
  OnReactor(const asio::any_io_executor& executor, int watched) : watch(executor, watched) {}
  asio::posix::stream_descriptor watch;  // a descriptor of own_, which it closes
};

Doorbell::Doorbell() = default;

Doorbell::~Doorbell() {
  close_quietly(own_);
  for (const int bell : bells_) close_quietly(bell);
  if (on_reactor_ == nullptr) return;
  // No wait is in flight (operations hold their communicator, and with it the arena this
  // belongs to), but the reactor may be running on the runtime thread: hand it there.
  // Where the runtime has stopped, it is let go.
  const auto executor = on_reactor_->watch.get_executor();
  asio::post(executor, [gone = on_reactor_.release()] { delete gone; });
}

int Doorbell::open() noexcept {
  if (own_ < 0) own_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  return own_;
}

int Doorbell::connect(int rank, pid_t pid, int fd) noexcept {
  if (bells_.size() <= static_cast<std::size_t>(rank)) {
    bells_.resize(static_cast<std::size_t>(rank) + 1, -1);
  }
  const auto pidfd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
  if (pidfd < 0) return errno;
  const auto bell = static_cast<int>(::syscall(SYS_pidfd_getfd, pidfd, fd, 0));
  const int error = errno;
  ::close(pidfd);
  if (bell < 0) return error;
  close_quietly(std::exchange(bells_[static_cast<std::size_t>(rank)], bell));
  return 0;
}

void Doorbell::arm(int me, std::vector<std::uint32_t*> asleep) noexcept {
  me_ = me;
  asleep_ = std::move(asleep);
  bells_.resize(asleep_.size(), -1);
}

void Doorbell::ring(int rank) noexcept {
  ring_eventfd(bells_[static_cast<std::size_t>(rank)]);
}

void Doorbell::ring_self() noexcept {
  if (own_ >= 0) ring_eventfd(own_);
}

void Doorbell::drain() noexcept {
  std::uint64_t rings = 0;
  [[maybe_unused]] const ssize_t read = ::read(own_, &rings, sizeof rings);  // EAGAIN: none
}

Doorbell::OnReactor& Doorbell::on_reactor(const asio::any_io_executor& executor) {
  if (on_reactor_ == nullptr) {
    const int watched = ::dup(own_);
    if (watched < 0) {
      throw Error(std::error_code(errno, std::generic_category()),
                  "dup() of this rank's shared-memory doorbell");
    }
    on_reactor_ = std::make_unique<OnReactor>(executor, watched);
  }
  return *on_reactor_;
}

asio::awaitable<void> Doorbell::wait_for_ring(std::chrono::microseconds longest) {
  using namespace asio::experimental::awaitable_operators;
  const auto executor = co_await asio::this_coro::executor;
  OnReactor& reactor = on_reactor(executor);
  asio::steady_timer fallback(executor, longest);
  co_await (
      reactor.watch.async_wait(asio::posix::stream_descriptor::wait_read, asio::use_awaitable) ||
      fallback.async_wait(asio::use_awaitable));
}

asio::awaitable<void> Doorbell::wait_for_turn(std::chrono::microseconds longest) {
  const auto executor = co_await asio::this_coro::executor;
  asio::steady_timer nap(executor, longest);
  // Listed while it waits, and unlisted however the wait ends, a frame destroyed
  // suspended included (the io_context shutting down): turn_passed() then never reaches a
  // timer that is gone.
  struct Listed {
    std::vector<asio::steady_timer*>& sleepers;
    asio::steady_timer* nap;
    ~Listed() { std::erase(sleepers, nap); }
  };
  turn_sleepers_.push_back(&nap);
  const Listed listed{turn_sleepers_, &nap};
  // Cancelled by turn_passed(), or expired: either way, the caller looks again.
  boost::system::error_code woken;
  co_await nap.async_wait(asio::redirect_error(asio::use_awaitable, woken));
}

void Doorbell::turn_passed() noexcept {
  for (asio::steady_timer* nap : turn_sleepers_) {
    boost::system::error_code ignored;
    nap->cancel(ignored);
  }
}

}  // namespace braid::collectives::detail
