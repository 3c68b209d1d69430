// CollectiveOp: one collective in flight, as its algorithm sees it: who takes part (ranks
// of the communicator, mapped to world ranks for the transport), the tag its messages
// carry, its deadline, scratch memory, and the element-wise kernels.
//
// Messages. An algorithm numbers its messages with `step`s, any values it likes as long
// as a sender and its receiver agree and a receiver posts its receives from one peer in
// step order (tag.hpp: steps wrap). Starting a message never suspends; wait() does, and
// checks that a receive got exactly the bytes it expected: a different size means the
// ranks disagree on counts or dtypes, and is an Error(Errc::size_mismatch) naming the
// peer, never a silent truncation.
//
// Failure. The op owns every transfer it starts (a Message is a handle to one), so when an
// algorithm throws, settle() can see to each one still in flight before the caller gets
// the error back: receives are cancelled, and transfers UCX cannot let go of within a
// short grace (a send to a rank that will never receive it, a receive whose message is
// half in) are ended by closing the endpoint to their peer. Only then may the caller
// reuse or free its buffers; without this UCX would go on reading and writing them.
// abort() is how the Communicator fails an op when a member it is not talking to dies.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <list>
#include <optional>
#include <sched.h>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <boost/asio/awaitable.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <braid/core/buffer.hpp>
#include <braid/core/deadline.hpp>
#include <braid/core/reduce_op.hpp>
#include <braid/trace/span.hpp>
#include <braid/transport/ucx/ucx_worker.hpp>

#include "collectives/doorbell.hpp"
#include "collectives/scratch_pool.hpp"

namespace braid::collectives::detail {

// Steps an algorithm may use wrap at this value; the two above it are reserved.
inline constexpr std::uint32_t kAlgorithmSteps = 4094;
inline constexpr std::uint32_t kPointToPointStep = 4094;  // Communicator::send/recv
inline constexpr std::uint32_t kFingerprintStep = 4095;   // BRAID_DEBUG=detail

// poll_until: spin this long, then sleep in naps doubling from the first to the longest.
inline constexpr auto kSpinWindow = std::chrono::microseconds(50);
// ... unless the partners are known to be inside the same operation, moving its bytes: then
// they finish soon, and a nap would only add its length to the operation (measured: a
// 1 MiB single-copy broadcast took 170 µs with the short window, 95 µs with this one).
// Not with more ranks than cores: there the spinning takes the core a partner needs
// (measured at 4 ranks on 2 cores: 64 KiB all-reduce 53-63 µs with the short window,
// 64-145 µs with this one).
inline constexpr auto kPartnersBusySpinWindow = std::chrono::microseconds(1000);
// ... and, in the spin, checks this many times between passes through the io_context.
inline constexpr int kChecksInPlace = 32;
// ... or, with more ranks than cores, yields the core this many times.
inline constexpr int kYieldsInPlace = 4;
inline constexpr auto kFirstNap = std::chrono::microseconds(10);
inline constexpr auto kLongestNap = std::chrono::microseconds(200);
// With a doorbell (doorbell.hpp) a wait sleeps until a partner rings, and wakes on its own
// only this often, to check the deadline and aborts: a ring that never comes costs this.
inline constexpr auto kDoorbellFallback = std::chrono::microseconds(1000);

// A spin-wait hint: lets the sibling hyperthread run and saves power while spinning.
inline void cpu_relax() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
}

struct Message {
  transport::Transfer* transfer = nullptr;  // owned by the CollectiveOp
  int peer = -1;                            // rank in the op's group when the message started
  int world_peer = -1;                      // the same peer's world rank
  std::size_t bytes = 0;                    // sent, or expected
  std::uint32_t step = 0;
  bool receive = false;
  bool exact = false;  // a receive that must get exactly `bytes`
};

class CollectiveOp {
 public:
  // `deadline`: when the op fails with a timeout; kDefaultDeadline: `timeout` after the op
  // first has to wait (a message, a flag), so that an operation that never waits never
  // reads the clock (~44 ns on the dev VM, a tenth of a small shared-memory all-reduce).
  CollectiveOp(transport::UcxWorker& transport, std::span<const int> world_ranks, int rank,
               std::uint32_t communicator, std::uint64_t sequence, Deadline deadline,
               Clock::duration timeout, ScratchPool& scratch)
      : transport_(transport),
        world_ranks_(world_ranks),
        rank_(rank),
        communicator_(communicator),
        sequence_(sequence),
        deadline_(deadline),
        timeout_(timeout),
        scratch_(scratch),
        self_world_rank_(world_ranks[static_cast<std::size_t>(rank)]) {}

  // Ranks, size and peers are those of the op's current group: the whole communicator,
  // or the sub-group a Subgroup scope selected.
  int rank() const noexcept { return group_.empty() ? rank_ : group_rank_; }
  int size() const noexcept {
    return static_cast<int>(group_.empty() ? world_ranks_.size() : group_.size());
  }
  int world_rank(int rank) const noexcept {
    const auto r = static_cast<std::size_t>(rank);
    return world_ranks_[group_.empty() ? r : static_cast<std::size_t>(group_[r])];
  }

  // For its lifetime, the op runs among `members` (communicator ranks, this one among
  // them) as if they were the whole communicator: rank(), size() and message peers are
  // theirs. Hierarchical algorithms run their intra- and inter-node phases in such
  // scopes. Messages keep the op's communicator and sequence and are told apart by
  // sender and step; inside the scope, algorithm steps count from `first_step`, so that
  // two phases among the same peers can keep their messages apart (and where steps wrap,
  // UCX's in-order matching per sender and tag still pairs them up, as tag.hpp explains).
  // Failure handling (abort, settle) covers messages from every scope.
  class Subgroup {
   public:
    Subgroup(CollectiveOp& op, std::span<const int> members, std::uint32_t first_step = 0);
    ~Subgroup() {
      op_.group_ = saved_group_;
      op_.group_rank_ = saved_rank_;
      op_.step_base_ = saved_step_base_;
    }
    Subgroup(const Subgroup&) = delete;
    Subgroup& operator=(const Subgroup&) = delete;

   private:
    CollectiveOp& op_;
    std::span<const int> saved_group_;
    int saved_rank_;
    std::uint32_t saved_step_base_;
  };
  std::uint64_t sequence() const noexcept { return sequence_; }
  // Fixes the deadline now if it waits for the first wait.
  Deadline deadline() noexcept { return deadline_at(Clock::now()); }

  // The communicator's timeline row; phase() and waiting() spans nest under the
  // collective's span there. `traced`: whether the op's own span is recorded (a small op
  // sampled out of the trace records nothing inside it either). `record_steps`: whether
  // phase() records (an op below BRAID_TRACE_STEPS_KIB records its own span alone: a step
  // span costs ~20 ns, a share of a small op worth more than the detail).
  void set_track(trace::Track track, bool traced, bool record_steps) noexcept {
    track_ = track;
    traced_ = traced;
    record_steps_ = record_steps;
  }
  // A step of the algorithm (a ring phase, a chunk), where steps are recorded.
  trace::AsyncSpan phase(trace::Name name, std::size_t bytes = 0) const noexcept {
    if (!record_steps_) return {};
    return trace::AsyncSpan(trace::Category::step, name, track_, bytes);
  }
  // A wait for something outside the op (its turn behind an earlier op): recorded whenever
  // the op is, however small, since it happens only when the op stalls.
  trace::AsyncSpan waiting(trace::Name name) const noexcept {
    if (!traced_) return {};
    return trace::AsyncSpan(trace::Category::step, name, track_);
  }

  Message send(int peer, Buffer data, std::uint32_t step);
  Message recv(int peer, Buffer data, std::uint32_t step);
  // Message steps outside the algorithms' range (point-to-point, fingerprints).
  Message send_reserved(int peer, Buffer data, std::uint32_t reserved_step);
  Message recv_reserved(int peer, Buffer data, std::uint32_t reserved_step, bool exact_size);
  // Completes a message; returns the bytes received (a receive) or sent.
  asio::awaitable<std::size_t> wait(Message& message);
  asio::awaitable<void> wait_all(std::span<Message> messages);

  ScratchPool::Lease scratch(std::size_t bytes) { return scratch_.acquire(bytes); }

  // A member of the communicator died (world rank `peer`): pending receives are cancelled
  // and every wait from now on fails with Errc::peer_failed naming it.
  void abort(int peer, std::string why);
  // The first member (by communicator rank) known to have failed, as "rank R failed: why";
  // empty while none has. For errors that follow from a failure without seeing it.
  std::string failed_member() const;
  // As abort(), with the whole of the error's message given (a member that left the job
  // without issuing this op is not a member that failed).
  void abort_with(int peer, std::string message);

  // Point-to-point ops (Communicator::send and recv): the peer, a communicator rank, and
  // the direction; collectives have none.
  struct PointToPoint {
    int peer = -1;
    bool sending = false;
  };
  void set_point_to_point(PointToPoint p) noexcept { point_to_point_ = p; }
  const std::optional<PointToPoint>& point_to_point() const noexcept { return point_to_point_; }
  // After a failure: ends every transfer still in flight (see above). Never throws.
  asio::awaitable<void> settle(std::string why);

  // Waits for `ready()` (memory another process writes) without blocking the runtime:
  // between checks the coroutine goes back to the io_context, so UCX progress, timers
  // and failure notices still run; every few rounds it also yields the core, which a
  // peer on an oversubscribed node needs. Fails on abort() and at the deadline.
  // `crowded`: more ranks on the node than cores (see the spin below). `doorbell`: where
  // the partners ring one when they raise a flag, past the spin the wait sleeps on it
  // instead of napping (null: naps); `wake`, what wakes it.
  enum class Wake { ring, turn };
  template <class Ready>
  asio::awaitable<void> poll_until(Ready ready, std::string_view what,
                                   std::chrono::microseconds spin_window, bool crowded,
                                   Doorbell* doorbell, Wake wake = Wake::ring) {
    // Often ready at once (the partners arrived first): then no clock read and no timer,
    // whose construction takes the io_context's service-registry lock.
    if (ready()) co_return;
    const auto executor = co_await asio::this_coro::executor;
    // A clock read costs ~44 ns on the dev VM, as much as a short wait's whole spin: the
    // clock is read every 16th round only, and the spin window starts at the first read.
    std::optional<Clock::time_point> started;
    bool spinning = true;
    auto nap = kFirstNap;
    std::optional<asio::steady_timer> timer;
    for (unsigned round = 0; !ready(); ++round) {
      if (abort_) throw_aborted();
      if ((round & 15) == 15) {
        const auto now = Clock::now();
        if (now > deadline_at(now)) throw_timeout(what);
        if (!started) started = now;
        spinning = now - *started < spin_window;
      }
      if (spinning) {
        // With more ranks than cores the rank we wait for may need this very core: give it
        // up every round (4 ranks on 2 cores, 16-byte all-reduce: 5.6 -> 4.3 us against
        // every fourth round). Otherwise only now and then, for threads that are not ranks
        // (a training loop's compute): a yield is a system call, and yielding every round
        // took a 2-rank 16-byte all-reduce from 0.55 to 0.9 us. There, check a few times
        // in place before going back to the io_context, whose every pass may poll epoll
        // (a system call): the partner's flag is usually a few hundred ns away. Crowded,
        // yield and check a few times in place likewise: 4 ranks on 2 cores, 16-byte
        // all-reduce 4.9 -> 4.1 us, barrier 4.5 -> 3.5 us (three alternating runs).
        if (!crowded && (round & 63) == 63) sched_yield();
        const int checks = crowded ? kYieldsInPlace : kChecksInPlace;
        bool arrived = false;
        for (int check = 0; check < checks && !(arrived = ready()); ++check) {
          if (crowded) {
            sched_yield();
          } else {
            cpu_relax();
          }
        }
        if (arrived) break;
        co_await asio::post(executor, asio::use_awaitable);
        continue;
      }
      // Past the spin window the partner is busy elsewhere (still computing the gradients
      // it will bring): sleep, so this thread stops taking CPU from the compute threads it
      // is meant to overlap with. On the doorbell, until the partner raises its flag;
      // without one, in growing naps, which cost up to kLongestNap of latency on waits
      // that last that long anyway, and a wake-up each.
      if (doorbell == nullptr) {
        if (!timer) timer.emplace(executor);
        timer->expires_after(nap);
        co_await timer->async_wait(asio::use_awaitable);
        nap = std::min(nap * 2, kLongestNap);
      } else if (wake == Wake::turn) {
        co_await doorbell->wait_for_turn(kDoorbellFallback);
      } else {
        co_await doorbell->sleep_unless(ready, kDoorbellFallback);
      }
      const auto now = Clock::now();
      if (now > deadline_at(now)) throw_timeout(what);
    }
  }

 private:
  Deadline deadline_at(Clock::time_point now) noexcept {
    if (deadline_ == kDefaultDeadline) deadline_ = now + timeout_;
    return deadline_;
  }
  [[noreturn]] void throw_aborted() const;
  [[noreturn]] void throw_timeout(std::string_view what) const;

  // Every transfer started, with its peer's world rank. A list: stable addresses for
  // Message handles, and no allocation for the many operations that send no message (a
  // std::deque allocates two blocks on construction).
  struct Started {
    transport::Transfer transfer;
    int world_peer;
  };
  std::list<Started> transfers_;
  struct Abort {
    int peer;
    std::string message;
  };
  std::optional<Abort> abort_;
  std::optional<PointToPoint> point_to_point_;

  transport::UcxWorker& transport_;
  std::span<const int> world_ranks_;
  int rank_;
  std::uint32_t communicator_;
  std::uint64_t sequence_;
  Deadline deadline_;
  Clock::duration timeout_;
  ScratchPool& scratch_;
  int self_world_rank_;
  std::span<const int> group_;  // communicator ranks of the current Subgroup; empty: all
  int group_rank_ = -1;
  std::uint32_t step_base_ = 0;  // added to algorithm steps inside a Subgroup
  trace::Track track_;
  bool traced_ = true;
  bool record_steps_ = true;
};

// ---- element-wise work shared by the algorithms

// dst = a op b, element-wise (avg reduces as sum; finish_average divides).
void combine(const Buffer& dst, const Buffer& a, const Buffer& b, ReduceOp op);
// For avg, divides a fully reduced block by the number of contributions; else nothing.
void finish_average(const Buffer& data, ReduceOp op, int contributions);
// The last combine of a block: combine(), then finish_average(), in one pass over memory.
void combine_and_finish(const Buffer& dst, const Buffer& a, const Buffer& b, ReduceOp op,
                        int contributions);
// dst = src (same count and dtype); nothing when they are the same memory.
void copy(const Buffer& dst, const Buffer& src);

// How `count` elements split into `parts` nearly equal consecutive ranges: the first
// count % parts ranges are one element longer.
struct EvenSplit {
  std::size_t count;
  std::size_t parts;
  std::size_t size(std::size_t i) const noexcept {
    return count / parts + (i < count % parts ? 1 : 0);
  }
  std::size_t offset(std::size_t i) const noexcept {
    return i * (count / parts) + std::min(i, count % parts);
  }
};

}  // namespace braid::collectives::detail
