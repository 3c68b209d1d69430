// Doorbell: lets a rank that waits on a peer's shared-memory flag sleep until a peer
// raises one, instead of polling the flag in timed naps.
//
// Why: in data-parallel training a rank that launched a bucket waits milliseconds for a
// partner still computing backward. Naps (10 µs doubling to 200) cost a wake-up each and
// leave up to a nap of latency once the partner arrives; meanwhile the partner, done with
// its share, spins on the napper's flag. On a node whose cores the training threads fill,
// that spinning and those wake-ups are CPU time taken from backward (measured:
// docs/layers/collectives.md, "Waiting for partners").
//
// How: every rank makes an eventfd; each peer takes its own descriptor of it with
// pidfd_getfd (the same ptrace permission cross-memory attach needs, so where one works
// so does the other). A waiter counts itself asleep in its line of the arena, checks the
// flags once more, and then waits, through the runtime's reactor, for its eventfd to be
// written. A rank that raises a flag then fences and looks at every peer's count, and
// writes to the eventfd of each one asleep. The store-fence-load on both sides means that
// either the waiter sees the flag or the raiser sees the waiter (Dekker).
//
// The sleeper reads the eventfd's counter back before it looks at the flags: asio re-arms
// the descriptor at each wait, so a count left over would wake it at once.
//
// Cost: raising a flag, one fence and P-1 loads of lines that change only when a rank
// falls asleep; a ring, one write system call, made only toward a rank asleep. A sleep
// also has a fallback timer (the deadline and aborts are checked when it fires), so a
// ring that never came costs latency, never a hang.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <sys/types.h>
#include <vector>

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/steady_timer.hpp>

namespace braid::collectives::detail {

namespace asio = boost::asio;

class Doorbell {
 public:
  Doorbell();
  ~Doorbell();
  Doorbell(const Doorbell&) = delete;
  Doorbell& operator=(const Doorbell&) = delete;

  // Makes this rank's eventfd. Returns its number in this process, or -1 where the kernel
  // refused (the ranks then nap, as before doorbells).
  int open() noexcept;
  // Takes a descriptor of `rank`'s eventfd, number `fd` in process `pid`. Returns 0, or
  // the errno of the refusal (EPERM where ptrace access is denied, ENOSYS before Linux
  // 5.6).
  int connect(int rank, pid_t pid, int fd) noexcept;
  // Once every rank has connected to every other: `asleep[r]` is the word where rank r
  // counts its sleeping waiters (in the arena), `me` this rank.
  void arm(int me, std::vector<std::uint32_t*> asleep) noexcept;
  bool armed() const noexcept { return !asleep_.empty(); }

  // After raising a flag peers may wait on: wakes each peer asleep.
  void ring_sleepers() noexcept {
    std::atomic_thread_fence(std::memory_order_seq_cst);
    for (std::size_t r = 0; r < asleep_.size(); ++r) {
      if (static_cast<int>(r) == me_) continue;
      if (std::atomic_ref<std::uint32_t>(*asleep_[r]).load(std::memory_order_relaxed) != 0) {
        ring(static_cast<int>(r));
      }
    }
  }
  // Wakes this rank's own sleeper, if any, from any thread (a hint it waits on changed).
  // A ring nobody sleeps through is drained by the next sleep.
  void ring_self() noexcept;
  // Sleeps until a ring, or `longest`, unless `ready()` holds once this rank counts as
  // asleep. At most one wait sleeps on an arena's doorbell at a time (its operations run
  // one after another, each waiting for one thing at a time), so the sleeper may read
  // back the rings it slept through: no other waiter's ring is among them. Only on the
  // runtime thread (the eventfd's descriptor is on its reactor).
  template <class Ready>
  asio::awaitable<void> sleep_unless(Ready& ready, std::chrono::microseconds longest) {
    std::atomic_ref<std::uint32_t> asleep(*asleep_[static_cast<std::size_t>(me_)]);
    asleep.fetch_add(1, std::memory_order_seq_cst);
    // Orders the count before ready()'s loads, which may be relaxed (the computing hints'
    // and claim counters'): the raiser's side is ring_sleepers' fence.
    std::atomic_thread_fence(std::memory_order_seq_cst);
    const Awake awake{asleep};
    // Rings from before are spent: their flags are up, and ready() sees them. A ring from
    // now on leaves the eventfd readable, and the wait sees that.
    drain();
    if (!ready()) co_await wait_for_ring(longest);
  }

  // Operations waiting for their turn in the arena (issued after the one it serves) sleep
  // until the turn passes, or `longest`. Several may; all wake at each pass. The pass
  // happens on this thread too, so no ring is needed: the pass cancels their timers.
  asio::awaitable<void> wait_for_turn(std::chrono::microseconds longest);
  void turn_passed() noexcept;

 private:
  struct Awake {
    std::atomic_ref<std::uint32_t> asleep;
    ~Awake() { asleep.fetch_sub(1, std::memory_order_relaxed); }
  };
  // What lives on the runtime's reactor, made at the first sleep. The reactor takes no
  // locks (the runtime's io_context has one thread), so it is destroyed there too.
  struct OnReactor;
  void ring(int rank) noexcept;
  void drain() noexcept;
  OnReactor& on_reactor(const asio::any_io_executor& executor);
  asio::awaitable<void> wait_for_ring(std::chrono::microseconds longest);

  int own_ = -1;            // this rank's eventfd
  std::vector<int> bells_;  // a descriptor of each rank's eventfd (-1: none, or this rank)
  std::vector<std::uint32_t*> asleep_;
  int me_ = -1;
  std::unique_ptr<OnReactor> on_reactor_;
  std::vector<asio::steady_timer*> turn_sleepers_;  // in wait_for_turn, on the runtime thread
};

}  // namespace braid::collectives::detail
