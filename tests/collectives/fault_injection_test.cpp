// Every way a rank can leave early, at every place its peers can wait on it, under every
// way of launching: each survivor exits within 2 s of the doomed rank leaving, naming it.
// The ranks are fault_probe processes (fault_probe.cpp says what each mode and place does).
//
// Launches: braid-run (which stops survivors itself, so the probes ignore its SIGTERM and
// what is measured is their own exit), by hand with braid's variables, and by hand with
// torchrun's (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT), where nothing but the ranks
// themselves can end the job.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <optional>
#include <regex>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <braid/transport/bootstrap.hpp>

#include "../support/child_process.hpp"

namespace braid::collectives {
namespace {

using braid::testing::ChildProcess;
using braid::testing::Env;
using braid::testing::Outcome;
using braid::testing::program_from_env;
using ::testing::HasSubstr;
using namespace std::chrono_literals;

constexpr auto kBound = 2s;  // how long after the doomed rank leaves every rank is gone

enum class Launch { braid_run, by_hand, torchrun_variables };

struct Case {
  const char* mode;
  const char* place;
  Launch launch = Launch::by_hand;
};

std::string name_of(const ::testing::TestParamInfo<Case>& info) {
  const char* launch = info.param.launch == Launch::braid_run ? "BraidRun"
                       : info.param.launch == Launch::by_hand ? "ByHand"
                                                              : "TorchrunVariables";
  return fmt::format("{}_{}_{}", info.param.mode, info.param.place, launch);
}

Env variables_for(Launch launch, int rank, int size, std::uint16_t port) {
  if (launch == Launch::torchrun_variables) {
    return {{"RANK", std::to_string(rank)},       {"WORLD_SIZE", std::to_string(size)},
            {"LOCAL_RANK", std::to_string(rank)}, {"LOCAL_WORLD_SIZE", std::to_string(size)},
            {"MASTER_ADDR", "127.0.0.1"},         {"MASTER_PORT", std::to_string(port)}};
  }
  return {{"BRAID_RANK", std::to_string(rank)},
          {"BRAID_WORLD_SIZE", std::to_string(size)},
          {"BRAID_STORE", "127.0.0.1:" + std::to_string(port)},
          {"BRAID_TOKEN", "faults"}};
}

// Every CLOCK_MONOTONIC stamp "<name>=<ns>" in `text`.
std::vector<std::int64_t> stamps(const std::string& text, const std::string& name) {
  std::vector<std::int64_t> found;
  const std::regex pattern(name + "=([0-9]+)");
  for (auto it = std::sregex_iterator(text.begin(), text.end(), pattern);
       it != std::sregex_iterator(); ++it) {
    found.push_back(std::stoll((*it)[1].str()));
  }
  return found;
}

std::chrono::nanoseconds ns(std::int64_t count) {
  return std::chrono::nanoseconds(count);
}

class FaultInjection : public ::testing::TestWithParam<Case> {};

TEST_P(FaultInjection, EverySurvivorExitsWithinTwoSecondsNamingTheRankThatLeft) {
  const Case c = GetParam();
  const bool chain = std::string(c.place) == "chain";
  const int size = chain ? 4 : 2;
  const int doomed = chain ? 2 : 1;
  const std::string probe = program_from_env("FAULT_PROBE");
  const std::vector<std::string> args = {probe, c.mode, c.place, std::to_string(doomed)};

  std::vector<Outcome> outcomes;
  if (c.launch == Launch::braid_run) {
    std::vector<std::string> command = {program_from_env("BRAID_RUN"),
                                        "-n",
                                        std::to_string(size),
                                        "--grace",
                                        "30",
                                        "--timeout",
                                        "60"};
    command.insert(command.end(), args.begin(), args.end());
    outcomes.push_back(ChildProcess(command, {}, 60s).wait());
  } else {
    const auto port = transport::find_free_port();
    std::vector<std::unique_ptr<ChildProcess>> ranks;
    for (int r = 0; r < size; ++r) {
      Env env = variables_for(c.launch, r, size, port);
      env["BRAID_TIMEOUT"] = "60";
      ranks.push_back(std::make_unique<ChildProcess>(args, env, 60s));
    }
    for (auto& rank : ranks) outcomes.push_back(rank->wait());
  }

  std::string err;
  for (const Outcome& o : outcomes) err += o.err;
  const std::vector<std::int64_t> doomed_at = stamps(err, "doomed_at_ns");
  const std::vector<std::int64_t> exited_at = stamps(err, "exited_at_ns");
  ASSERT_EQ(doomed_at.size(), 1u) << err;
  // The doomed rank stamps its exit too where it runs on (throw, return).
  const std::size_t stamping = static_cast<std::size_t>(size) - 1 +
                               (c.mode == std::string("throw") || c.mode == std::string("return"));
  ASSERT_EQ(exited_at.size(), stamping) << err;
  const auto slowest = ns(*std::max_element(exited_at.begin(), exited_at.end()) - doomed_at[0]);
  EXPECT_LT(slowest, kBound) << err;
  RecordProperty("slowest_exit_ms", static_cast<int>(slowest / 1ms));
  std::cout << fmt::format("[ figures ] {} {}: slowest rank exits {:.0f} ms after rank {} leaves\n",
                           c.mode, c.place,
                           std::chrono::duration<double, std::milli>(slowest).count(), doomed);

  // Every survivor that waited on the doomed rank names it. In a chain, rank 3 waited on rank
  // 2 and rank 1 on rank 3, whose failure names rank 2 as its cause where rank 2 failed.
  const std::regex saw("rank ([0-9]+) saw: ([^\n]*)");
  int survivors_that_saw = 0;
  for (auto it = std::sregex_iterator(err.begin(), err.end(), saw); it != std::sregex_iterator();
       ++it) {
    const int rank = std::stoi((*it)[1].str());
    const std::string what = (*it)[2].str();
    if (rank == doomed) continue;  // throw: its own error
    ++survivors_that_saw;
    const bool clean_leave = c.mode == std::string("return");
    if (chain && rank == 1 && clean_leave) {
      EXPECT_THAT(what, HasSubstr("rank 3")) << err;
    } else {
      EXPECT_THAT(what, HasSubstr(fmt::format("rank {}", doomed))) << err;
    }
    if (clean_leave && !(chain && rank == 1)) {
      EXPECT_THAT(what, HasSubstr("ended its program")) << err;
    }
  }
  // Chains end rank 0 by its own clean exit: it waits on nobody.
  EXPECT_EQ(survivors_that_saw, chain ? 2 : 1) << err;
}

std::vector<Case> cases() {
  std::vector<Case> all;
  for (const char* mode : {"kill", "throw", "exit", "return"}) {
    for (const char* place :
         {"all_reduce", "barrier", "all_gather", "recv", "send", "store_wait", "chain"}) {
      all.push_back({mode, place, Launch::by_hand});
    }
    all.push_back({mode, "all_reduce", Launch::braid_run});
    all.push_back({mode, "chain", Launch::braid_run});
    all.push_back({mode, "recv", Launch::torchrun_variables});
  }
  return all;
}

INSTANTIATE_TEST_SUITE_P(Modes, FaultInjection, ::testing::ValuesIn(cases()), name_of);

}  // namespace
}  // namespace braid::collectives
