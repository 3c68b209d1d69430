// braid::dp::CadenceBalancer, ranks as threads reporting the compute and window times of
// ranks of given speeds: the counts follow the speed ratio with the slowest rank at the
// anchor, equally fast ranks keep equal counts under noise, the anchor rises until the
// synchronisation's share of a window meets the target and falls back when it becomes
// cheap, and every rank computes the same counts.
#include <mutex>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include <braid/dp/cadence_balancer.hpp>

#include "../support/expect_error.hpp"
#include "../support/rank_threads.hpp"

namespace braid::dp {
namespace {

using collectives::Communicator;

using testing::expect_all_passed;

TEST(CadenceCounts, AreTheAnchorTimesTheSpeedRatio) {
  EXPECT_EQ(CadenceBalancer::counts_for({2, 1}, 2, {}, 0.05), (std::vector<int>{4, 2}));
  EXPECT_EQ(CadenceBalancer::counts_for({1, 3, 1.5}, 1, {}, 0.05), (std::vector<int>{1, 3, 2}));
}

TEST(CadenceCounts, KeepTheirValueWithinTheDeadBand) {
  // 1.9 x rounds to 2; the current 1 is 0.9 away, past 0.5 + 0.05 x 1.9: it moves.
  EXPECT_EQ(CadenceBalancer::counts_for({1.9, 1}, 1, {1, 1}, 0.05), (std::vector<int>{2, 1}));
  // 1.55 x rounds to 2, but the current 1 is 0.55 away, within 0.5 + 0.05 x 1.55: it stays.
  EXPECT_EQ(CadenceBalancer::counts_for({1.55, 1}, 1, {1, 1}, 0.05), (std::vector<int>{1, 1}));
}

// A rank's speed and the synchronisation's cost at a window: seconds per micro-batch, and
// the seconds the window waits past the slowest rank's compute.
struct Speeds {
  std::function<double(int rank, int window)> seconds_per_micro_batch;
  std::function<double(int window)> sync_seconds = [](int) { return 0.0; };
};

struct Window {
  std::vector<int> counts;
  int anchor = 0;
};

// Runs `windows` windows on `ranks` threads; every rank's view of every window, checked
// equal across ranks; rank 0's returned.
std::vector<Window> run_windows(int ranks, int windows, const Speeds& speeds,
                                CadenceOptions options = {}) {
  std::mutex mutex;
  std::vector<std::vector<Window>> seen(static_cast<std::size_t>(ranks));
  expect_all_passed(
      testing::run_blocking_ranks(ranks, [&](int rank, std::shared_ptr<Communicator> comm) {
        CadenceBalancer cadence(comm, 8, options);
        std::vector<Window> mine;
        for (int w = 0; w < windows; ++w) {
          // Every rank's compute this window; the window ends when the slowest rank's
          // compute and the synchronisation have.
          double longest = 0;
          for (int r = 0; r < ranks; ++r) {
            longest = std::max(longest, cadence.counts()[static_cast<std::size_t>(r)] *
                                            speeds.seconds_per_micro_batch(r, w));
          }
          const double compute = cadence.micro_batches() * speeds.seconds_per_micro_batch(rank, w);
          cadence.record_window(compute, longest + speeds.sync_seconds(w));
          mine.push_back({cadence.counts(), cadence.anchor()});
        }
        std::lock_guard lock(mutex);
        seen[static_cast<std::size_t>(rank)] = std::move(mine);
      }));
  for (int r = 1; r < ranks; ++r) {
    for (std::size_t w = 0; w < seen[0].size(); ++w) {
      EXPECT_EQ(seen[static_cast<std::size_t>(r)][w].counts, seen[0][w].counts)
          << "rank " << r << " window " << w;
      EXPECT_EQ(seen[static_cast<std::size_t>(r)][w].anchor, seen[0][w].anchor);
    }
  }
  return seen[0];
}

TEST(CadenceBalancer, CountsFollowTheSpeedRatioWithTheSlowestAtTheAnchor) {
  // Rank 2 is three times as fast as rank 0, rank 1 twice; synchronising is cheap.
  const auto windows = run_windows(3, 20, {.seconds_per_micro_batch = [](int rank, int) {
                                     return rank == 0 ? 6e-3 : rank == 1 ? 3e-3 : 2e-3;
                                   }});
  EXPECT_EQ(windows.front().counts, (std::vector<int>{1, 1, 1}));
  EXPECT_EQ(windows.back().counts, (std::vector<int>{1, 2, 3}));
  EXPECT_EQ(windows.back().anchor, 1);
}

TEST(CadenceBalancer, EquallyFastRanksKeepEqualCountsUnderNoise) {
  std::mt19937 generator(11);
  std::uniform_real_distribution<double> jitter(0.95, 1.05);
  std::vector<std::vector<double>> noise(2);
  for (auto& rank : noise) {
    for (int w = 0; w < 40; ++w) rank.push_back(1e-3 * jitter(generator));
  }
  const auto windows =
      run_windows(2, 40, {.seconds_per_micro_batch = [&](int rank, int w) {
                    return noise[static_cast<std::size_t>(rank)][static_cast<std::size_t>(w)];
                  }});
  for (const auto& w : windows) EXPECT_EQ(w.counts, (std::vector<int>{1, 1}));
}

TEST(CadenceBalancer, TheAnchorRisesUntilTheSynchronisationMeetsItsTarget) {
  // 1 ms per micro-batch on the slower rank, 3 ms to synchronise: at anchor 1 the
  // synchronisation is 75% of a window. A target of 25% needs 3 x 0.75 / 0.25 = 9
  // micro-batches; max_anchor 6 stops it at 6.
  CadenceOptions options;
  options.overhead_target = 0.25;
  options.max_anchor = 6;
  const Speeds slow_sync{
      .seconds_per_micro_batch = [](int rank, int) { return rank == 1 ? 1e-3 : 0.5e-3; },
      .sync_seconds = [](int) { return 3e-3; }};
  auto windows = run_windows(2, 16, slow_sync, options);
  EXPECT_EQ(windows.back().anchor, 6);
  EXPECT_EQ(windows.back().counts, (std::vector<int>{12, 6}));
  options.max_anchor = 12;
  windows = run_windows(2, 16, slow_sync, options);
  EXPECT_EQ(windows.back().anchor, 9);
  EXPECT_EQ(windows.back().counts, (std::vector<int>{18, 9}));
}

TEST(CadenceBalancer, TheAnchorFallsBackWhenSynchronisingBecomesCheap) {
  // The first 15 windows synchronise for 3 ms, then for 0.1 ms: the anchor climbs to 9,
  // then falls to the smallest that keeps 0.1 ms under 25% of a window, 1.
  CadenceOptions options;
  options.overhead_target = 0.25;
  options.max_anchor = 12;
  const auto windows = run_windows(2, 60,
                                   {.seconds_per_micro_batch = [](int, int) { return 1e-3; },
                                    .sync_seconds = [](int w) { return w < 15 ? 3e-3 : 0.1e-3; }},
                                   options);
  EXPECT_EQ(windows[14].anchor, 9);
  EXPECT_EQ(windows.back().anchor, 1);
  EXPECT_EQ(windows.back().counts, (std::vector<int>{1, 1}));
}

TEST(CadenceOptions, ComeFromTheKnobsOrTheirDefaults) {
  const auto defaults = CadenceOptions::from_environment(
      [](std::string_view) -> std::optional<std::string> { return std::nullopt; });
  EXPECT_EQ(defaults.anchor, 1);
  EXPECT_EQ(defaults.max_anchor, 8);
  EXPECT_DOUBLE_EQ(defaults.overhead_target, 0.1);
  EXPECT_EQ(defaults.measure.interval, 10);
  const auto set =
      CadenceOptions::from_environment([](std::string_view name) -> std::optional<std::string> {
        if (name == "BRAID_BALANCE_MAX_ANCHOR") return "16";
        if (name == "BRAID_BALANCE_OVERHEAD_TARGET") return "0.05";
        return std::nullopt;
      });
  EXPECT_EQ(set.max_anchor, 16);
  EXPECT_DOUBLE_EQ(set.overhead_target, 0.05);
}

TEST(CadenceBalancer, RefusesOptionsOutsideTheirRanges) {
  expect_all_passed(testing::run_blocking_ranks(2, [](int, std::shared_ptr<Communicator> comm) {
    CadenceOptions options;
    options.max_anchor = 0;
    testing::expect_invalid_argument([&] { CadenceBalancer(comm, 8, options); },
                                     "max_anchor 0 at least the anchor");
    testing::expect_invalid_argument([&] { CadenceBalancer(comm, 0); }, "micro_batch 0");
  }));
}

}  // namespace
}  // namespace braid::dp
