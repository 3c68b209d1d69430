// braid::torch::PipelineExecutor, ranks as threads: every schedule (GPipe, 1F1B,
// interleaved 1F1B, ZB-H1) computes the losses and the gradients one process computes over
// the whole model and every microbatch; a compute that waits too long for a transfer fails
// naming the rank, stage, microbatch, action and the rank it waits for; ranks given
// different schedules fail together before anything runs; stages that are not this rank's
// are refused.
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <braid/core/error.hpp>
#include <braid/parallel/pipeline_schedule.hpp>
#include <braid/torch/pipeline/pipeline_executor.hpp>
#include <braid/transport/world.hpp>

#include "../support/expect_error.hpp"
#include "../support/scoped_env.hpp"
#include "tp_support.hpp"

namespace pipeline_executor_test {
namespace {

using braid::collectives::Communicator;
using braid::testing::expect_close;
using braid::testing::run_tp_ranks;
using braid::testing::seeded;
using ::torch::Tensor;

constexpr int kRanks = 2, kMicrobatches = 4;
constexpr std::int64_t kWidth = 6, kRows = 3;

// Stage s: tanh(x W_s^T + b_s); the first stage's input is microbatch mb's data, the last
// returns the microbatch's loss, its share of the mean.
struct Stage {
  Stage(int index, int stages) : index(index), stages(stages) {
    linear = ::torch::nn::Linear(kWidth, kWidth);
    ::torch::NoGradGuard no_grad;
    linear->weight.copy_(seeded({kWidth, kWidth}, 100 + index) * 0.5);
    linear->bias.copy_(seeded({kWidth}, 200 + index) * 0.1);
  }
  Tensor forward(const Tensor& input, int mb) const {
    const Tensor x = index == 0 ? seeded({kRows, kWidth}, 300 + mb) : input;
    const Tensor y =
        ::torch::tanh(::torch::nn::functional::linear(x, linear->weight, linear->bias));
    if (index < stages - 1) return y;
    return (y * seeded({kRows, kWidth}, 400 + mb)).sum() / kMicrobatches;
  }
  int index, stages;
  ::torch::nn::Linear linear{nullptr};
};

struct Case {
  const char* schedule;
  int virtual_stages;
};

class EverySchedule : public ::testing::TestWithParam<Case> {};

TEST_P(EverySchedule, ComputesTheLossesAndGradientsOfOneProcess) {
  const Case c = GetParam();
  const auto schedule = braid::parallel::lower(
      braid::parallel::make_schedule(c.schedule, kRanks, kMicrobatches, c.virtual_stages));
  const int stages = schedule.stages;
  // One process: every stage in a row, every microbatch.
  std::vector<Stage> whole;
  for (int s = 0; s < stages; ++s) whole.emplace_back(s, stages);
  std::vector<double> expected_losses;
  for (int mb = 0; mb < kMicrobatches; ++mb) {
    Tensor h;
    for (const Stage& stage : whole) h = stage.forward(h, mb);
    expected_losses.push_back(h.item<double>());
    h.backward();
  }
  run_tp_ranks(kRanks, [&](int rank, std::shared_ptr<Communicator> comm) {
    std::vector<Stage> mine;
    std::vector<braid::torch::PipelineStage> stage_functions;
    for (const int s : schedule.stages_of(rank)) mine.emplace_back(s, stages);
    for (const Stage& stage : mine) {
      stage_functions.push_back(
          {.stage = stage.index,
           .forward = [&stage](const Tensor& input, int mb) { return stage.forward(input, mb); },
           .parameters = stage.linear->parameters()});
    }
    braid::torch::PipelineExecutor pipeline(comm, schedule, std::move(stage_functions),
                                            {.activation_shape = {kRows, kWidth}});
    const std::vector<double> losses = pipeline.run();
    if (schedule.stage_rank[static_cast<std::size_t>(stages - 1)] == rank) {
      ASSERT_EQ(losses.size(), static_cast<std::size_t>(kMicrobatches));
      for (int mb = 0; mb < kMicrobatches; ++mb) {
        EXPECT_NEAR(losses[static_cast<std::size_t>(mb)],
                    expected_losses[static_cast<std::size_t>(mb)], 1e-5);
      }
    } else {
      EXPECT_TRUE(losses.empty());
    }
    for (const Stage& stage : mine) {
      const Stage& one = whole[static_cast<std::size_t>(stage.index)];
      expect_close(stage.linear->weight.grad(), one.linear->weight.grad(),
                   fmt::format("{} stage {} weight gradient", c.schedule, stage.index));
      expect_close(stage.linear->bias.grad(), one.linear->bias.grad(),
                   fmt::format("{} stage {} bias gradient", c.schedule, stage.index));
    }
  });
}

INSTANTIATE_TEST_SUITE_P(Schedules, EverySchedule,
                         ::testing::Values(Case{"gpipe", 1}, Case{"1f1b", 1},
                                           Case{"interleaved", 2}, Case{"zb", 1}),
                         [](const auto& info) {
                           return std::string(info.param.schedule == std::string("1f1b")
                                                  ? "one_f_one_b"
                                                  : info.param.schedule);
                         });

// What each rank's run() failed with when rank `slow` spends `stall` in its forward of
// microbatch 0, under 1F1B over `ranks` ranks and 2 microbatches, with a 0.5 s timeout.
struct Failure {
  std::error_code code;
  std::string what;
};
std::vector<Failure> run_with_a_slow_stage(int ranks, int slow, std::chrono::seconds stall) {
  const auto schedule = braid::parallel::lower(braid::parallel::one_f_one_b(ranks, 2));
  std::vector<Failure> failures(static_cast<std::size_t>(ranks));
  run_tp_ranks(ranks, [&](int rank, std::shared_ptr<Communicator> comm) {
    Stage stage(rank, ranks);
    braid::torch::PipelineExecutor pipeline(
        comm, schedule,
        {{.stage = rank,
          .forward =
              [&](const Tensor& input, int mb) {
                if (rank == slow && mb == 0) std::this_thread::sleep_for(stall);
                return stage.forward(input, mb);
              },
          .parameters = stage.linear->parameters()}},
        {.activation_shape = {kRows, kWidth}, .timeout = std::chrono::milliseconds(500)});
    try {
      pipeline.run();
    } catch (const braid::Error& e) {
      failures[static_cast<std::size_t>(rank)] = {e.code(), e.what()};
    }
  });
  return failures;
}

TEST(PipelineExecutor, AComputeThatWaitsTooLongNamesWhatItWaitsFor) {
  // The first stage is slow to produce microbatch 0.
  const auto failures = run_with_a_slow_stage(kRanks, 0, std::chrono::seconds(2));
  for (const Failure& f : failures) EXPECT_EQ(f.code, braid::Errc::timeout) << f.what;
  EXPECT_THAT(failures[1].what,
              ::testing::HasSubstr("pipeline rank 1 stage 1 microbatch 0: 1F0 waited 0.5 s for the "
                                   "activation from world rank 0"));
  EXPECT_THAT(failures[0].what, ::testing::HasSubstr("stage 0 microbatch 0: 0B0 waited"));
}

// Rank 1 of three is stuck computing its first forward: rank 2 waits for its activation,
// rank 0 for its gradient. With BRAID_DEBUG=detail the first to time out prints both on the
// schedule's grid and names rank 1 as not waiting on a transfer.
TEST(PipelineExecutor, UnderDebugDetailAHangIsDrawnOnTheGrid) {
  const braid::testing::ScopedEnv detail("BRAID_DEBUG", "detail");
  const auto failures = run_with_a_slow_stage(3, 1, std::chrono::seconds(4));
  // Whichever of ranks 0 and 2 timed out first drew the grid.
  const std::string& drawn = failures[0].what.find("where each rank") != std::string::npos
                                 ? failures[0].what
                                 : failures[2].what;
  EXPECT_THAT(drawn, ::testing::HasSubstr("not waiting on a transfer (computing, or stuck outside "
                                          "the pipeline): pipeline rank 1"));
  EXPECT_THAT(drawn, ::testing::HasSubstr(">0B0<"));
  EXPECT_THAT(drawn, ::testing::HasSubstr(">2F0<"));
}

TEST(PipelineExecutor, RanksGivenDifferentSchedulesFailTogetherNamingBoth) {
  run_tp_ranks(kRanks, [&](int rank, std::shared_ptr<Communicator> comm) {
    // Rank 1 was told another microbatch count.
    const auto schedule =
        braid::parallel::lower(braid::parallel::one_f_one_b(kRanks, 4 - 2 * rank));
    Stage stage(rank, kRanks);
    braid::testing::expect_invalid_argument(
        [&] {
          braid::torch::PipelineExecutor(
              comm, schedule,
              {{.stage = rank,
                .forward = [&](const Tensor& input, int mb) { return stage.forward(input, mb); }}},
              {.activation_shape = {kRows, kWidth}});
        },
        "the pipeline's ranks run different schedules: rank 1 (world rank 1) has 1F1B over 2 "
        "ranks, 2 stages, 2 microbatches");
  });
}

TEST(PipelineExecutor, RefusesStagesTheScheduleDoesNotPlaceOnThisRank) {
  const auto schedule = braid::parallel::lower(braid::parallel::gpipe(kRanks, 2));
  run_tp_ranks(kRanks, [&](int rank, std::shared_ptr<Communicator> comm) {
    Stage stage(1 - rank, kRanks);
    braid::testing::expect_invalid_argument(
        [&] {
          braid::torch::PipelineExecutor(
              comm, schedule,
              {{.stage = 1 - rank,
                .forward = [&](const Tensor& input, int mb) { return stage.forward(input, mb); }}},
              {.activation_shape = {kRows, kWidth}});
        },
        fmt::format("stage {} is not one the schedule places on pipeline rank {}", 1 - rank, rank));
  });
}

}  // namespace
}  // namespace pipeline_executor_test
