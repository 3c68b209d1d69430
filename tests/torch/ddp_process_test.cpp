// DDP over real processes started by braid-run, when a rank dies: every survivor's
// backward() (or join()) fails within its deadline with an error naming the dead rank, and
// nothing hangs. Programs come from the build through the environment: BRAID_RUN (the
// launcher) and DDP_PROBE (ddp_probe.cpp).
#include <csignal>
#include <sstream>

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "../support/child_process.hpp"

namespace braid::torch {
namespace {

using braid::testing::ChildProcess;
using braid::testing::program_from_env;
using ::testing::HasSubstr;
using ::testing::Not;
using namespace std::chrono_literals;

std::vector<std::string> lines_with(const std::string& text, const std::string& needle) {
  std::vector<std::string> found;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (line.find(needle) != std::string::npos) found.push_back(line);
  }
  return found;
}

struct Death {
  const char* mode;  // ddp_probe's: backward, joined
  int world;
  int doomed;
};

class DataParallelPeerFailure : public ::testing::TestWithParam<Death> {};

// The doomed rank dies in the middle of a backward pass (its earlier buckets launched, the
// rest not), or while the others shadow it from join(): each survivor's call fails naming
// it, as a peer failure, long before the 20 s operation deadline.
TEST_P(DataParallelPeerFailure, ARankKilledMidTrainingFailsEverySurvivorNamingIt) {
  const Death death = GetParam();
  auto result = ChildProcess({program_from_env("BRAID_RUN"), "-n", std::to_string(death.world),
                              "--grace", "40", "--timeout", "50", program_from_env("DDP_PROBE"),
                              death.mode, std::to_string(death.doomed)},
                             {{"BRAID_TIMEOUT", "20"}}, 60s)
                    .wait();
  EXPECT_EQ(result.status, 128 + SIGKILL) << result.out << result.err;
  EXPECT_THAT(result.err, HasSubstr(fmt::format("braid-run: rank {} (pid ", death.doomed)));
  EXPECT_THAT(result.err, Not(HasSubstr("Caught signal"))) << "a survivor crashed";
  for (int survivor = 0; survivor < death.world; ++survivor) {
    if (survivor == death.doomed) continue;
    const auto saw = lines_with(result.err, fmt::format("[{}] rank {} saw: ", survivor, survivor));
    ASSERT_EQ(saw.size(), 1U) << result.out << result.err;
    EXPECT_THAT(saw[0], HasSubstr(fmt::format("(peer rank {}", death.doomed)));
    EXPECT_THAT(saw[0], HasSubstr("peer failed"));
    // The next step is refused with that failure, not a complaint about an unfinished
    // backward.
    const auto then =
        lines_with(result.err, fmt::format("[{}] rank {} then: ", survivor, survivor));
    ASSERT_EQ(then.size(), 1U) << result.err;
    if (std::string(death.mode) == "backward") {
      EXPECT_THAT(then[0], HasSubstr("the previous iteration's gradient reduction failed"));
      EXPECT_THAT(then[0], HasSubstr(fmt::format("(peer rank {}", death.doomed)));
    }
    EXPECT_THAT(then[0], Not(HasSubstr("needs its backward()")));
  }
  EXPECT_LT(result.elapsed, 20s) << result.err;
}

INSTANTIATE_TEST_SUITE_P(Deaths, DataParallelPeerFailure,
                         ::testing::Values(Death{"backward", 2, 1}, Death{"backward", 3, 2},
                                           Death{"joined", 2, 1}),
                         [](const auto& info) {
                           return fmt::format("{}_{}ranks_rank{}dies", info.param.mode,
                                              info.param.world, info.param.doomed);
                         });

}  // namespace
}  // namespace braid::torch
