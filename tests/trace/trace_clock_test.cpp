// The trace clock (now_ns()): steady-clock nanoseconds, read from the time-stamp counter
// where it is invariant. Whatever it reads, it must follow steady_clock through its
// re-anchoring points and never run backwards on a thread.
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <braid/core/error.hpp>
#include <braid/trace/recorder.hpp>
#include <braid/trace/span.hpp>

namespace braid::trace {
namespace {

std::int64_t steady_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

TEST(TraceClock, FollowsSteadyClockAcrossItsReanchoringPoints) {
  // 300 ms crosses the 16, 32, 64 and 128 ms re-anchoring points of the counter clock.
  std::int64_t worst = 0;
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(300);
  while (std::chrono::steady_clock::now() < until) {
    // Bracket the trace clock between two steady readings: its error is how far it falls
    // outside the bracket.
    const std::int64_t before = steady_ns();
    const std::int64_t traced = now_ns();
    const std::int64_t after = steady_ns();
    worst = std::max({worst, before - traced, traced - after});
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  // The counter clock resets itself beyond 100 us; on a quiet machine it stays within a
  // few us. The margin is for a preempted reading on a busy 2-core CI machine.
  EXPECT_LT(worst, 300'000) << "source " << (clock_source() == ClockSource::tsc ? "tsc" : "steady");
}

// Recording sites stamp with the raw counter and snapshot() converts: a span reads, in a
// snapshot, as now_ns() would have read at its ends, through the clock's re-anchoring
// points (300 ms crosses four) as between them.
TEST(TraceClock, SpansStampedWithTheCounterReadInASnapshotAsNowNsDid) {
  struct Bracket {
    std::int64_t before;
    std::int64_t after;
  };
  std::vector<Bracket> brackets;
  clear();
  set_enabled(true);
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(300);
  while (std::chrono::steady_clock::now() < until) {
    const std::int64_t before = now_ns();
    { Span span(Category::user, "bracketed", {}, brackets.size()); }
    brackets.push_back({before, now_ns()});
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  set_enabled(false);
  const Snapshot snap = snapshot();
  std::size_t checked = 0;
  for (const Record& record : snap.records) {
    if (std::string_view(record.name) != "bracketed") continue;
    ASSERT_LT(record.bytes, brackets.size());
    const Bracket& bracket = brackets[record.bytes];
    // Within a few ns: where an anchor falls between a stamp and the anchor now_ns() used,
    // the two stretches agree at the anchor and part by the rates' difference (ppm).
    EXPECT_GE(record.begin_ns, bracket.before - 100) << "span " << record.bytes;
    EXPECT_LE(record.begin_ns, record.end_ns) << "span " << record.bytes;
    EXPECT_LE(record.end_ns, bracket.after + 100) << "span " << record.bytes;
    EXPECT_TRUE(record.ns);
    ++checked;
  }
  EXPECT_EQ(checked, brackets.size());
  clear();
}

TEST(TraceClock, NeverRunsBackwardsOnAThreadWhileOthersReadIt) {
  constexpr int kThreads = 4;
  std::vector<std::thread> threads;
  std::vector<std::int64_t> backwards(kThreads, 0);
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&backwards, t] {
      std::int64_t last = now_ns();
      const std::int64_t end = last + 100'000'000;  // 100 ms: past two re-anchoring points
      while (last < end) {
        const std::int64_t now = now_ns();
        if (now < last) ++backwards[static_cast<std::size_t>(t)];
        last = now;
      }
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(backwards, std::vector<std::int64_t>(kThreads, 0));
}

TEST(TraceClock, TheSourceIsTheCounterOnlyWhereItIsInvariantAndTheKernelKeepsTimeWithIt) {
  const ClockSource source = clock_source();
#if defined(__x86_64__)
  // What the kernel says of this CPU and its clock decides it (BRAID_TRACE_CLOCK is unset
  // in the suite).
  bool invariant = false;
  std::ifstream cpuinfo("/proc/cpuinfo");
  for (std::string line; std::getline(cpuinfo, line);) {
    if (line.rfind("flags", 0) != 0) continue;
    invariant = line.find(" constant_tsc") != std::string::npos &&
                line.find(" nonstop_tsc") != std::string::npos;
    break;
  }
  std::ifstream clocksource("/sys/devices/system/clocksource/clocksource0/current_clocksource");
  std::string kernel_clock;
  std::getline(clocksource, kernel_clock);
  EXPECT_EQ(source, invariant && kernel_clock == "tsc" ? ClockSource::tsc : ClockSource::steady);
#else
  EXPECT_EQ(source, ClockSource::steady);
#endif
}

// The choice is made once per process, so each value is tried in a fresh one.
TEST(TraceClockDeathTest, AMalformedChoiceIsAnErrorNamingTheVariable) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        setenv("BRAID_TRACE_CLOCK", "rdtsc", 1);
        try {
          (void)clock_source();
        } catch (const Error& e) {
          const bool named =
              std::string(e.what()).find("BRAID_TRACE_CLOCK='rdtsc' is not auto, tsc or steady") !=
              std::string::npos;
          // now_ns() still works, on steady_clock.
          std::exit(named && e.code() == make_error_code(Errc::invalid_environment) && now_ns() > 0
                        ? 3
                        : 4);
        }
        std::exit(5);
      },
      ::testing::ExitedWithCode(3), "");
  EXPECT_EXIT(
      {
        setenv("BRAID_TRACE_CLOCK", "steady", 1);
        std::exit(clock_source() == ClockSource::steady ? 3 : 4);
      },
      ::testing::ExitedWithCode(3), "");
}

}  // namespace
}  // namespace braid::trace
