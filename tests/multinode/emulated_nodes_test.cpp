// Several nodes on this one machine (braid-run --emulate-nodes): jobs across them give
// exact results with their bytes on the links between the nodes, links shaped to a rate
// carry no more than it, pretend nodes without namespaces still talk over the network,
// and nothing the emulation makes outlives it. Needs root (CI runs as root); each test
// skips itself, saying why, where this machine cannot make namespaces.
//
// Programs come from the build through the environment: BRAID_RUN (the launcher) and
// COLLECTIVE_PROBE (tests/collectives/collective_probe.cpp).
#include <chrono>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <braid/transport/bootstrap.hpp>

#include "../support/child_process.hpp"

namespace braid {
namespace {

using braid::testing::ChildProcess;
using braid::testing::program_from_env;
using ::testing::HasSubstr;
using namespace std::chrono_literals;

std::string braid_run() {
  return program_from_env("BRAID_RUN");
}
std::string probe() {
  return program_from_env("COLLECTIVE_PROBE");
}

#define SKIP_WITHOUT_NAMESPACES()                                                                \
  if (ChildProcess({"/usr/bin/unshare", "--net", "--ipc", "--uts", "--mount", "--pid", "--fork", \
                    "/bin/true"})                                                                \
          .wait()                                                                                \
          .status != 0) {                                                                        \
    GTEST_SKIP() << "this machine does not let the test make namespaces (run it as root)";       \
  }

// What collective_probe's `link` mode printed: per node, the most bytes any of its ranks
// saw its interface send, and the longest all_reduce.
struct LinkUse {
  std::map<int, long long> sent_by_node;
  double seconds = 0;
};

LinkUse link_use(const std::string& out) {
  static const std::regex line(R"(rank \d+ node (\d+): \S+ sent (\d+) bytes during an all_reduce )"
                               R"(of \d+ bytes in ([0-9.]+) s)");
  LinkUse use;
  for (std::sregex_iterator it(out.begin(), out.end(), line), end; it != end; ++it) {
    const int node = std::stoi((*it)[1]);
    use.sent_by_node[node] = std::max(use.sent_by_node[node], std::stoll((*it)[2]));
    use.seconds = std::max(use.seconds, std::stod((*it)[3]));
  }
  return use;
}

TEST(EmulatedNodes, EveryCollectiveIsExactOnTwoNodesOfTwoRanks) {
  SKIP_WITHOUT_NAMESPACES();
  auto result = ChildProcess({braid_run(), "--emulate-nodes", "2", "-n", "2", "--timeout", "120",
                              probe(), "check"},
                             {}, 150s)
                    .wait();
  ASSERT_EQ(result.status, 0) << result.out << result.err;
  for (int r = 0; r < 4; ++r) {
    EXPECT_THAT(result.out,
                HasSubstr(fmt::format("[{}] rank {} ok (all_reduce of 1 MiB: hierarchical)", r, r)))
        << result.err;
  }
  // braid-run's closing report, one line per node.
  EXPECT_THAT(result.err, HasSubstr("node 0 (198.18.0.1) sent "));
  EXPECT_THAT(result.err, HasSubstr("node 1 (198.18.0.2) sent "));
}

// Each node has its own IPC and PID namespaces, so UCX finds no shared memory between
// nodes, and the all-reduce's bytes cross the veth links.
TEST(EmulatedNodes, AnAllReduceAcrossNodesSendsItsBytesOverTheLinks) {
  SKIP_WITHOUT_NAMESPACES();
  constexpr long long kBytes = 4 << 20;
  auto result = ChildProcess({braid_run(), "--emulate-nodes", "2", "-n", "2", "--timeout", "120",
                              probe(), "link", std::to_string(kBytes), "eth0"},
                             {}, 150s)
                    .wait();
  ASSERT_EQ(result.status, 0) << result.out << result.err;
  const LinkUse use = link_use(result.out);
  ASSERT_EQ(use.sent_by_node.size(), 2U) << result.out;
  EXPECT_GE(use.sent_by_node.at(0) + use.sent_by_node.at(1), kBytes) << result.out;
}

// At 100 Mbit/s (12.5 MB/s) what a node sends takes at least that long: the shaping holds.
TEST(EmulatedNodes, ALinkShapedToARateCarriesNoMoreThanIt) {
  SKIP_WITHOUT_NAMESPACES();
  constexpr long long kBytes = 2 << 20;
  auto result =
      ChildProcess({braid_run(), "--emulate-nodes", "2", "-n", "1", "--link-rate", "100mbit",
                    "--timeout", "120", probe(), "link", std::to_string(kBytes), "eth0"},
                   {}, 150s)
          .wait();
  ASSERT_EQ(result.status, 0) << result.out << result.err;
  const LinkUse use = link_use(result.out);
  ASSERT_EQ(use.sent_by_node.size(), 2U) << result.out;
  const long long most = std::max(use.sent_by_node.at(0), use.sent_by_node.at(1));
  ASSERT_GE(most, kBytes / 2) << result.out;
  // Less the burst tbf lets through at once (64 KiB).
  EXPECT_GE(use.seconds, 0.9 * static_cast<double>(most - (64 << 10)) / 12.5e6) << result.out;
}

// Two launchers on one machine told they are two nodes, in one network namespace with
// nothing else in it: UCX would find shared memory between them, but braid keeps it to the
// network across nodes, so the all-reduce's bytes go over the loopback interface.
TEST(EmulatedNodes, PretendNodesOnOneMachineStillTalkOverTheNetwork) {
  SKIP_WITHOUT_NAMESPACES();
  constexpr long long kBytes = 4 << 20;
  const std::string port = std::to_string(braid::transport::find_free_port());
  auto node = [&](int rank) {
    return fmt::format(
        "{} -n 1 --nnodes 2 --node-rank {} --master-addr 127.0.0.1 --master-port {} "
        "--timeout 100 {} link {} lo",
        braid_run(), rank, port, probe(), kBytes);
  };
  const std::string script =
      fmt::format("ip link set lo up && {{ {} & {}; wait $!; }}", node(0), node(1));
  auto result = ChildProcess({"/usr/bin/unshare", "--net", "/bin/sh", "-c", script},
                             {{"BRAID_TOKEN", "pretend-nodes"}}, 150s)
                    .wait();
  ASSERT_EQ(result.status, 0) << result.out << result.err;
  const LinkUse use = link_use(result.out);
  ASSERT_EQ(use.sent_by_node.size(), 2U) << result.out;
  // Both nodes' ranks share the one loopback counter.
  EXPECT_GE(use.sent_by_node.at(0), kBytes) << result.out;
}

// The processes whose command line holds `marker`.
int processes_with(const std::string& marker) {
  int found = 0;
  for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
    std::ifstream cmdline(entry.path() / "cmdline");
    std::string text((std::istreambuf_iterator<char>(cmdline)), std::istreambuf_iterator<char>());
    found += text.find(marker) != std::string::npos ? 1 : 0;
  }
  return found;
}

// SIGKILL gives braid-run no chance to clean up: the kernel does, since every namespace
// the emulation made lives only as long as braid-run and the nodes' first processes.
TEST(EmulatedNodes, NothingOutlivesALauncherKilledMidJob) {
  SKIP_WITHOUT_NAMESPACES();
  const std::string marker = fmt::format("987.{}", ::getpid());  // seconds, for sleep
  ChildProcess launcher({braid_run(), "--emulate-nodes", "2", "-n", "2", "/bin/sh", "-c",
                         "echo started && exec sleep \"$0\"", marker},
                        {}, 60s);
  launcher.read_until("started", 4);
  const std::string sleeping = std::string("sleep") + '\0' + marker;  // its command line
  // A shell prints before it execs its sleep: wait for the last exec.
  const auto started = std::chrono::steady_clock::now() + 5s;
  while (processes_with(sleeping) < 4 && std::chrono::steady_clock::now() < started) {
    std::this_thread::sleep_for(10ms);
  }
  ASSERT_EQ(processes_with(sleeping), 4);
  ::kill(launcher.pid(), SIGKILL);
  launcher.wait();
  const auto deadline = std::chrono::steady_clock::now() + 5s;
  while (processes_with(marker) > 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(50ms);
  }
  // Neither the ranks nor the nodes' inits and braid-runs, whose command lines hold it too.
  EXPECT_EQ(processes_with(marker), 0);
  // Nor did anything of it ever show in this machine's network namespace.
  std::ifstream dev("/proc/net/dev");
  const std::string interfaces((std::istreambuf_iterator<char>(dev)),
                               std::istreambuf_iterator<char>());
  EXPECT_THAT(interfaces, ::testing::Not(HasSubstr("braid0")));
}

// The survivors' "rank R saw: ..." lines, by rank.
std::map<int, std::string> what_survivors_saw(const std::string& out) {
  static const std::regex line(R"(rank (\d+) saw: ([^\n]*))");
  std::map<int, std::string> saw;
  for (std::sregex_iterator it(out.begin(), out.end(), line), end; it != end; ++it) {
    saw[std::stoi((*it)[1])] = (*it)[2];
  }
  return saw;
}

// Node 1 lost whole (its braid-run and every rank killed at once) in the middle of an
// all-reduce: node 0's ranks fail at once, naming the node and its ranks.
TEST(EmulatedNodes, AWholeNodeLostFailsEverySurvivorNamingTheNodeAndItsRanks) {
  SKIP_WITHOUT_NAMESPACES();
  auto result = ChildProcess({braid_run(), "--emulate-nodes", "2", "-n", "2", "--grace", "1",
                              "--timeout", "100", probe(), "die_node", "1"},
                             {}, 120s)
                    .wait();
  EXPECT_NE(result.status, 0);
  const auto saw = what_survivors_saw(result.err);
  ASSERT_EQ(saw.size(), 2U) << result.out << result.err;
  for (const auto& [rank, what] : saw) {
    EXPECT_LT(rank, 2) << what;
    EXPECT_THAT(what, HasSubstr("peer failed")) << what;
    EXPECT_THAT(what, HasSubstr("it ran on node 1 (node1), with ranks 2-3")) << what;
  }
  // Well within BRAID_TIMEOUT (300 s): the failure is noticed, not waited out.
  EXPECT_LT(result.elapsed, 30s) << result.err;
}

// Node 1's link goes down in the middle of all-reduces: nothing tells either side, and
// TCP alone would retransmit for minutes; BRAID_NETWORK_TIMEOUT (2 s here) bounds it, and
// each side fails naming the other's node.
TEST(EmulatedNodes, ALinkCutMidCollectiveFailsBothSidesWithinTheNetworkTimeout) {
  SKIP_WITHOUT_NAMESPACES();
  ChildProcess job({braid_run(), "--emulate-nodes", "2", "-n", "1", "--grace", "1", "--timeout",
                    "100", probe(), "until_failure"},
                   {{"BRAID_NETWORK_TIMEOUT", "2"}}, 120s);
  job.read_until("looping", 2);
  // The switch lives in braid-run's own network namespace.
  const auto cut = std::chrono::steady_clock::now();
  auto down = ChildProcess({"/usr/bin/nsenter", fmt::format("--net=/proc/{}/ns/net", job.pid()),
                            "/usr/sbin/ip", "link", "set", "n1", "down"})
                  .wait();
  ASSERT_EQ(down.status, 0) << down.err;
  const auto result = job.wait();
  const auto after_cut = std::chrono::steady_clock::now() - cut;
  const auto saw = what_survivors_saw(result.err);
  ASSERT_EQ(saw.size(), 2U) << result.out << result.err;
  EXPECT_THAT(saw.at(0), HasSubstr("it ran on node 1 (node1), with rank 1"));
  EXPECT_THAT(saw.at(1), HasSubstr("it ran on node 0 (node0), with rank 0"));
  EXPECT_LT(after_cut, 20s) << result.err;
}

// A node whose program never joins: the others' join fails when BRAID_TIMEOUT ends it,
// naming the ranks and their node.
TEST(EmulatedNodes, ANodeThatNeverArrivesIsNamedWhenTheJoinTimesOut) {
  SKIP_WITHOUT_NAMESPACES();
  const std::string program = fmt::format(
      "if [ \"$BRAID_NODE_RANK\" = 1 ]; then exec sleep 60; else exec {} check; fi", probe());
  auto result = ChildProcess({braid_run(), "--emulate-nodes", "2", "-n", "2", "--grace", "1",
                              "--timeout", "100", "/bin/sh", "-c", program},
                             {{"BRAID_TIMEOUT", "3"}}, 120s)
                    .wait();
  EXPECT_NE(result.status, 0);
  EXPECT_THAT(result.err, HasSubstr("ranks 2-3 of 4 (node 1's, by the launchers' numbering) "
                                    "never joined"))
      << result.out << result.err;
  EXPECT_LT(result.elapsed, 30s) << result.err;
}

// braid-bench across shaped links: the rows say how much of the link braid used, which no
// algorithm can take past the rate.
TEST(EmulatedNodes, BraidBenchGivesTheShareOfTheLinkAnAllReduceUsed) {
  SKIP_WITHOUT_NAMESPACES();
  auto result = ChildProcess({program_from_env("BRAID_BENCH"), "collectives", "--ranks", "2",
                              "--emulate-nodes", "2", "--link-rate", "1gbit", "--no-peers", "--ops",
                              "all_reduce", "--min-bytes", "1M", "--max-bytes", "1M", "--iters",
                              "5", "--json"},
                             {}, 150s)
                    .wait();
  ASSERT_EQ(result.status, 0) << result.out << result.err;
  static const std::regex share(R"("emulated_nodes":2,"link_share":([0-9.]+))");
  std::smatch match;
  ASSERT_TRUE(std::regex_search(result.out, match, share)) << result.out;
  const double used = std::stod(match[1]);
  EXPECT_GT(used, 0.05) << result.out;
  EXPECT_LT(used, 1.05) << result.out;  // tbf's burst lets a little past the rate
  EXPECT_THAT(result.out, HasSubstr(R"("wrong":0)"));
}

TEST(EmulatedNodes, EachNodeHasItsOwnHostnameAddressAndProcesses) {
  SKIP_WITHOUT_NAMESPACES();
  auto result = ChildProcess({braid_run(), "--emulate-nodes", "3", "-n", "1", "/bin/sh", "-c",
                              "echo $(hostname) $(ip -4 -o addr show eth0 | awk '{print $4}') "
                              "$(ls /proc | grep -c '^[0-9]')"},
                             {}, 60s)
                    .wait();
  ASSERT_EQ(result.status, 0) << result.out << result.err;
  // A node's processes: its init, its braid-run, the shell and what it runs (at most 4).
  for (int node = 0; node < 3; ++node) {
    EXPECT_THAT(result.out,
                ::testing::ContainsRegex(fmt::format(R"(\[{}\] node{} 198\.18\.0\.{}/15 [2-6]\b)",
                                                     node, node, node + 1)))
        << result.err;
  }
}

// --on-first-node: one program on node 0 starts commands on the others through the
// nodes' launch agent, as mpirun does through ssh; each command runs in its node and
// returns its output and exit status; the job ends with the program, with its status.
TEST(EmulatedNodes, AProgramOnTheFirstNodeRunsCommandsOnTheOthersThroughTheLaunchAgent) {
  SKIP_WITHOUT_NAMESPACES();
  const std::string agent = braid_run() + " --on-node";
  const std::string script = fmt::format(
      "echo first on $(hostname); {0} node1 'echo then on $(hostname) >&2'; "
      "{0} 198.18.0.3 'hostname; exit 3'; echo status $?; "
      "BRAID_TOKEN=forged {0} node1 true; echo forged $?; "
      "echo agent $OMPI_MCA_plm_rsh_agent; exit 7",
      agent);
  auto result = ChildProcess({braid_run(), "--emulate-nodes", "3", "--on-first-node", "--timeout",
                              "60", "/bin/sh", "-c", script},
                             {}, 90s)
                    .wait();
  EXPECT_EQ(result.status, 7) << result.out << result.err;
  EXPECT_THAT(result.out, HasSubstr("first on node0\nnode2\nstatus 3\nforged 255\n"));
  EXPECT_THAT(result.out, HasSubstr("agent " + agent));
  EXPECT_THAT(result.err, HasSubstr("then on node1"));
  EXPECT_THAT(result.err, HasSubstr("refused a wrong BRAID_TOKEN"));
}

// A command run through the agent ends with its caller: a caller killed mid-command takes
// the command with it, on its node, whether or not the command still holds its output.
TEST(EmulatedNodes, ACommandStartedThroughTheAgentEndsWithItsCaller) {
  SKIP_WITHOUT_NAMESPACES();
  const std::string script = fmt::format(
      "{0} --on-node node1 'sleep 1000' & first=$!; "
      "{0} --on-node node1 'exec >/dev/null 2>&1; sleep 1001' & second=$!; "
      "sleep 1; kill $first $second; sleep 1; "
      "{0} --on-node node1 'pgrep -x sleep || echo no sleep left'",
      braid_run());
  auto result = ChildProcess({braid_run(), "--emulate-nodes", "2", "--on-first-node", "--timeout",
                              "60", "/bin/sh", "-c", script},
                             {}, 90s)
                    .wait();
  EXPECT_EQ(result.status, 0) << result.out << result.err;
  EXPECT_THAT(result.out, HasSubstr("no sleep left"));
}

}  // namespace
}  // namespace braid
