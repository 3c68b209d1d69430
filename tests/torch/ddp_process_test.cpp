// DDP over real processes, under braid-run and started by hand, when a rank dies or the
// ranks disagree: every survivor's call fails with an error naming the dead rank (or the
// mismatch), and every rank exits within seconds of the failure, nothing waiting for a
// rank that will never come. Programs come from the build through the environment:
// BRAID_RUN (the launcher), DDP_PROBE (ddp_probe.cpp) and DDP_TRAIN (examples/ddp_train).
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <sstream>
#include <thread>

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <braid/transport/bootstrap.hpp>

#include "../support/child_process.hpp"

namespace braid::torch {
namespace {

using braid::testing::ChildProcess;
using braid::testing::Env;
using braid::testing::Outcome;
using braid::testing::program_from_env;
using ::testing::HasSubstr;
using ::testing::Not;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

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

// ---------------------------------------------------------------- exits after a failure

// The environment braid-run would give rank `rank` of `size`, for ranks started by hand.
Env by_hand(int rank, int size, std::uint16_t port) {
  return {{"BRAID_RANK", std::to_string(rank)},
          {"BRAID_WORLD_SIZE", std::to_string(size)},
          {"BRAID_STORE", fmt::format("127.0.0.1:{}", port)},
          {"BRAID_TOKEN", "exits"},
          {"OMP_NUM_THREADS", "1"}};
}

// The pid of `launcher`'s child that runs rank `rank` (its environment says so), or -1.
pid_t rank_pid(pid_t launcher, int rank) {
  const std::string wanted = fmt::format("BRAID_RANK={}", rank);
  for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
    const std::string name = entry.path().filename();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream stat(entry.path() / "stat");
    std::string line;
    std::getline(stat, line);
    // "pid (command) state ppid ...": the command may hold spaces, so read past its ')'.
    const auto close = line.rfind(')');
    if (close == std::string::npos) continue;
    std::istringstream rest(line.substr(close + 1));
    char state = 0;
    pid_t parent = 0;
    rest >> state >> parent;
    if (parent != launcher) continue;
    std::ifstream environ_file(entry.path() / "environ");
    const std::string environ_text((std::istreambuf_iterator<char>(environ_file)), {});
    std::istringstream variables(environ_text);
    for (std::string variable; std::getline(variables, variable, '\0');) {
      if (variable == wanted) return static_cast<pid_t>(std::stoi(name));
    }
  }
  return -1;
}

// How long after `since` the child's exit came, the child waited for.
std::chrono::duration<double> exited_after(ChildProcess& child, Clock::time_point since,
                                           Outcome& outcome) {
  outcome = child.wait();
  return Clock::now() - since;
}

// Without a launcher nothing stops a survivor but itself: once its peer is known dead, it
// must report it and exit, not wait for the dead rank to leave. (It waited the whole leave
// timeout, 30 s, in the leave barrier.)
TEST(DataParallelExit, ASurvivorStartedByHandExitsWithinSecondsOfItsPeersKillNamingIt) {
  const auto port = transport::find_free_port();
  const std::string train = program_from_env("DDP_TRAIN");
  ChildProcess rank0({train, "--steps", "5000"}, by_hand(0, 2, port), 60s);
  ChildProcess rank1({train, "--steps", "5000"}, by_hand(1, 2, port), 60s);
  rank0.read_until("step ", 3);  // training, with buckets in flight
  ASSERT_EQ(::kill(rank1.pid(), SIGKILL), 0);
  const auto killed = Clock::now();
  Outcome survivor;
  const auto after = exited_after(rank0, killed, survivor);
  EXPECT_EQ(rank1.wait().status, 128 + SIGKILL);
  EXPECT_EQ(survivor.status, 1) << survivor.err;
  EXPECT_THAT(survivor.err, HasSubstr("rank 1 failed")) << survivor.err;
  EXPECT_LT(after, 5s) << survivor.err;
}

TEST(DataParallelExit, UnderBraidRunAKilledRankEndsTheJobWithinSecondsNamingIt) {
  ChildProcess job(
      {program_from_env("BRAID_RUN"), "-n", "2", program_from_env("DDP_TRAIN"), "--steps", "5000"},
      {}, 60s);
  job.read_until("step ", 3);
  const pid_t victim = rank_pid(job.pid(), 1);
  ASSERT_GT(victim, 0) << "no child of braid-run runs rank 1";
  ASSERT_EQ(::kill(victim, SIGKILL), 0);
  const auto killed = Clock::now();
  Outcome result;
  const auto after = exited_after(job, killed, result);
  EXPECT_EQ(result.status, 128 + SIGKILL) << result.err;
  EXPECT_THAT(result.err, HasSubstr(fmt::format("braid-run: rank 1 (pid {}) was killed", victim)));
  EXPECT_LT(after, 5s) << result.err;
}

// Ranks whose calls stop pairing up fail where they notice it; the rank that noticed first
// must not leave the others waiting on it until their deadlines (31 s with mismatched
// bucket caps, 31-61 s with different step counts, before it announced its failure).
// `rank_arguments` are rank 0's and rank 1's own ddp_train options.
Outcome run_disagreeing(const std::string& rank0_arguments, const std::string& rank1_arguments) {
  const std::string script =
      fmt::format("if [ \"$BRAID_RANK\" = 0 ]; then exec \"$0\" {}; else exec \"$0\" {}; fi",
                  rank0_arguments, rank1_arguments);
  return ChildProcess({program_from_env("BRAID_RUN"), "-n", "2", "/bin/bash", "-c", script,
                       program_from_env("DDP_TRAIN")},
                      {}, 90s)
      .wait();
}

TEST(DataParallelExit, RanksWithDifferentBucketCapsFailWithinSecondsNamingTheMismatch) {
  const Outcome result =
      run_disagreeing("--steps 40 --bucket-cap-mib 25", "--steps 40 --bucket-cap-mib 1");
  EXPECT_EQ(result.status, 1) << result.out << result.err;
  EXPECT_THAT(result.err, HasSubstr("the ranks disagree on --bucket-cap-mib")) << result.err;
  EXPECT_LT(result.elapsed, 15s) << result.err;
}

TEST(DataParallelExit, RanksRunningDifferentStepCountsFailWithinSecondsNamingTheMismatch) {
  for (const auto& [steps0, steps1] : {std::pair{20, 30}, std::pair{30, 20}}) {
    const Outcome result =
        run_disagreeing(fmt::format("--steps {}", steps0), fmt::format("--steps {}", steps1));
    EXPECT_EQ(result.status, 1) << result.out << result.err;
    EXPECT_THAT(result.err, HasSubstr("the ranks disagree on --steps")) << result.err;
    EXPECT_LT(result.elapsed, 15s) << steps0 << " and " << steps1 << " steps\n" << result.err;
  }
}

// Fault injection: a random rank of a ddp_probe job, under braid-run or started by hand, is
// killed at a random moment of training (after a random number of steps, then a random
// pause). Every survivor must say what it saw, naming the dead rank, and exit within
// seconds. The seed is printed; DDP_FAULT_SEED replays one.
struct Fault {
  bool launcher;
  int world;
  int victim;
  int steps;  // rank 0 has printed this many steps
  std::chrono::milliseconds pause;
};

// Survivor `survivor` said once what it saw (ddp_probe's "rank S saw: ...", after braid-run's
// "[S] " where `prefixed`), and it names rank `victim`.
void expect_report_naming(const std::string& err, int survivor, int victim, bool prefixed) {
  const std::string saw =
      fmt::format("{}rank {} saw: ", prefixed ? fmt::format("[{}] ", survivor) : "", survivor);
  const auto lines = lines_with(err, saw);
  ASSERT_EQ(lines.size(), 1U) << err;
  EXPECT_THAT(lines[0].substr(lines[0].find(saw) + saw.size()),
              HasSubstr(fmt::format("rank {}", victim)))
      << err;
}

void inject(const Fault& fault) {
  const std::string probe = program_from_env("DDP_PROBE");
  if (fault.launcher) {
    ChildProcess job({program_from_env("BRAID_RUN"), "-n", std::to_string(fault.world), "--grace",
                      "40", probe, "train"},
                     {}, 60s);
    job.read_until("step ", fault.steps);
    std::this_thread::sleep_for(fault.pause);
    const pid_t victim = rank_pid(job.pid(), fault.victim);
    ASSERT_GT(victim, 0);
    ASSERT_EQ(::kill(victim, SIGKILL), 0);
    const auto killed = Clock::now();
    Outcome result;
    const auto after = exited_after(job, killed, result);
    EXPECT_EQ(result.status, 128 + SIGKILL) << result.err;
    EXPECT_THAT(result.err,
                HasSubstr(fmt::format("braid-run: rank {} (pid {})", fault.victim, victim)));
    for (int survivor = 0; survivor < fault.world; ++survivor) {
      if (survivor != fault.victim) expect_report_naming(result.err, survivor, fault.victim, true);
    }
    EXPECT_LT(after, 5s) << result.err;
    return;
  }
  const auto port = transport::find_free_port();
  std::vector<std::unique_ptr<ChildProcess>> ranks;
  for (int r = 0; r < fault.world; ++r) {
    ranks.push_back(std::make_unique<ChildProcess>(std::vector<std::string>{probe, "train"},
                                                   by_hand(r, fault.world, port), 60s));
  }
  ranks[0]->read_until("step ", fault.steps);
  std::this_thread::sleep_for(fault.pause);
  ASSERT_EQ(::kill(ranks[static_cast<std::size_t>(fault.victim)]->pid(), SIGKILL), 0);
  const auto killed = Clock::now();
  for (int r = 0; r < fault.world; ++r) {
    Outcome outcome;
    const auto after = exited_after(*ranks[static_cast<std::size_t>(r)], killed, outcome);
    if (r == fault.victim) {
      EXPECT_EQ(outcome.status, 128 + SIGKILL);
      continue;
    }
    EXPECT_EQ(outcome.status, 3) << outcome.err;
    expect_report_naming(outcome.err, r, fault.victim, false);
    EXPECT_LT(after, 5s) << "rank " << r << ":\n" << outcome.err;
  }
}

TEST(DataParallelExit, EverySurvivorOfARankKilledAtRandomExitsWithinSecondsNamingIt) {
  const char* replay = std::getenv("DDP_FAULT_SEED");
  const std::uint32_t seed =
      replay != nullptr ? static_cast<std::uint32_t>(std::stoul(replay)) : std::random_device{}();
  std::cout << "fault injection seed " << seed << " (DDP_FAULT_SEED=" << seed << " replays it)\n";
  RecordProperty("seed", std::to_string(seed));
  std::mt19937 random(seed);
  for (int trial = 0; trial < 10; ++trial) {
    Fault fault;
    fault.launcher = trial % 2 == 1;
    fault.world = std::uniform_int_distribution<int>(2, 3)(random);
    fault.victim = std::uniform_int_distribution<int>(0, fault.world - 1)(random);
    fault.steps = std::uniform_int_distribution<int>(1, 40)(random);
    fault.pause = std::chrono::milliseconds(std::uniform_int_distribution<int>(0, 300)(random));
    SCOPED_TRACE(fmt::format(
        "trial {} (seed {}): {} ranks {}, rank {} killed after {} steps and "
        "{} ms",
        trial, seed, fault.world, fault.launcher ? "under braid-run" : "started by hand",
        fault.victim, fault.steps, fault.pause.count()));
    inject(fault);
  }
}

}  // namespace
}  // namespace braid::torch
