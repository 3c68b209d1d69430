// The trace's time base: steady-clock nanoseconds (now_ns()), read from the CPU's
// time-stamp counter where that is safe.
//
// Why. A span takes two timestamps. steady_clock::now() is a vDSO clock_gettime: 36-44 ns
// on the dev VM, ~50 on the GPU machine's cores, two thirds of a span's cost. rdtsc alone
// is 20 ns on the dev VM and a few ns on bare metal; scaling ticks to nanoseconds adds a
// multiply under the sequence lock below (~6 ns here), which recording sites skip: they
// store the raw counter (detail::now_stamp()) and snapshot() converts it with the anchors
// kept in the clock's history (detail::stamps_to_ns()).
//
// How. The clock extrapolates from an anchor (ticks, ns) at a rate (ns per tick, 32.32
// fixed point), all published under a sequence lock so that readers never block. Once
// the counter passes the next re-anchoring point, one reader takes a fresh (ticks,
// steady ns) pair, makes the current extrapolation the new anchor (continuous: no jump)
// and sets the rate so that the extrapolation meets steady_clock at the next point: the
// clock follows steady_clock (NTP slewing included) the way the kernel's own clock
// follows its hardware, with an error bounded by one interval's drift. Intervals grow
// from 16 ms to 1 s; the first rate comes from a 1 ms calibration when the clock is first
// read. It never runs backwards: an extrapolation ahead of steady_clock slows (or stands
// still) rather than stepping back; one more than 100 us behind (a suspended VM) jumps
// forward to it. Either large offset starts the intervals again from 16 ms.
//
// When. x86-64 with an invariant counter (constant_tsc and nonstop_tsc in /proc/cpuinfo:
// the same rate on every core and in every power state) that the kernel itself keeps
// time with (clocksource tsc: it checked that the cores' counters agree), unless
// BRAID_TRACE_CLOCK=steady; BRAID_TRACE_CLOCK=tsc skips the checks. Elsewhere now_ns()
// is steady_clock::now().
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <fstream>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>

#include <braid/core/config.hpp>
#include <braid/core/error.hpp>
#include <braid/trace/recorder.hpp>

#if defined(__x86_64__)
#include <x86intrin.h>
#endif

namespace braid::trace {
namespace {

std::int64_t steady_ns() noexcept {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

#if defined(__x86_64__)

// 64 x 64 -> 128-bit products for the fixed-point scaling (GCC and Clang on x86-64).
__extension__ typedef unsigned __int128 Wide;

bool invariant_counter() {
  bool flags = false;
  std::ifstream cpuinfo("/proc/cpuinfo");
  for (std::string line; std::getline(cpuinfo, line);) {
    if (line.rfind("flags", 0) != 0) continue;
    line += ' ';
    flags = line.find(" constant_tsc ") != std::string::npos &&
            line.find(" nonstop_tsc ") != std::string::npos;
    break;
  }
  std::ifstream clocksource("/sys/devices/system/clocksource/clocksource0/current_clocksource");
  std::string source;
  std::getline(clocksource, source);
  return flags && source == "tsc";
}

// One stretch of the counter clock: from `ticks` on, ns = ns + (t - ticks) * rate >> 32.
struct Segment {
  std::uint64_t ticks;
  std::int64_t ns;
  std::uint64_t rate;
};

class CounterClock {
 public:
  CounterClock() {
    // The first rate: ticks against steady_clock over 1 ms.
    const Pair first = pair();
    Pair second = pair();
    while (second.ns - first.ns < 1'000'000) second = pair();
    publish(second.ticks, second.ns, rate_of(first, second),
            second.ticks + ticks_for(kFirstInterval, first, second));
    last_ = second;
    interval_ns_ = kFirstInterval;
  }

  // The counter itself, for records to convert later (to_ns): a read and a compare, where
  // now() also reads the anchor under its sequence lock and scales. Past the next
  // anchoring point it re-anchors, as now() does, so the clock keeps following
  // steady_clock whichever of the two the process reads.
  std::uint64_t stamp() noexcept {
    const std::uint64_t ticks = __rdtsc();
    if (static_cast<std::int64_t>(ticks - next_anchor_.load(std::memory_order_relaxed)) >= 0)
        [[unlikely]]
      reanchor();
    return ticks;
  }

  // Every anchor published so far, oldest first: how to_ns() turns a stamp into what now()
  // read at that moment.
  std::vector<Segment> segments() {
    std::lock_guard lock(mutex_);
    return history_;
  }

  static std::int64_t to_ns(std::uint64_t ticks, const std::vector<Segment>& history) noexcept {
    // The last anchor at or before the stamp (the first one for a stamp older than all).
    auto after = std::upper_bound(history.begin(), history.end(), ticks,
                                  [](std::uint64_t t, const Segment& segment) {
                                    return static_cast<std::int64_t>(t - segment.ticks) < 0;
                                  });
    const Segment& segment = after == history.begin() ? history.front() : *(after - 1);
    return segment.ns + scale(ticks - segment.ticks, segment.rate);
  }

  std::int64_t now() noexcept {
    for (;;) {
      const std::uint64_t sequence = sequence_.load(std::memory_order_acquire);
      const std::uint64_t ticks = __rdtsc();
      const std::uint64_t anchor_ticks = anchor_ticks_.load(std::memory_order_relaxed);
      const std::int64_t anchor_ns = anchor_ns_.load(std::memory_order_relaxed);
      const std::uint64_t rate = rate_.load(std::memory_order_relaxed);
      const std::uint64_t next = next_anchor_.load(std::memory_order_relaxed);
      std::atomic_thread_fence(std::memory_order_acquire);
      if ((sequence & 1) != 0 || sequence_.load(std::memory_order_relaxed) != sequence) continue;
      // Past the next anchoring point one reader re-anchors; the others (and that one, if
      // it finds the work done) extrapolate from the anchor they read, which is still
      // good: nobody waits on the re-anchoring reader, even one that was preempted or is
      // the copy of a thread that held the lock when its process forked.
      if (static_cast<std::int64_t>(ticks - next) >= 0 && reanchor()) [[unlikely]]
        continue;
      return anchor_ns + scale(ticks - anchor_ticks, rate);
    }
  }

 private:
  struct Pair {
    std::uint64_t ticks;
    std::int64_t ns;
  };
  static constexpr std::int64_t kFirstInterval = 16'000'000;
  static constexpr std::int64_t kLongestInterval = 1'000'000'000;
  static constexpr std::int64_t kResetBeyond = 100'000;

  // A (ticks, steady ns) pair: the tightest of three brackets, its midpoint.
  static Pair pair() noexcept {
    Pair best{0, 0};
    std::uint64_t tightest = ~std::uint64_t{0};
    for (int i = 0; i < 3; ++i) {
      const std::uint64_t before = __rdtsc();
      const std::int64_t ns = steady_ns();
      const std::uint64_t after = __rdtsc();
      if (after - before < tightest) {
        tightest = after - before;
        best = {before + (after - before) / 2, ns};
      }
    }
    return best;
  }

  // ns per tick, 32.32 fixed point.
  static std::uint64_t rate_of(Pair from, Pair to) noexcept {
    const auto ticks = std::max<std::uint64_t>(to.ticks - from.ticks, 1);
    const auto ns = static_cast<Wide>(std::max<std::int64_t>(to.ns - from.ns, 1));
    return static_cast<std::uint64_t>((ns << 32) / ticks);
  }
  static std::uint64_t ticks_for(std::int64_t ns, Pair from, Pair to) noexcept {
    const auto ticks = static_cast<Wide>(to.ticks - from.ticks);
    return static_cast<std::uint64_t>(
        ticks * static_cast<std::uint64_t>(ns) /
        static_cast<std::uint64_t>(std::max<std::int64_t>(to.ns - from.ns, 1)));
  }
  // Signed ticks (a reader may hold ticks from before the anchor) times the rate.
  static std::int64_t scale(std::uint64_t delta, std::uint64_t rate) noexcept {
    const auto signed_delta = static_cast<std::int64_t>(delta);
    const auto magnitude =
        static_cast<std::uint64_t>(signed_delta < 0 ? -signed_delta : signed_delta);
    const auto ns = static_cast<std::int64_t>((static_cast<Wide>(magnitude) * rate) >> 32);
    return signed_delta < 0 ? -ns : ns;
  }

  // Called with mutex_ held, or from the constructor.
  void publish(std::uint64_t anchor_ticks, std::int64_t anchor_ns, std::uint64_t rate,
               std::uint64_t next) noexcept {
    try {
      history_.push_back({anchor_ticks, anchor_ns, rate});
    } catch (...) {
      // Out of memory: stamps after this anchor convert by the previous one's rate, which
      // is off by that interval's drift (ppm), not wrong.
    }
    const std::uint64_t sequence = sequence_.load(std::memory_order_relaxed);
    sequence_.store(sequence + 1, std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_release);
    anchor_ticks_.store(anchor_ticks, std::memory_order_relaxed);
    anchor_ns_.store(anchor_ns, std::memory_order_relaxed);
    rate_.store(rate, std::memory_order_relaxed);
    next_anchor_.store(next, std::memory_order_relaxed);
    sequence_.store(sequence + 2, std::memory_order_release);
  }

  // One reader re-anchors; returns whether it published a new anchor.
  bool reanchor() noexcept {
    std::unique_lock lock(mutex_, std::try_to_lock);
    if (!lock.owns_lock()) return false;
    const Pair now = pair();
    if (static_cast<std::int64_t>(now.ticks - next_anchor_.load(std::memory_order_relaxed)) < 0) {
      return false;  // another reader just did it
    }
    // The true rate over the last interval, and where the extrapolation stands now.
    const std::uint64_t true_rate = rate_of(last_, now);
    const std::int64_t current = anchor_ns_.load(std::memory_order_relaxed) +
                                 scale(now.ticks - anchor_ticks_.load(std::memory_order_relaxed),
                                       rate_.load(std::memory_order_relaxed));
    const std::int64_t off = current - now.ns;
    if (off < -kResetBeyond) {
      // Far behind (a suspended VM): jump forward to steady_clock, which keeps it monotonic,
      // and measure again soon.
      interval_ns_ = kFirstInterval;
      publish(now.ticks, now.ns, true_rate, now.ticks + ticks_for(interval_ns_, last_, now));
    } else {
      // Meet steady_clock at the next anchor: cover interval_ns_ - off in interval_ticks.
      // Never backwards: a clock that is ahead (steady_clock slewed slower by NTP) slows,
      // or stands still for an interval, instead of stepping back.
      interval_ns_ =
          off > kResetBeyond ? kFirstInterval : std::min(interval_ns_ * 2, kLongestInterval);
      const std::uint64_t interval_ticks = ticks_for(interval_ns_, last_, now);
      const auto ns = static_cast<Wide>(std::max<std::int64_t>(interval_ns_ - off, 0));
      const auto rate =
          static_cast<std::uint64_t>((ns << 32) / std::max<std::uint64_t>(interval_ticks, 1));
      publish(now.ticks, current, rate, now.ticks + interval_ticks);
    }
    last_ = now;
    return true;
  }

  std::atomic<std::uint64_t> sequence_{0};
  std::atomic<std::uint64_t> anchor_ticks_{0};
  std::atomic<std::int64_t> anchor_ns_{0};
  std::atomic<std::uint64_t> rate_{0};
  std::atomic<std::uint64_t> next_anchor_{0};
  std::mutex mutex_;  // one re-anchoring reader at a time; guards last_, interval_ns_, history_
  Pair last_{0, 0};
  std::int64_t interval_ns_ = kFirstInterval;
  // One entry per anchor: intervals grow to 1 s, so ~3600 entries (~90 KiB) an hour.
  std::vector<Segment> history_;
};

#endif

struct ClockChoice {
  ClockSource source = ClockSource::steady;
  std::optional<Error> error;  // a malformed BRAID_TRACE_CLOCK, reported by clock_source()
};

ClockChoice choose() {
  ClockChoice choice;
  std::string wanted;
  try {
    wanted = config::string_value("BRAID_TRACE_CLOCK");
  } catch (const Error& e) {
    choice.error = e;
    return choice;
  }
  if (wanted != "auto" && wanted != "tsc" && wanted != "steady") {
    choice.error = Error(Errc::invalid_environment,
                         fmt::format("BRAID_TRACE_CLOCK='{}' is not auto, tsc or steady", wanted));
    return choice;
  }
#if defined(__x86_64__)
  if (wanted == "tsc" || (wanted == "auto" && invariant_counter()))
    choice.source = ClockSource::tsc;
#endif
  return choice;
}

const ClockChoice& choice() {
  static const ClockChoice chosen = choose();
  return chosen;
}

}  // namespace

ClockSource clock_source() {
  const ClockChoice& chosen = choice();
  if (chosen.error) throw *chosen.error;
  return chosen.source;
}

namespace {

#if defined(__x86_64__)
CounterClock* counter_clock() noexcept {
  static CounterClock* const counter =
      choice().source == ClockSource::tsc ? new CounterClock() : nullptr;  // never destroyed:
  // spans may be recorded from other threads during static destruction
  return counter;
}
#endif

}  // namespace

std::int64_t now_ns() noexcept {
#if defined(__x86_64__)
  if (CounterClock* counter = counter_clock()) return counter->now();
#endif
  return steady_ns();
}

namespace detail {

std::int64_t now_stamp() noexcept {
#if defined(__x86_64__)
  if (CounterClock* counter = counter_clock()) return static_cast<std::int64_t>(counter->stamp());
#endif
  return steady_ns();
}

void stamps_to_ns(std::vector<Record>& records) {
#if defined(__x86_64__)
  if (CounterClock* counter = counter_clock()) {
    const std::vector<Segment> history = counter->segments();
    for (Record& record : records) {
      if (record.ns) continue;
      record.begin_ns = CounterClock::to_ns(static_cast<std::uint64_t>(record.begin_ns), history);
      record.end_ns = CounterClock::to_ns(static_cast<std::uint64_t>(record.end_ns), history);
      record.ns = true;
    }
    return;
  }
#endif
  for (Record& record : records) record.ns = true;  // steady-clock stamps are ns already
}

}  // namespace detail

}  // namespace braid::trace
