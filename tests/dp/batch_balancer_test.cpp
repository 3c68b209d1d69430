// braid::dp::BatchBalancer, ranks as threads with compute times they report: shares converge
// to the ranks' speed ratio, stay equal for equally fast ranks under noise, come back after
// a one-step stall, always add up to the global batch above the floor, and are the same on
// every rank.
#include <cmath>
#include <mutex>
#include <numeric>
#include <optional>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include <braid/dp/batch_balancer.hpp>

#include "../support/expect_error.hpp"
#include "../support/rank_threads.hpp"

namespace braid::dp {
namespace {

using collectives::Communicator;

using testing::expect_all_passed;

TEST(BatchSizes, AreProportionalWholeAndAddUpToTheTotal) {
  EXPECT_EQ(BatchBalancer::sizes_for({2, 1}, 30, 0.1), (std::vector<std::int64_t>{20, 10}));
  EXPECT_EQ(BatchBalancer::sizes_for({1, 1, 1}, 31, 0.1), (std::vector<std::int64_t>{11, 10, 10}));
  EXPECT_EQ(BatchBalancer::sizes_for({1, 1, 1, 1}, 4, 0.5),
            (std::vector<std::int64_t>{1, 1, 1, 1}));
}

TEST(BatchSizes, NeverGoBelowTheFloor) {
  // 100:1 would give the slow rank 1 of 101; the floor (0.5 x the equal 50.5) lifts it.
  const auto sizes = BatchBalancer::sizes_for({100, 1}, 101, 0.5);
  EXPECT_EQ(std::accumulate(sizes.begin(), sizes.end(), std::int64_t{0}), 101);
  EXPECT_GE(sizes[1], 25);
  EXPECT_EQ(sizes, (std::vector<std::int64_t>{76, 25}));
}

// Every rank's sizes after each step, checked equal across ranks at the end.
struct Run {
  std::mutex mutex;
  std::vector<std::vector<std::vector<std::int64_t>>> sizes;  // [rank][step]
};

// `seconds_per_sample(rank, step)`: the rank's compute time per sample at that step.
template <class Speed>
std::vector<std::vector<std::int64_t>> balance(int ranks, int steps, std::int64_t global,
                                               Speed&& seconds_per_sample,
                                               BatchBalancerOptions options = {}) {
  Run run;
  run.sizes.resize(static_cast<std::size_t>(ranks));
  expect_all_passed(
      testing::run_blocking_ranks(ranks, [&](int rank, std::shared_ptr<Communicator> comm) {
        BatchBalancer balancer(comm, global, options);
        std::vector<std::vector<std::int64_t>> mine;
        for (int step = 0; step < steps; ++step) {
          balancer.record_step(static_cast<double>(balancer.batch_size()) *
                               seconds_per_sample(rank, step));
          const auto& sizes = balancer.batch_sizes();
          EXPECT_EQ(std::accumulate(sizes.begin(), sizes.end(), std::int64_t{0}), global);
          mine.push_back(sizes);
        }
        std::lock_guard lock(run.mutex);
        run.sizes[static_cast<std::size_t>(rank)] = std::move(mine);
      }));
  for (int r = 1; r < ranks; ++r) {
    EXPECT_EQ(run.sizes[static_cast<std::size_t>(r)], run.sizes[0]) << "rank " << r << " differs";
  }
  return run.sizes[0];
}

TEST(BatchBalancer, SharesConvergeToTheSpeedRatio) {
  // Rank 1 takes twice as long per sample: after calibration it gets a third of the batch.
  const auto sizes = balance(2, 20, 30, [](int rank, int) { return rank == 1 ? 2e-3 : 1e-3; });
  EXPECT_EQ(sizes.front(), (std::vector<std::int64_t>{15, 15}));
  EXPECT_EQ(sizes.back(), (std::vector<std::int64_t>{20, 10}));
}

TEST(BatchBalancer, EquallyFastRanksKeepEqualSharesUnderNoise) {
  std::vector<std::vector<double>> noise(3);
  std::mt19937 generator(7);
  std::uniform_real_distribution<double> jitter(0.97, 1.03);
  for (auto& rank : noise) {
    for (int step = 0; step < 40; ++step) rank.push_back(1e-3 * jitter(generator));
  }
  const auto sizes = balance(3, 40, 60, [&](int rank, int step) {
    return noise[static_cast<std::size_t>(rank)][static_cast<std::size_t>(step)];
  });
  for (const auto& step : sizes) EXPECT_EQ(step, (std::vector<std::int64_t>{20, 20, 20}));
}

TEST(BatchBalancer, ARankThatStallsOnceGetsItsShareBack) {
  // Rank 0 stalls (20x slower) at step 4, just before the first rebalance, then runs as fast
  // as the others again.
  const auto sizes =
      balance(2, 40, 40, [](int rank, int step) { return rank == 0 && step == 4 ? 20e-3 : 1e-3; });
  EXPECT_NE(sizes[5], (std::vector<std::int64_t>{20, 20})) << "the stall moved the shares";
  EXPECT_EQ(sizes.back(), (std::vector<std::int64_t>{20, 20}));
}

TEST(BatchBalancerOptions, ComeFromTheKnobsOrTheirDefaults) {
  const auto defaults = BatchBalancerOptions::from_environment(
      [](std::string_view) -> std::optional<std::string> { return std::nullopt; });
  EXPECT_EQ(defaults.calibration_steps, 5);
  EXPECT_EQ(defaults.interval, 10);
  EXPECT_DOUBLE_EQ(defaults.smoothing, 0.3);
  const auto set = BatchBalancerOptions::from_environment(
      [](std::string_view name) -> std::optional<std::string> {
        if (name == "BRAID_BALANCE_INTERVAL") return "4";
        if (name == "BRAID_BALANCE_FLOOR") return "0.25";
        return std::nullopt;
      });
  EXPECT_EQ(set.interval, 4);
  EXPECT_DOUBLE_EQ(set.floor, 0.25);
  try {
    BatchBalancerOptions::from_environment([](std::string_view name) -> std::optional<std::string> {
      if (name == "BRAID_BALANCE_SMOOTHING") return "lots";
      return std::nullopt;
    });
    ADD_FAILURE() << "a malformed knob was taken";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::invalid_environment);
    EXPECT_NE(std::string(e.what()).find("BRAID_BALANCE_SMOOTHING"), std::string::npos);
  }
}

TEST(BatchBalancer, RefusesAGlobalBatchSmallerThanTheRanks) {
  expect_all_passed(testing::run_blocking_ranks(2, [](int, std::shared_ptr<Communicator> comm) {
    testing::expect_invalid_argument([&] { BatchBalancer(comm, 1); },
                                     "global batch 1 is smaller than the 2 ranks");
  }));
}

}  // namespace
}  // namespace braid::dp
