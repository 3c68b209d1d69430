// Tensor and pipeline parallelism over real processes under braid-run: a rank that dies
// inside a TP layer's collective, or in the middle of a pipeline (in a forward or a
// backward of its stage), fails the others with an error naming it as a dead peer, well
// within the operation deadline. Programs come from the build through the environment:
// BRAID_RUN (the launcher), TP_PROBE (tp_probe.cpp), PIPELINE_PROBE (pipeline_probe.cpp) and
// FSDP_PROBE (fsdp_probe.cpp). The sharded data-parallel case: a rank that dies before a
// gather fails the others.
#include <chrono>
#include <csignal>
#include <sstream>

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "../support/child_process.hpp"

namespace parallel_process_test {
namespace {

using braid::testing::ChildProcess;
using braid::testing::program_from_env;
using ::testing::HasSubstr;
using namespace std::chrono_literals;

std::vector<std::string> lines_with(const std::string& text, const std::string& needle) {
  std::vector<std::string> found;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (line.find(needle) != std::string::npos) found.push_back(line);
  }
  return found;
}

class TensorParallelPeerFailure : public ::testing::TestWithParam<const char*> {};

TEST_P(TensorParallelPeerFailure, ARankKilledInsideATensorParallelCollectiveFailsItsPartner) {
  const auto started = std::chrono::steady_clock::now();
  // BRAID_TIMEOUT 20 s: a survivor that learnt of the death only from its deadline would
  // take that long; the test asks for well under it.
  auto result = ChildProcess({program_from_env("BRAID_RUN"), "-n", "2", "--grace", "40",
                              "--timeout", "50", program_from_env("TP_PROBE"), GetParam(), "1"},
                             {{"BRAID_TIMEOUT", "20"}, {"BRAID_TP", "2"}}, 60s)
                    .wait();
  const auto took = std::chrono::steady_clock::now() - started;
  EXPECT_EQ(result.status, 128 + SIGKILL) << result.out << result.err;
  EXPECT_THAT(result.err, HasSubstr("braid-run: rank 1 (pid "));
  const auto saw = lines_with(result.err, "[0] rank 0 saw: ");
  ASSERT_EQ(saw.size(), 1U) << result.out << result.err;
  EXPECT_THAT(saw[0], HasSubstr("(peer rank 1"));
  EXPECT_THAT(saw[0], HasSubstr("peer failed"));
  EXPECT_LT(took, 15s) << "the survivor waited for its deadline instead";
}

class PipelinePeerFailure : public ::testing::TestWithParam<const char*> {};

// Rank 1 of a 3-stage pipeline dies: rank 0 waits on its gradients, rank 2 on its
// activations; both fail naming it.
TEST_P(PipelinePeerFailure, ARankKilledMidPipelineFailsEverySurvivorNamingIt) {
  const auto started = std::chrono::steady_clock::now();
  auto result =
      ChildProcess({program_from_env("BRAID_RUN"), "-n", "3", "--grace", "40", "--timeout", "50",
                    program_from_env("PIPELINE_PROBE"), GetParam(), "1"},
                   {{"BRAID_TIMEOUT", "20"}}, 60s)
          .wait();
  const auto took = std::chrono::steady_clock::now() - started;
  EXPECT_EQ(result.status, 128 + SIGKILL) << result.out << result.err;
  EXPECT_THAT(result.err, HasSubstr("braid-run: rank 1 (pid "));
  for (const int survivor : {0, 2}) {
    const auto saw = lines_with(result.err, fmt::format("[{}] rank {} saw: ", survivor, survivor));
    ASSERT_EQ(saw.size(), 1U) << result.out << result.err;
    EXPECT_THAT(saw[0], HasSubstr("peer failed"));
    EXPECT_THAT(saw[0], HasSubstr("world rank 1"));
  }
  EXPECT_LT(took, 15s) << "a survivor waited for its deadline instead";
}

INSTANTIATE_TEST_SUITE_P(Phases, PipelinePeerFailure, ::testing::Values("forward", "backward"),
                         [](const auto& info) { return std::string(info.param); });

// A rank of a fully sharded job dies before a forward: the others, waiting in the root
// unit's all-gather, fail naming it.
TEST(ShardedPeerFailure, ARankKilledBeforeAGatherFailsEverySurvivorNamingIt) {
  const auto started = std::chrono::steady_clock::now();
  auto result = ChildProcess({program_from_env("BRAID_RUN"), "-n", "3", "--grace", "40",
                              "--timeout", "50", program_from_env("FSDP_PROBE"), "1"},
                             {{"BRAID_TIMEOUT", "20"}}, 60s)
                    .wait();
  const auto took = std::chrono::steady_clock::now() - started;
  EXPECT_EQ(result.status, 128 + SIGKILL) << result.out << result.err;
  for (const int survivor : {0, 2}) {
    const auto saw = lines_with(result.err, fmt::format("[{}] rank {} saw: ", survivor, survivor));
    ASSERT_EQ(saw.size(), 1U) << result.out << result.err;
    EXPECT_THAT(saw[0], HasSubstr("peer failed"));
    EXPECT_THAT(saw[0], HasSubstr("rank 1"));
  }
  EXPECT_LT(took, 15s) << "a survivor waited for its deadline instead";
}

INSTANTIATE_TEST_SUITE_P(Phases, TensorParallelPeerFailure,
                         ::testing::Values("forward", "backward"),
                         [](const auto& info) { return std::string(info.param); });

}  // namespace
}  // namespace parallel_process_test
