// braid-run end to end: the built launcher (BRAID_RUN) starts rank_probe (RANK_PROBE),
// whose arguments script what each rank does; see rank_probe.cpp.
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <filesystem>
#include <map>
#include <netinet/in.h>
#include <poll.h>
#include <set>
#include <spawn.h>
#include <sstream>
#include <string>
#include <sys/socket.h>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "../support/child_process.hpp"

using ::testing::HasSubstr;
using ::testing::Not;

namespace {

using braid::testing::ChildProcess;
using braid::testing::Env;
using braid::testing::Outcome;
using Clock = std::chrono::steady_clock;

std::string braid_run() {
  return braid::testing::program_from_env("BRAID_RUN");
}
std::string probe() {
  return braid::testing::program_from_env("RANK_PROBE");
}

// braid-run as a child of the test (see tests/support/child_process.hpp).
class Launch : public ChildProcess {
 public:
  explicit Launch(std::vector<std::string> args, const Env& extra_env = {})
      : ChildProcess(with_braid_run(std::move(args)), extra_env) {}

 private:
  static std::vector<std::string> with_braid_run(std::vector<std::string> args) {
    args.insert(args.begin(), braid_run());
    return args;
  }
};

Outcome run(std::vector<std::string> args, const Env& env = {}) {
  return Launch(std::move(args), env).wait();
}

// A TCP port free a moment ago, for a two-node job's store on this machine.
std::string free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof address;
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
    ADD_FAILURE() << "no free port: " << std::strerror(errno);
  }
  ::close(fd);
  return std::to_string(ntohs(address.sin_port));
}

// Every braid-run of a job of several nodes meets the others in the store node 0's serves:
// runs `args` with the job's other node's braid-run (`other`, `other_env`) beside it, and
// returns the outcome of the first; the other must succeed too.
Outcome run_with_other_node(std::vector<std::string> args, const Env& env,
                            std::vector<std::string> other, const Env& other_env) {
  Launch beside(std::move(other), other_env);
  Outcome result = run(std::move(args), env);
  const Outcome theirs = beside.wait();
  EXPECT_EQ(theirs.status, 0) << theirs.err;
  return result;
}

// "[1] rank=1 world=3 ..." -> {"prefix": "[1]", "rank": "1", "world": "3", ...}
std::vector<std::map<std::string, std::string>> env_lines(const std::string& out) {
  std::vector<std::map<std::string, std::string>> lines;
  std::istringstream in(out);
  for (std::string line; std::getline(in, line);) {
    std::istringstream words(line);
    std::map<std::string, std::string> fields;
    for (std::string word; words >> word;) {
      auto eq = word.find('=');
      if (eq == std::string::npos) {
        fields["prefix"] = word;
      } else {
        fields[word.substr(0, eq)] = word.substr(eq + 1);
      }
    }
    if (fields.contains("rank")) lines.push_back(fields);
  }
  return lines;
}

TEST(BraidRun, EveryRankSeesItsOwnRankAndTheSameStoreAndToken) {
  auto result = run({"-n", "3", probe(), "env"});
  ASSERT_EQ(result.status, 0) << result.err;
  auto lines = env_lines(result.out);
  ASSERT_EQ(lines.size(), 3u) << result.out;
  std::set<std::string> ranks;
  for (const auto& line : lines) {
    ranks.insert(line.at("rank"));
    EXPECT_EQ(line.at("prefix"), "[" + line.at("rank") + "]");
    EXPECT_EQ(line.at("local_rank"), line.at("rank"));
    EXPECT_EQ(line.at("world"), "3");
    EXPECT_EQ(line.at("local_world"), "3");
    EXPECT_EQ(line.at("node"), "0");
    EXPECT_EQ(line.at("nodes"), "1");
    EXPECT_EQ(line.at("source"), "braid");
    EXPECT_EQ(line.at("store"), lines[0].at("store"));
    EXPECT_EQ(line.at("token"), lines[0].at("token"));
  }
  EXPECT_EQ(ranks, (std::set<std::string>{"0", "1", "2"}));
  EXPECT_THAT(lines[0].at("store"), ::testing::StartsWith("127.0.0.1:"));
  EXPECT_NE(lines[0].at("store"), "127.0.0.1:0");
  EXPECT_EQ(lines[0].at("token").size(), 32u);

  // A fresh job gets a fresh token.
  auto again = env_lines(run({"-n", "1", probe(), "env"}).out);
  ASSERT_EQ(again.size(), 1u);
  EXPECT_NE(again[0].at("token"), lines[0].at("token"));
}

TEST(BraidRun, PassesBraidTokenThrough) {
  auto lines = env_lines(run({"-n", "2", probe(), "env"}, {{"BRAID_TOKEN", "shared-secret"}}).out);
  ASSERT_EQ(lines.size(), 2u);
  for (const auto& line : lines) EXPECT_EQ(line.at("token"), "shared-secret");
}

// As torchrun does: ranks sharing a node would otherwise each start OpenMP and BLAS pools
// as wide as the machine.
TEST(BraidRun, SeveralRanksOnANodeGetOneOpenMpThreadUnlessTheUserChoseACount) {
  auto several = env_lines(run({"-n", "2", probe(), "env"}).out);
  ASSERT_EQ(several.size(), 2u);
  for (const auto& line : several) EXPECT_EQ(line.at("omp_threads"), "1");

  auto chosen = env_lines(run({"-n", "2", probe(), "env"}, {{"OMP_NUM_THREADS", "3"}}).out);
  ASSERT_EQ(chosen.size(), 2u);
  for (const auto& line : chosen) EXPECT_EQ(line.at("omp_threads"), "3");

  auto alone = env_lines(run({"-n", "1", probe(), "env"}).out);
  ASSERT_EQ(alone.size(), 1u);
  EXPECT_EQ(alone[0].at("omp_threads"), "unset");
}

TEST(BraidRun, MultiNodeFlagsOffsetRanksByNode) {
  const std::string port = free_port();
  auto result = run_with_other_node({"--nnodes", "2", "--node-rank=1", "--master-addr", "127.0.0.1",
                                     "--master-port", port, "--nproc_per_node=2", probe(), "env"},
                                    {{"BRAID_TOKEN", "t"}},
                                    {"--nnodes", "2", "--node-rank=0", "--master-addr", "127.0.0.1",
                                     "--master-port", port, "--nproc_per_node=2", probe(), "env"},
                                    {{"BRAID_TOKEN", "t"}});
  ASSERT_EQ(result.status, 0) << result.err;
  auto lines = env_lines(result.out);
  ASSERT_EQ(lines.size(), 2u);
  std::set<std::pair<std::string, std::string>> ranks;
  for (const auto& line : lines) {
    ranks.emplace(line.at("rank"), line.at("local_rank"));
    EXPECT_EQ(line.at("world"), "4");
    EXPECT_EQ(line.at("local_world"), "2");
    EXPECT_EQ(line.at("node"), "1");
    EXPECT_EQ(line.at("nodes"), "2");
    EXPECT_EQ(line.at("store"), "127.0.0.1:" + port);
  }
  EXPECT_EQ(ranks, (std::set<std::pair<std::string, std::string>>{{"2", "0"}, {"3", "1"}}));
}

TEST(BraidRun, MultiNodeWithoutATokenWarns) {
  const std::string port = free_port();
  auto result = run_with_other_node({"--nnodes", "2", "--master-addr", "127.0.0.1", "--master-port",
                                     port, "-n", "1", probe(), "env"},
                                    {},
                                    {"--nnodes", "2", "--node-rank", "1", "--master-addr",
                                     "127.0.0.1", "--master-port", port, "-n", "1", probe(), "env"},
                                    {});
  EXPECT_EQ(result.status, 0);
  EXPECT_THAT(result.err, HasSubstr("BRAID_TOKEN is not set"));
  auto lines = env_lines(result.out);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0].at("token"), "");
  EXPECT_EQ(lines[0].at("store"), "127.0.0.1:" + port);
}

// A Kubeflow pod's environment: torchrun's flags as PET_* variables, and no flags at all.
TEST(BraidRun, KubeflowsPetVariablesStandForTheFlags) {
  const std::string port = free_port();
  Env pod{{"PET_NNODES", "2"},       {"PET_NPROC_PER_NODE", "2"},
          {"PET_NODE_RANK", "1"},    {"PET_MASTER_ADDR", "127.0.0.1"},
          {"PET_MASTER_PORT", port}, {"BRAID_TOKEN", "t"}};
  Env master_pod = pod;
  master_pod["PET_NODE_RANK"] = "0";
  auto result = run_with_other_node({probe(), "env"}, pod, {probe(), "env"}, master_pod);
  ASSERT_EQ(result.status, 0) << result.err;
  EXPECT_THAT(result.err, HasSubstr("braid-run: node 1 of 2, 2 rank(s) each, from torchrun's "
                                    "PET_* variables (Kubeflow): PET_NNODES=2"));
  auto lines = env_lines(result.out);
  ASSERT_EQ(lines.size(), 2u);
  std::set<std::string> ranks;
  for (const auto& line : lines) {
    ranks.insert(line.at("rank"));
    EXPECT_EQ(line.at("world"), "4");
    EXPECT_EQ(line.at("node"), "1");
    EXPECT_EQ(line.at("store"), "127.0.0.1:" + port);
  }
  EXPECT_EQ(ranks, (std::set<std::string>{"2", "3"}));
}

TEST(BraidRun, AFlagWinsOverItsPetVariable) {
  auto result = run({"-n", "1", probe(), "env"}, {{"PET_NPROC_PER_NODE", "3"}});
  ASSERT_EQ(result.status, 0) << result.err;
  EXPECT_EQ(env_lines(result.out).size(), 1u);
}

// A PyTorchJob names its master pod in MASTER_ADDR/MASTER_PORT rather than PET_*.
TEST(BraidRun, APyTorchJobsMasterAddrNamesTheStore) {
  const std::string port = free_port();
  Env master{{"PET_NNODES", "2"},          {"PET_NPROC_PER_NODE", "1"}, {"PET_NODE_RANK", "0"},
             {"MASTER_ADDR", "localhost"}, {"MASTER_PORT", port},       {"BRAID_TOKEN", "t"}};
  Env worker = master;
  worker["PET_NODE_RANK"] = "1";
  auto result = run_with_other_node({probe(), "env"}, master, {probe(), "env"}, worker);
  ASSERT_EQ(result.status, 0) << result.err;
  auto lines = env_lines(result.out);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0].at("store"), "localhost:" + port);
  EXPECT_EQ(lines[0].at("world"), "2");
}

// srun --ntasks-per-node 1 braid-run: the node's place and the store from srun's variables.
TEST(BraidRun, StartedOncePerNodeBySrunItTakesItsNodeFromSlurm) {
  Env task{{"SLURM_PROCID", "1"},
           {"SLURM_STEP_NUM_TASKS", "2"},
           {"SLURM_STEP_NUM_NODES", "2"},
           {"SLURM_NODEID", "1"},
           {"SLURM_STEP_NODELIST", "localhost,gpu08"},
           {"SLURM_JOB_ID", "1234567"},
           {"BRAID_TOKEN", "t"}};
  Env first_task = task;
  first_task["SLURM_PROCID"] = "0";
  first_task["SLURM_NODEID"] = "0";
  auto result = run_with_other_node({"-n", "2", probe(), "env"}, task, {"-n", "2", probe(), "env"},
                                    first_task);
  ASSERT_EQ(result.status, 0) << result.err;
  EXPECT_THAT(result.err, HasSubstr("braid-run: node 1 of 2, 2 rank(s) each, from srun's step "
                                    "(slurm: rank 1 of 2"));
  auto lines = env_lines(result.out);
  ASSERT_EQ(lines.size(), 2u);
  for (const auto& line : lines) {
    EXPECT_EQ(line.at("node"), "1");
    EXPECT_EQ(line.at("nodes"), "2");
    EXPECT_EQ(line.at("source"), "braid");
    EXPECT_THAT(line.at("store"), ::testing::MatchesRegex("localhost:2[0-9]{4}"));
  }
}

TEST(BraidRun, OutputLinesArePrefixedOnTheirOwnStream) {
  auto result = run({"-n", "2", probe(), "out", "hello", "err", "oops", "partial", "no newline"});
  ASSERT_EQ(result.status, 0) << result.err;
  for (const char* rank : {"[0] ", "[1] "}) {
    EXPECT_THAT(result.out, HasSubstr(std::string(rank) + "hello\n"));
    EXPECT_THAT(result.out, HasSubstr(std::string(rank) + "no newline\n"));
    EXPECT_THAT(result.err, HasSubstr(std::string(rank) + "oops\n"));
  }
  EXPECT_THAT(result.out, Not(HasSubstr("oops")));
  EXPECT_THAT(result.err, Not(HasSubstr("hello")));
}

TEST(BraidRun, NoPrefixPassesOutputThrough) {
  auto result = run({"--no-prefix", "-n", "2", probe(), "out", "hello"});
  ASSERT_EQ(result.status, 0) << result.err;
  EXPECT_EQ(result.out, "hello\nhello\n");
}

TEST(BraidRun, AFailingRankStopsTheOthersAndSetsTheExitStatus) {
  auto result = run({"-n", "2", probe(), "on", "1", "exit", "3", "sleep", "30"});
  EXPECT_EQ(result.status, 3);
  EXPECT_THAT(result.err, HasSubstr("braid-run: rank 1 (pid "));
  EXPECT_THAT(result.err, HasSubstr(") exited with code 3; stopping the other 1 rank(s)"));
  EXPECT_LT(result.elapsed, std::chrono::seconds(10));  // rank 0 did not sleep its 30 s
}

TEST(BraidRun, ARankKilledByASignalIsReportedWithTheSignal) {
  auto result = run({"-n", "2", probe(), "on", "1", "kill", "sleep", "30"});
  EXPECT_EQ(result.status, 128 + SIGKILL);
  EXPECT_THAT(result.err, HasSubstr("rank 1 (pid "));
  EXPECT_THAT(result.err, HasSubstr("was killed by signal 9 (SIGKILL); stopping the other 1"));
}

// A rank's death is what its peers then fail on, and they may notice it (its sockets
// close as it exits) before braid-run reaps it: a death by signal shortly after another
// rank's error is named as the cause, the error beside it.
TEST(BraidRun, ARankKilledJustAfterAnotherFailedIsNamedAsTheCause) {
  auto flag = std::filesystem::path(::testing::TempDir()) /
              ("braid_run_cause_" + std::to_string(::getpid()));
  std::filesystem::remove(flag);
  auto result = run({"-n", "2",        probe(),       "on", "1", "touch", flag.string(), "on",
                     "0",  "wait-for", flag.string(), "on", "0", "exit",  "3",           "on",
                     "1",  "sleep",    "0.05",        "on", "1", "kill",  "sleep",       "30"});
  std::filesystem::remove(flag);
  EXPECT_EQ(result.status, 128 + SIGKILL) << result.err;
  EXPECT_THAT(result.err, HasSubstr("braid-run: rank 1 (pid "));
  EXPECT_THAT(result.err, HasSubstr("was killed by signal 9 (SIGKILL); also rank 0 exited with "
                                    "code 3"));
}

TEST(BraidRun, RanksIgnoringSigtermAreKilledAfterTheGracePeriod) {
  auto flag = std::filesystem::path(::testing::TempDir()) /
              ("braid_run_grace_" + std::to_string(::getpid()));
  std::filesystem::remove(flag);
  auto result = run({"-n", "2",     "--grace",     "0.2", probe(), "ignore-term", "on",
                     "0",  "touch", flag.string(), "on",  "1",     "wait-for",    flag.string(),
                     "on", "1",     "exit",        "5",   "sleep", "30"});
  std::filesystem::remove(flag);
  EXPECT_EQ(result.status, 5);
  EXPECT_THAT(result.err, HasSubstr("rank 0 (pid "));
  EXPECT_THAT(result.err, HasSubstr("did not stop within 0.2 s; sending SIGKILL"));
  EXPECT_LT(result.elapsed, std::chrono::seconds(10));
}

TEST(BraidRun, SigtermToBraidRunStopsEveryRank) {
  Launch launch({"-n", "2", probe(), "ready", "sleep", "30"});
  launch.read_until("ready pid=", 2);
  std::vector<pid_t> pids;
  std::istringstream in(launch.out());
  for (std::string line; std::getline(in, line);) {
    auto at = line.find("ready pid=");
    if (at != std::string::npos) pids.push_back(std::stoi(line.substr(at + 10)));
  }
  ASSERT_EQ(pids.size(), 2u) << launch.out();
  ::kill(launch.pid(), SIGTERM);
  auto result = launch.wait();
  EXPECT_EQ(result.status, 128 + SIGTERM);
  EXPECT_THAT(result.err, HasSubstr("received SIGTERM; forwarding it to 2 rank(s)"));
  // braid-run reaps its ranks before it exits, so they are gone, not zombies.
  for (pid_t pid : pids) {
    EXPECT_EQ(::kill(pid, 0), -1) << "rank pid " << pid << " survived";
    EXPECT_EQ(errno, ESRCH);
  }
}

// A node's braid-run waits for node 0's store (it may start minutes later, up to
// BRAID_TIMEOUT); a Ctrl-C meanwhile ends the wait at once, saying what it waited for.
TEST(BraidRun, ASignalEndsTheWaitForNodeZerosStore) {
  const std::string port = free_port();  // nobody serves it
  Launch launch({"--nnodes", "2", "--node-rank", "1", "--master-addr", "127.0.0.1", "--master-port",
                 port, "-n", "1", probe(), "env"},
                {{"BRAID_TOKEN", "t"}});
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  ::kill(launch.pid(), SIGINT);
  auto result = launch.wait();
  EXPECT_EQ(result.status, 128 + SIGINT);
  EXPECT_THAT(result.err, HasSubstr("stopped by a signal while waiting for the job's store on "
                                    "node 0 (127.0.0.1:" +
                                    port + ")"));
  EXPECT_LT(result.elapsed, std::chrono::seconds(10));
}

TEST(BraidRun, TimeoutStopsTheJob) {
  auto result = run({"--timeout", "0.3", "-n", "2", probe(), "sleep", "30"});
  EXPECT_EQ(result.status, 124);
  EXPECT_THAT(result.err, HasSubstr("the job ran longer than --timeout 0.3 s; stopping 2 rank(s)"));
  EXPECT_LT(result.elapsed, std::chrono::seconds(10));
}

TEST(BraidRun, UsageErrorsExitWithStatusTwo) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases{
      {{}, "say how many ranks to start: -n N"},
      {{"-n", "2"}, "no program to run"},
      {{"-n", "0", probe()}, "-n expects an integer from 1 to 65536, got '0'"},
      {{"-n", "x", probe()}, "got 'x'"},
      {{"-n"}, "-n needs a value"},
      {{"--bogus", "-n", "1", probe()}, "unknown option '--bogus'"},
      {{"--no-prefix=1", "-n", "1", probe()}, "--no-prefix takes no value"},
      {{"--nnodes", "2", "-n", "1", probe()}, "--nnodes 2 needs --master-addr"},
      {{"--nnodes", "2", "--node-rank", "2", "--master-addr", "h", "-n", "1", probe()},
       "--node-rank 2 is not below --nnodes 2"},
      {{"--master-port", "70000", "-n", "1", probe()}, "--master-port expects an integer"},
      {{"--grace", "-1", "-n", "1", probe()}, "--grace='-1' is not a non-negative number"},
      {{"--timeout", "0", "-n", "1", probe()}, "--timeout must be positive"},
      {{"--store", "127.0.0.1:2379", "-n", "1", probe()},
       "--store 127.0.0.1:2379 is not etcd://host:port[,host:port...]/name"},
      {{"--store", "etcd://e0:port/job", "-n", "1", probe()}, "has port 'port'"},
      {{"--nnodes", "3:2", "--master-addr", "h", "-n", "1", probe()},
       "--nnodes expects an integer from 1 to 2, got '3'"},
  };
  for (const auto& [args, message] : cases) {
    auto result = run(args);
    EXPECT_EQ(result.status, 2) << message;
    EXPECT_THAT(result.err, HasSubstr(message));
    EXPECT_THAT(result.err, HasSubstr("braid-run --help"));
  }
}

// Another launcher's variables that cannot be braid-run's flags are usage errors naming them.
TEST(BraidRun, MalformedLauncherVariablesAreUsageErrors) {
  const std::vector<std::pair<Env, std::string>> cases{
      {{{"PET_NPROC_PER_NODE", "x"}}, "PET_NPROC_PER_NODE='x' is not an integer"},
      {{{"PET_NNODES", "4:1"}}, "PET_NNODES='4:1' asks for at least more nodes than at most"},
      {{{"SLURM_PROCID", "0"},
        {"SLURM_STEP_NUM_TASKS", "4"},
        {"SLURM_STEP_NUM_NODES", "2"},
        {"SLURM_NODEID", "0"},
        {"SLURM_STEP_NODELIST", "n[1-2]"},
        {"SLURM_JOB_ID", "7"}},
       "srun started 2 tasks on this node (slurm: rank 0 of 4"},
      {{{"PET_NNODES", "2"}, {"PET_NODE_RANK", "2"}},
       "node rank 2 is not below the 2 node(s) of the job (PET_NNODES=2 PET_NODE_RANK=2)"},
      {{{"PET_NNODES", "2"}, {"PET_NODE_RANK", "1"}},
       "2 node(s) but no address of node 0: set PET_MASTER_ADDR"},
  };
  for (const auto& [env, message] : cases) {
    auto result = run({"-n", "1", probe(), "env"}, env);
    EXPECT_EQ(result.status, 2) << message;
    EXPECT_THAT(result.err, HasSubstr(message));
  }
}

TEST(BraidRun, AProgramThatCannotBeExecutedIsNamed) {
  auto result = run({"-n", "2", "/nonexistent/program", "arg"});
  EXPECT_EQ(result.status, 127);
  EXPECT_THAT(result.err,
              HasSubstr("cannot execute '/nonexistent/program': No such file or directory"));
}

TEST(BraidRun, PrintConfigListsTheKnobs) {
  auto result = run({"--print-config"}, {{"BRAID_TIMEOUT", "17"}});
  EXPECT_EQ(result.status, 0);
  for (const char* knob : {"BRAID_RANK", "BRAID_STORE", "BRAID_TOKEN", "BRAID_TIMEOUT"}) {
    EXPECT_THAT(result.out, HasSubstr(knob));
  }
  EXPECT_THAT(result.out, HasSubstr(" 17 "));
}

// Which launcher's variables a program started here would follow, and what braid-run takes.
TEST(BraidRun, PrintConfigSaysWhichLaunchersVariablesWin) {
  auto result = run({"--print-config"}, {{"SLURM_PROCID", "0"},
                                         {"SLURM_STEP_NUM_TASKS", "2"},
                                         {"SLURM_STEP_NUM_NODES", "2"},
                                         {"SLURM_NODEID", "0"},
                                         {"SLURM_STEP_NODELIST", "n[1-2]"},
                                         {"SLURM_JOB_ID", "7"},
                                         {"SLURM_STEP_ID", "0"},
                                         {"RANK", "0"},
                                         {"WORLD_SIZE", "1"}});
  EXPECT_EQ(result.status, 0) << result.err;
  EXPECT_THAT(result.out, HasSubstr("without braid-run would read: torchrun: rank 0 of 1"));
  EXPECT_THAT(result.out, HasSubstr("slurm also present and disagrees"));
  EXPECT_THAT(result.out, HasSubstr("braid-run takes from the environment: node 0 of 2, 1 "
                                    "rank(s) each, from srun's step (slurm: rank 0 of 2"));
  EXPECT_THAT(result.out, HasSubstr("store n1:2"));
}

// An sbatch script's own process has SLURM_PROCID and SLURM_NTASKS but is no srun step:
// braid-run started there is the job's only launcher.
TEST(BraidRun, InABatchScriptSlurmsVariablesAreNotAStep) {
  auto result = run({"-n", "2", probe(), "env"}, {{"SLURM_PROCID", "0"},
                                                  {"SLURM_NTASKS", "64"},
                                                  {"SLURM_NNODES", "1"},
                                                  {"SLURM_NODEID", "0"},
                                                  {"SLURM_LOCALID", "0"},
                                                  {"SLURM_JOB_ID", "5"}});
  ASSERT_EQ(result.status, 0) << result.err;
  auto lines = env_lines(result.out);
  ASSERT_EQ(lines.size(), 2u);
  for (const auto& line : lines) EXPECT_EQ(line.at("world"), "2");
}

TEST(BraidRun, HelpDescribesEveryOption) {
  auto result = run({"--help"});
  EXPECT_EQ(result.status, 0);
  for (const char* option :
       {"--nproc-per-node", "--nnodes", "--node-rank", "--master-addr", "--master-port", "--grace",
        "--timeout", "--store", "--join-wait", "--no-prefix", "--print-config"}) {
    EXPECT_THAT(result.out, HasSubstr(option));
  }
}

}  // namespace
