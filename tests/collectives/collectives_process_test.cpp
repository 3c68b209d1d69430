// The collectives over real processes started by braid-run: results on 2, 3 and 4 ranks,
// and a killed rank failing its peers' all_reduce with an error naming it. Programs come
// from the build through the environment: BRAID_RUN (the launcher) and COLLECTIVE_PROBE
// (collective_probe.cpp).
#include <array>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sched.h>
#include <sstream>
#include <sys/mman.h>

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <braid/transport/bootstrap.hpp>

#include "../support/child_process.hpp"

namespace braid::collectives {
namespace {

using braid::testing::ChildProcess;
using braid::testing::program_from_env;
using ::testing::HasSubstr;
using ::testing::Not;
using namespace std::chrono_literals;

std::string braid_run() {
  return program_from_env("BRAID_RUN");
}
std::string probe() {
  return program_from_env("COLLECTIVE_PROBE");
}

// The lines of `text` that contain `needle`.
std::vector<std::string> lines_with(const std::string& text, const std::string& needle) {
  std::vector<std::string> found;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (line.find(needle) != std::string::npos) found.push_back(line);
  }
  return found;
}

// A world size, whether shared-memory collectives read peers' buffers directly
// (BRAID_SHM_SINGLE_COPY: auto, 1, 0), and whether their waits sleep on doorbells or nap
// (BRAID_SHM_DOORBELL).
struct Ranks {
  int size;
  const char* single_copy;
  const char* doorbell = "1";
};

class CollectivesProcesses : public ::testing::TestWithParam<Ranks> {};

TEST_P(CollectivesProcesses, EveryCollectiveGivesTheExactResultOnEveryRank) {
  const auto [size, single_copy, doorbell] = GetParam();
  auto result =
      ChildProcess({braid_run(), "-n", std::to_string(size), "--timeout", "120", probe(), "check"},
                   {{"BRAID_SHM_SINGLE_COPY", single_copy}, {"BRAID_SHM_DOORBELL", doorbell}}, 150s)
          .wait();
  ASSERT_EQ(result.status, 0) << result.out << result.err;
  for (int r = 0; r < size; ++r) {
    EXPECT_THAT(result.out, HasSubstr(fmt::format("[{}] rank {} ok", r, r))) << result.err;
  }
}

// Two launchers on this machine, as on two nodes (--nnodes 2 --node-rank k): the ranks
// learn their nodes from the launcher's environment, and all-reduce goes hierarchical.
TEST(CollectivesProcesses, FourRanksAsTwoNodesOfTwoRunEveryCollectiveHierarchically) {
  const std::string port = std::to_string(braid::transport::find_free_port());
  auto node = [&](int node_rank) {
    return ChildProcess(
        {braid_run(), "-n", "2", "--nnodes", "2", "--node-rank", std::to_string(node_rank),
         "--master-addr", "127.0.0.1", "--master-port", port, "--timeout", "120", probe(), "check"},
        {{"BRAID_TOKEN", "two-pretend-nodes"}}, 150s);
  };
  ChildProcess first = node(0);
  ChildProcess second = node(1);
  const auto results = std::array{first.wait(), second.wait()};
  for (int n = 0; n < 2; ++n) {
    const auto& result = results[static_cast<std::size_t>(n)];
    ASSERT_EQ(result.status, 0) << "node " << n << ":\n" << result.out << result.err;
    for (int local = 0; local < 2; ++local) {
      const int r = 2 * n + local;
      EXPECT_THAT(result.out, HasSubstr(fmt::format(
                                  "[{}] rank {} ok (all_reduce of 1 MiB: hierarchical)", r, r)))
          << result.err;
    }
  }
}

// How many times `needle` occurs in the file at `path`.
int occurrences(const std::filesystem::path& path, const std::string& needle) {
  std::ifstream file(path);
  const std::string text((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  int count = 0;
  for (auto at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) {
    ++count;
  }
  return count;
}

constexpr int kReuseRanks = 4;  // more than this machine's 2 cores: a crowded node

// The shared-memory path each rank's all-reduces took in collective_probe's `reuse` run
// on kReuseRanks ranks, from its trace: one shared_memory.chunk span per 2 MiB copied
// through the segment, one shared_memory.reduce span per all-reduce that read peers.
struct Paths {
  int chunks = 0;
  int direct = 0;
};
std::vector<Paths> reuse_paths(const char* single_copy) {
  const std::filesystem::path traces =
      std::filesystem::temp_directory_path() / fmt::format("braid-reuse-{}", getpid());
  auto result =
      ChildProcess(
          {braid_run(), "-n", std::to_string(kReuseRanks), "--timeout", "120", probe(), "reuse"},
          {{"BRAID_SHM_SINGLE_COPY", single_copy}, {"BRAID_TRACE", traces.string()}}, 150s)
          .wait();
  EXPECT_EQ(result.status, 0) << result.out << result.err;
  std::vector<Paths> paths;
  for (int r = 0; r < kReuseRanks; ++r) {
    const auto trace = traces / fmt::format("rank-{}.trace.json", r);
    paths.push_back({.chunks = occurrences(trace, R"("name":"shared_memory.chunk")"),
                     .direct = occurrences(trace, R"("name":"shared_memory.reduce")")});
  }
  std::filesystem::remove_all(traces);
  return paths;
}

// Seven all-reduces of about 6 MB (3 chunks each through the segment, or one direct
// reduction): by default rank 0 times both ways and every rank takes the way it chose
// (path_timings.hpp). While it has fewer than PathTimings::kFirstSamples (4) of each it
// alternates, starting with the segment, so three of the seven read peers, on every rank.
TEST(CollectivesProcesses, AllReduceTakesTheWayRankZerosTimingsChooseOnEveryRank) {
  const std::vector<Paths> paths = reuse_paths("auto");
  for (int r = 0; r < static_cast<int>(paths.size()); ++r) {
    const Paths& taken = paths[static_cast<std::size_t>(r)];
    EXPECT_EQ(taken.chunks + 3 * taken.direct, 21) << "rank " << r;
    EXPECT_EQ(taken.direct, paths.front().direct) << "rank " << r << ": every rank alike";
    EXPECT_EQ(taken.direct, 3) << "rank " << r << ": the ways alternate while first timed";
  }
}

TEST(CollectivesProcesses, TheSingleCopyKnobPinsTheAllReducesWay) {
  for (const Paths& taken : reuse_paths("1")) {
    EXPECT_EQ(taken.direct, 7) << "BRAID_SHM_SINGLE_COPY=1: every all-reduce reads peers";
    EXPECT_EQ(taken.chunks, 0);
  }
  for (const Paths& taken : reuse_paths("0")) {
    EXPECT_EQ(taken.chunks, 21) << "BRAID_SHM_SINGLE_COPY=0: every one through the segment";
    EXPECT_EQ(taken.direct, 0);
  }
}

INSTANTIATE_TEST_SUITE_P(Worlds, CollectivesProcesses,
                         ::testing::Values(Ranks{1, "auto"}, Ranks{2, "auto"}, Ranks{3, "1"},
                                           Ranks{4, "0"}, Ranks{8, "auto"}, Ranks{3, "auto", "0"}),
                         [](const auto& info) {
                           return fmt::format("ranks{}_single_copy_{}_doorbell_{}", info.param.size,
                                              info.param.single_copy, info.param.doorbell);
                         });

struct Death {
  int world;
  int doomed;
  const char* single_copy;                // BRAID_SHM_SINGLE_COPY
  const char* collective = "all_reduce";  // collective_probe's name for it
  const char* operation = nullptr;        // how errors name it, where that differs
};

class CollectivesPeerFailure : public ::testing::TestWithParam<Death> {};

// Every survivor's collective (all-reduce; broadcast and all-gather by single copy; a small
// all-reduce and a barrier through the inline slots, one flag wait each; an all-reduce on
// memory from allocate_shared, read through the mapping) fails
// naming the dead rank, including survivors that never exchange a message with it (4
// ranks, rank 2 dies: rank 0's ring neighbours are 1 and 3), and no survivor crashes
// afterwards (its buffers are freed right after the error).
TEST_P(CollectivesPeerFailure, AKilledRankFailsEverySurvivorsCollectiveNamingIt) {
  const auto [world, doomed, single_copy, collective, operation] = GetParam();
  // BRAID_TIMEOUT is short so that a survivor that is never told would time out (and the
  // test fail on its message) rather than hang; the grace lets survivors, which ignore
  // braid-run's SIGTERM, report what they saw.
  auto result =
      ChildProcess({braid_run(), "-n", std::to_string(world), "--grace", "40", "--timeout", "50",
                    probe(), "die", std::to_string(doomed), collective},
                   {{"BRAID_TIMEOUT", "20"}, {"BRAID_SHM_SINGLE_COPY", single_copy}}, 60s)
          .wait();
  // braid-run reports the first failure, the doomed rank's death, and fails with its status.
  EXPECT_EQ(result.status, 128 + SIGKILL) << result.out << result.err;
  EXPECT_THAT(result.err, HasSubstr(fmt::format("braid-run: rank {} (pid ", doomed)));
  EXPECT_THAT(result.err, HasSubstr("was killed by signal 9 (SIGKILL)"));
  EXPECT_THAT(result.err, Not(HasSubstr("Caught signal"))) << "a survivor crashed";
  for (int survivor = 0; survivor < world; ++survivor) {
    if (survivor == doomed) continue;
    const auto saw = lines_with(result.err, fmt::format("[{}] rank {} saw: ", survivor, survivor));
    ASSERT_EQ(saw.size(), 1U) << result.out << result.err;
    EXPECT_THAT(saw[0], HasSubstr(fmt::format("rank {}: {}", survivor,
                                              operation != nullptr ? operation : collective)));
    EXPECT_THAT(saw[0], HasSubstr(fmt::format("(peer rank {}", doomed)));
    EXPECT_THAT(saw[0], HasSubstr("peer failed"));
  }
  // Detected, not timed out: well inside the survivors' 20 s operation deadline.
  EXPECT_LT(result.elapsed, 20s) << result.err;
}

// The same on pretend nodes: a rank that dies during a hierarchical all-reduce (2 nodes of
// 2) fails every survivor's operation naming it, on its own node and on the other, whether
// the survivor was in the node phase or the cross-node phase with it.
TEST(CollectivesPeerFailure, AKilledRankFailsAHierarchicalAllReduceOnBothNodes) {
  const int doomed = 3;
  const std::string port = std::to_string(braid::transport::find_free_port());
  auto node = [&](int node_rank) {
    return ChildProcess(
        {braid_run(), "-n", "2", "--nnodes", "2", "--node-rank", std::to_string(node_rank),
         "--master-addr", "127.0.0.1", "--master-port", port, "--grace", "40", "--timeout", "50",
         probe(), "die", std::to_string(doomed)},
        {{"BRAID_TIMEOUT", "20"},
         {"BRAID_TOKEN", "two-pretend-nodes"},
         {"BRAID_ALGO", "allreduce:0-inf:hierarchical"}},
        60s);
  };
  ChildProcess first = node(0);
  ChildProcess second = node(1);
  const auto results = std::array{first.wait(), second.wait()};
  const std::string err = results[0].err + results[1].err;
  EXPECT_THAT(err, Not(HasSubstr("Caught signal"))) << "a survivor crashed";
  for (int survivor = 0; survivor < 4; ++survivor) {
    if (survivor == doomed) continue;
    const auto saw = lines_with(err, fmt::format("[{}] rank {} saw: ", survivor, survivor));
    ASSERT_EQ(saw.size(), 1U) << results[0].err << results[1].err;
    EXPECT_THAT(saw[0], HasSubstr("all_reduce[hierarchical]"));
    EXPECT_THAT(saw[0], HasSubstr(fmt::format("(peer rank {}", doomed)));
    EXPECT_THAT(saw[0], HasSubstr("peer failed"));
  }
  for (const auto& result : results) EXPECT_LT(result.elapsed, 20s) << err;
}

INSTANTIATE_TEST_SUITE_P(
    Deaths, CollectivesPeerFailure,
    ::testing::Values(Death{3, 1, "1"}, Death{3, 0, "0"}, Death{4, 2, "auto"}, Death{2, 1, "1"},
                      Death{2, 0, "1", "broadcast"}, Death{3, 2, "auto", "all_gather"},
                      Death{3, 1, "auto", "small_all_reduce", "all_reduce[shared_memory]"},
                      Death{2, 0, "auto", "barrier", "barrier[shared_memory]"},
                      Death{3, 1, "0", "shared_all_reduce", "all_reduce[shared_memory]"}),
    [](const auto& info) {
      return fmt::format("{}_rank{}of{}_single_copy_{}", info.param.collective, info.param.doomed,
                         info.param.world, info.param.single_copy);
    });

}  // namespace
}  // namespace braid::collectives
