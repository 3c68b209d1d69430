// Set-up and tear-down of the UCX context and worker, and the progress loop.
//
// Progress loop. The worker's event fd (an epoll set over the transports' fds and UCX's
// internal eventfd) sits in the io_context. When it is readable, or while we spin,
// progress() polls the worker in a loop of its own:
//   - drain: ucp_worker_progress until it reports nothing. Completion callbacks only
//     queue their results here;
//   - if any operation completed, resume its coroutine right there, once UCX has
//     returned (asio::dispatch: inline on the runtime thread, posted for a strand), then
//     go back to the io_context (post_poll) so that what those coroutines posted runs;
//   - otherwise keep looping while there was activity within the spin window, going back
//     to the io_context every `slice` so that timers, socket I/O and work posted from
//     other threads wait at most that long;
//   - once the spin window has passed, arm the worker (ucp_worker_arm; UCS_ERR_BUSY means
//     it cannot sleep yet, so keep spinning) and wait on the fd.
// Why a loop and an inline resume rather than a post per round and a posted completion:
// every trip through the io_context runs its reactor (an epoll_wait(0) syscall, 0.35 us
// on the dev VM, 0.6 us per round with the post), and a completion posted from a handler
// queues behind that reactor run; a post per round cost 1.6 us one way where UCX alone
// takes 0.5. Now the reply to a ping leaves before we return to the io_context, so that
// trip overlaps the message's flight.
// Arming only before sleeping matters: an armed shared-memory interface makes every
// sender signal us (a sendto per message, uct_mm_ep_am_common_send sees
// UCT_MM_IFACE_FIFO_HEAD_EVENT_ARMED) and costs us a recvfrom per arm; arming on every
// round measured 2.3 us one way instead of 0.5 in a plain UCX ping-pong, 5-6 us in braid.
// Plain polling does see new messages after an arm (the mm FIFO is polled by its owner
// bit whatever the armed bit says). What once looked like "progress stops seeing messages
// once armed" is two ranks sharing one core: a rank that spins holds the core, so its
// peer cannot even send until the spin window ends, and every message then arrives a
// spin window late (reproduced with plain UCX: 55 us one way with both processes pinned
// to one core, 0.5 us on two). So once a wait outlasts a round trip, each round yields
// the core (yield_after).
// BRAID_UCX_SPIN_US trades a busy core after each burst for latency; 0 sleeps at once
// (an epoll wake-up per message).
#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <sched.h>
#include <string>
#include <string_view>
#include <unistd.h>
#include <utility>

#include <boost/asio/post.hpp>
#include <fmt/format.h>

#include <braid/core/config.hpp>
#include <braid/core/log.hpp>
#include <braid/transport/ucx/ucx_error.hpp>

#include "transport/ucx/ucx_worker_impl.hpp"

namespace braid::transport::detail {
namespace {

// See progress(): how long a spin stays free of syscalls before it starts yielding.
constexpr std::chrono::microseconds yield_after{2};
// See progress(): how long one call may spin with nothing completing before it lets the
// io_context's other handlers run. A trip through the io_context costs ~0.6 us, so this
// keeps it to a few percent of an idle spin.
constexpr std::chrono::microseconds slice{20};

std::chrono::nanoseconds spin_from(const UcxWorker::Options& options) {
  if (options.spin) return *options.spin;
  std::int64_t us = config::int_value("BRAID_UCX_SPIN_US");
  if (us < 0) {
    throw Error(Errc::invalid_environment, fmt::format("BRAID_UCX_SPIN_US={} is negative", us));
  }
  return std::chrono::microseconds(us);
}

// Sets a UCX variable unless the user set UCX_<name> in the environment: their choice
// wins, ours is only the default braid needs.
void set_default(ucp_config_t* config, const char* name, const std::string& value) {
  if (std::getenv(fmt::format("UCX_{}", name).c_str()) != nullptr) return;
  BRAID_UCX_CHECK(ucp_config_modify(config, name, value.c_str()), {.operation = "ucx.init"});
}

}  // namespace

UcxWorkerImpl::UcxWorkerImpl(Runtime& runtime, const UcxWorker::Options& options)
    : runtime_(runtime),
      spin_(spin_from(options)),
      keepalive_interval_(options.keepalive_interval),
      shared_memory_peer_errors_(options.shared_memory_peer_errors),
      network_only_(options.network_only),
      eager_messages_(options.eager_messages),
      close_timeout_(options.close_timeout) {}

UcxWorkerImpl::~UcxWorkerImpl() = default;

void UcxWorkerImpl::open() {
  const ErrorContext where{.rank = runtime_.options().rank, .operation = "ucx.init"};
  try {
    ucp_config_t* config = nullptr;
    BRAID_UCX_CHECK(ucp_config_read(nullptr, nullptr, &config), where);
    try {
      // A killed peer on shared memory is noticed only by keepalive rounds (which check
      // that the process still exists); UCX's default of 20 s is too slow for training.
      set_default(config, "KEEPALIVE_INTERVAL", fmt::format("{}ms", keepalive_interval_.count()));
      // See Options::shared_memory_peer_errors. UCP passes a name it does not know to
      // every transport when the worker opens its interfaces; POSIX_ and SYSV_ are the
      // per-transport spellings a user may have chosen instead.
      // Not where shared memory is off (network_only): UCX then calls the setting invalid.
      if (shared_memory_peer_errors_ && !network_only_ &&
          std::getenv("UCX_POSIX_ERROR_HANDLING") == nullptr &&
          std::getenv("UCX_SYSV_ERROR_HANDLING") == nullptr) {
        set_default(config, "MM_ERROR_HANDLING", "y");
      }
      if (network_only_) {
        const char* chosen = std::getenv("UCX_TLS");
        const std::string_view tls = chosen != nullptr ? chosen : "";
        const bool may_share =
            tls.starts_with('^') ||
            std::ranges::any_of(
                std::array{"all", "sm", "posix", "sysv", "cma", "knem", "xpmem"},
                [&](const char* t) { return tls.find(t) != std::string_view::npos; });
        if (chosen != nullptr && may_share) {
          log::warn(
              "UCX_TLS={} is kept as set, though ranks of other nodes share this "
              "machine's memory: bytes between nodes may not cross the network",
              chosen);
        }
        // "sm", UCX's alias for its shared-memory transports (posix, sysv, cma, knem,
        // xpmem): named one by one, those this UCX was built without are warned about at
        // every rank's start.
        set_default(config, "TLS", "^sm");
      }
      if (eager_messages_) set_default(config, "RNDV_THRESH", "inf");
      ucp_params_t params{};
      params.field_mask = UCP_PARAM_FIELD_FEATURES;
      params.features = UCP_FEATURE_TAG | UCP_FEATURE_WAKEUP;
      BRAID_UCX_CHECK(ucp_init(&params, config, &context_), where);
    } catch (...) {
      ucp_config_release(config);
      throw;
    }
    ucp_config_release(config);
    ucp_context_attr_t context_attributes{};
    context_attributes.field_mask = UCP_ATTR_FIELD_MEMORY_TYPES;
    if (ucp_context_query(context_, &context_attributes) == UCS_OK) {
      moves_cuda_memory_ = (context_attributes.memory_types & UCS_BIT(UCS_MEMORY_TYPE_CUDA)) != 0;
    }

    ucp_worker_params_t worker_params{};
    worker_params.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    worker_params.thread_mode = UCS_THREAD_MODE_SINGLE;
    BRAID_UCX_CHECK(ucp_worker_create(context_, &worker_params, &worker_), where);

    ucp_address_t* address = nullptr;
    std::size_t length = 0;
    BRAID_UCX_CHECK(ucp_worker_get_address(worker_, &address, &length), where);
    const auto* bytes = reinterpret_cast<const std::uint8_t*>(address);
    address_.assign(bytes, bytes + length);
    ucp_worker_release_address(worker_, address);

    int fd = -1;
    BRAID_UCX_CHECK(ucp_worker_get_efd(worker_, &fd), where);
    // stream_descriptor closes what it owns; UCX keeps owning the original.
    const int own_fd = ::dup(fd);
    if (own_fd < 0) {
      throw Error(std::error_code(errno, std::generic_category()),
                  "dup() of the UCX worker's event fd", where);
    }
    event_fd_.emplace(runtime_.context(), own_fd);
    watchdog_.emplace(runtime_.context());
  } catch (...) {
    teardown_ucx();
    throw;
  }
  last_activity_ = Clock::now();
  progress();
}

void UcxWorkerImpl::progress() {
  const auto slice_end = Clock::now() + slice;
  for (;;) {
    const bool events = drain() != 0;
    if (!completed_.empty()) {
      // Resumed first, the clock read later: what they start next (the reply to a ping)
      // leaves sooner. Their activity counts from the next round.
      activity_ = true;
      deliver_completions();
      if (closed_) return;  // a resumed coroutine destroyed the worker
      // The coroutines just resumed may have posted handlers (a co_spawn's completion, a
      // parallel group's bookkeeping) that only the io_context runs.
      post_poll();
      return;
    }
    const auto now = Clock::now();
    // Operations started since the last round count as activity now (their starts set a
    // flag rather than read the clock: 44 ns a read on the dev VM, twice per message).
    if (events || std::exchange(activity_, false)) last_activity_ = now;
    const auto idle = now - last_activity_;
    if (idle >= spin_) break;
    // A peer process sharing this core cannot send while we spin: without yielding,
    // each message would wait out our whole spin window. sched_yield() costs ~0.2 us
    // and returns at once when nothing else wants the core; we pay it only once a
    // wait has lasted longer than a ping-pong round trip.
    if (idle > yield_after) sched_yield();
    if (now >= slice_end) {
      post_poll();
      return;
    }
  }
  const ucs_status_t status = ucp_worker_arm(worker_);
  if (status == UCS_ERR_BUSY) {
    // Events arrived since the drain, or a transport cannot sleep yet (an mm interface
    // with sends queued for a full FIFO says BUSY until they go out, which for a dead
    // peer is until keepalive notices). Keep polling from the io_context rather than
    // looping here, so timers and completions still run.
    last_activity_ = Clock::now();
    post_poll();
    return;
  }
  if (status != UCS_OK) {
    // Cannot sleep safely: keep polling rather than miss a completion.
    log::error("ucp_worker_arm failed ({}); polling instead of sleeping",
               ucs_status_string(status));
    post_poll();
    return;
  }
  wait_for_events();
}

// A receive awaited while its message is on the way (the reply in a ping-pong, a
// partner's next step) polls the worker right there for a moment before it suspends: a
// completion found that way resumes nothing (the coroutine never left), so the message
// skips the trip through the completion queue, the coroutine's resumption by the
// io_context and, on the next wait, its reactor (an epoll_wait). Other operations that
// complete meanwhile are queued as in progress()'s drain and delivered by it.
// Cost: up to kInPlacePoll of the runtime thread per receive whose message is late, during
// which its other handlers wait; none with BRAID_UCX_SPIN_US=0, which asks for no spinning.
bool UcxWorkerImpl::poll_in_place(UcxOp* op) {
  constexpr std::chrono::nanoseconds kInPlacePoll = std::chrono::microseconds(2);
  if (spin_ == std::chrono::nanoseconds::zero() || closed_) return op->finished;
  // One ucp_worker_progress per round, not a drain: the round that finds our message
  // returns at once instead of making another (empty) call first.
  draining_ = true;
  try {
    const auto until = Clock::now() + std::min(spin_, kInPlacePoll);
    for (unsigned round = 1; !op->finished; ++round) {
      ucp_worker_progress(worker_);
      // The clock every few rounds: a read costs about as much as an idle round.
      if ((round & 7) == 0 && Clock::now() >= until) break;
    }
  } catch (...) {
    // A completion callback ran out of memory building its result: nobody will await
    // `op` now, so UCX is told to let go of its buffer.
    draining_ = false;
    detach(op);
    throw;
  }
  draining_ = false;
  // progress() delivers what completed meanwhile. Whatever else UCX has left (the rest of
  // a rendezvous we stopped short of) it finds too: track() posted it when `op` started.
  // (Posting on every event found here instead measured 0.69-0.97x ucx_perftest's 4 MiB
  // bandwidth against 0.97-1.13x.)
  if (!completed_.empty()) post_poll();
  return op->finished;
}

unsigned UcxWorkerImpl::drain() {
  draining_ = true;
  unsigned events = 0;
  while (ucp_worker_progress(worker_) != 0) ++events;
  draining_ = false;
  return events;
}

void UcxWorkerImpl::deliver_completions() {
  ready_.swap(completed_);
  std::size_t next = 0;
  try {
    while (next < ready_.size()) {
      Completion& done = ready_[next++];
      std::move(*done.handler).dispatch(std::move(done.error), done.length);
    }
  } catch (...) {
    // A completion handler threw (a coroutine's own handler, not the coroutine): the
    // other coroutines still get their results, through the io_context.
    for (; next < ready_.size(); ++next) {
      std::move(*ready_[next].handler).post(std::move(ready_[next].error), ready_[next].length);
    }
    ready_.clear();
    throw;
  }
  ready_.clear();
}

void UcxWorkerImpl::post_poll() {
  if (poll_posted_) return;
  poll_posted_ = true;
  asio::post(runtime_.context(), [self = shared_from_this()] {
    self->poll_posted_ = false;
    if (!self->closed_) self->progress();
  });
}

void UcxWorkerImpl::wait_for_events() {
  if (fd_wait_outstanding_) return;
  fd_wait_outstanding_ = true;
  event_fd_->async_wait(asio::posix::stream_descriptor::wait_read,
                        [self = shared_from_this()](const boost::system::error_code& error) {
                          self->fd_wait_outstanding_ = false;
                          if (self->closed_) return;
                          if (error == asio::error::operation_aborted) return;
                          if (error) {
                            log::error("waiting on the UCX event fd failed: {}; polling",
                                       error.message());
                            self->post_poll();
                            return;
                          }
                          // While a poll is posted, the spin owns progress and arms and
                          // waits when it ends.
                          if (!self->poll_posted_) self->progress();
                        });
}

void UcxWorkerImpl::shutdown() {
  if (worker_ == nullptr) return;
  closed_ = true;
  // Receives are cancelled at once; sends finish or are cancelled when endpoints close.
  for (UcxOp* op : pending_snapshot()) {
    if (op->is_linked()) abandon(op, Errc::closed);
  }
  close_endpoints();
  // No handler of ours may touch these after this point; queued ones see closed_.
  event_fd_.reset();
  watchdog_.reset();
  // Whatever UCX still holds is returned by ucp_worker_destroy, without callbacks once
  // the request is freed; the coroutines hear Errc::closed after the buffers are let go.
  std::vector<UcxOp*> leftovers = pending_snapshot();
  for (UcxOp* op : leftovers) ucp_request_free(op->request);
  for (UcxOp* op : orphans_) ucp_request_free(op->request);
  orphans_.clear();
  teardown_ucx();
  for (UcxOp* op : leftovers) finish(op, nullptr, UCS_ERR_CANCELED, 0);
}

void UcxWorkerImpl::teardown_ucx() noexcept {
  event_fd_.reset();
  if (worker_ != nullptr) ucp_worker_destroy(worker_);
  worker_ = nullptr;
  if (context_ != nullptr) ucp_cleanup(context_);
  context_ = nullptr;
}

}  // namespace braid::transport::detail
