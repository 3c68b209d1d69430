// Tensor parallelism over real processes under braid-run: a rank that dies inside a TP
// layer's collective, in forward or in backward, fails its partners with an error naming
// it as a dead peer, well within the operation deadline. Programs come from the build
// through the environment: BRAID_RUN (the launcher) and TP_PROBE (tp_probe.cpp).
#include <chrono>
#include <csignal>
#include <sstream>

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "../support/child_process.hpp"

namespace tp_process_test {
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

INSTANTIATE_TEST_SUITE_P(Phases, TensorParallelPeerFailure,
                         ::testing::Values("forward", "backward"),
                         [](const auto& info) { return std::string(info.param); });

}  // namespace
}  // namespace tp_process_test
