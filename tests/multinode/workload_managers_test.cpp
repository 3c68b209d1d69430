// The workload managers users launch with, met for real on nodes emulated on this machine:
// a Slurm cluster (munged, slurmctld, a slurmd per node; tools/emulated-slurm) running
// srun and sbatch jobs with no braid variables exported, braid-run started once per node
// by srun, OpenMPI's mpirun across the nodes, torchrun on every node, and the pods of the
// shipped Kubernetes manifests. The same binary, started by each, finds the same ranks.
// Needs root (CI runs as root) and Debian's slurmd, slurmctld, slurm-client and munge;
// each test skips itself, saying why, where these are missing.
//
// Programs come from the build through the environment: EMULATED_SLURM, BRAID_RUN,
// RANK_PROBE (tests/transport/rank_probe.cpp), TRAIN_3D, TORCH_PYTHON (may be empty),
// SOURCE_ROOT.
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "../support/child_process.hpp"

namespace braid {
namespace {

using braid::testing::ChildProcess;
using braid::testing::Outcome;
using braid::testing::program_from_env;
using ::testing::HasSubstr;
using namespace std::chrono_literals;

namespace fs = std::filesystem;

std::string emulated_slurm() {
  return program_from_env("EMULATED_SLURM");
}
std::string braid_run() {
  return program_from_env("BRAID_RUN");
}
std::string rank_probe() {
  return program_from_env("RANK_PROBE");
}
std::string train_3d() {
  return program_from_env("TRAIN_3D");
}
fs::path source_root() {
  return program_from_env("SOURCE_ROOT");
}
// The Python with torch (torchrun is its torch.distributed.run); empty in a build without.
std::string torch_python() {
  const char* python = std::getenv("TORCH_PYTHON");
  return python != nullptr ? python : "";
}

bool can_make_namespaces() {
  return ChildProcess({"/usr/bin/unshare", "--net", "--ipc", "--uts", "--mount", "--pid", "--fork",
                       "/bin/true"})
             .wait()
             .status == 0;
}

bool installed(const std::string& program) {
  return ChildProcess({"/bin/sh", "-c", "command -v " + program}).wait().status == 0;
}

#define SKIP_WITHOUT_NAMESPACES()                                                          \
  if (!can_make_namespaces()) {                                                            \
    GTEST_SKIP() << "this machine does not let the test make namespaces (run it as root)"; \
  }

#define SKIP_WITHOUT_SLURM()                                                                 \
  SKIP_WITHOUT_NAMESPACES();                                                                 \
  if (!installed("slurmd") || !installed("slurmctld") || !installed("munged")) {             \
    GTEST_SKIP() << "Slurm is not installed (apt-get install slurmd slurmctld slurm-client " \
                    "munge; tools/dev does)";                                                \
  }

#define SKIP_WITHOUT_MPIRUN()                                                                 \
  SKIP_WITHOUT_NAMESPACES();                                                                  \
  if (!installed("mpirun")) {                                                                 \
    GTEST_SKIP() << "OpenMPI is not installed (apt-get install openmpi-bin; tools/dev does)"; \
  }

#define SKIP_WITHOUT_TORCHRUN() \
  SKIP_WITHOUT_NAMESPACES();    \
  if (torch_python().empty()) GTEST_SKIP() << "this build has no PyTorch: no torchrun";

// Each rank's place as rank_probe's `env` prints it, less what differs by launcher (the
// store's address and token, the convention's name, OMP_NUM_THREADS): sorted, one per rank.
std::vector<std::string> places(const std::string& out) {
  static const std::regex line(
      R"(rank=(\d+) world=(\d+) local_rank=(\d+) local_world=(\d+) node=(\d+) nodes=(\d+) )");
  std::vector<std::string> found;
  for (std::sregex_iterator it(out.begin(), out.end(), line), end; it != end; ++it) {
    found.push_back(fmt::format("rank {} of {}, local rank {} of {}, node {} of {}", (*it)[1].str(),
                                (*it)[2].str(), (*it)[3].str(), (*it)[4].str(), (*it)[5].str(),
                                (*it)[6].str()));
  }
  std::sort(found.begin(), found.end());
  return found;
}

// The places 2 nodes of 2 ranks each must give: blocks of two, node by node.
std::vector<std::string> two_by_two() {
  std::vector<std::string> expected;
  for (int rank = 0; rank < 4; ++rank) {
    expected.push_back(
        fmt::format("rank {} of 4, local rank {} of 2, node {} of 2", rank, rank % 2, rank / 2));
  }
  return expected;
}

// A shell command line, each word quoted, for sh -c and for braid-run --on-node (which,
// as ssh does, runs one command line through /bin/sh).
std::string shell_line(const std::vector<std::string>& words) {
  std::string line;
  for (const std::string& word : words) {
    std::string quoted = "'";
    for (char c : word) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
    line += (line.empty() ? "" : " ") + quoted + "'";
  }
  return line;
}

// Runs on 2 emulated nodes what a per-node launcher (torchrun, a Kubernetes pod) runs:
// `command_on(node)`, on every node at once, through the nodes' launch agents. Succeeds
// when every node's command does.
Outcome on_every_node(const std::function<std::string(int node)>& command_on) {
  std::string script = "set -u; pids=''; ";
  for (int node = 0; node < 2; ++node) {
    script += fmt::format(
        "{} & pids=\"$pids $!\"; ",
        shell_line({braid_run(), "--on-node", fmt::format("node{}", node), command_on(node)}));
  }
  script += "status=0; for p in $pids; do wait $p || status=1; done; exit $status";
  return ChildProcess({braid_run(), "--emulate-nodes", "2", "--on-first-node", "--timeout", "200",
                       "/bin/sh", "-c", script},
                      {}, 240s)
      .wait();
}

// train_3d's last words on rank 0: its loss falls from ~4.2 (log 64) towards zero.
void expect_trained(const Outcome& result) {
  static const std::regex step(R"(step +(\d+)/(\d+) +loss ([0-9.]+))");
  std::vector<double> losses;
  for (std::sregex_iterator it(result.out.begin(), result.out.end(), step), end; it != end; ++it) {
    losses.push_back(std::stod((*it)[3]));
  }
  ASSERT_GE(losses.size(), 2U) << result.out << result.err;
  EXPECT_LT(losses.back(), losses.front()) << result.out;
  EXPECT_THAT(result.out, HasSubstr("4 ranks, grid tp=2 cp=1 dp=1 pp=2")) << result.out;
  EXPECT_THAT(result.out, HasSubstr("parameters: sum of squares")) << result.out;
}

TEST(Slurm, SrunStartsTheRanksWithNoBraidVariablesExported) {
  SKIP_WITHOUT_SLURM();
  auto result =
      ChildProcess({emulated_slurm(), "--timeout", "200", "srun", "-N", "2", "--ntasks-per-node",
                    "2", train_3d(), "--tp", "2", "--pp", "2", "--steps", "8"},
                   {}, 240s)
          .wait();
  ASSERT_EQ(result.status, 0) << result.out << result.err;
  expect_trained(result);
  // Rank 0 says where it stands: Slurm's variables, the store on the step's first node.
  EXPECT_THAT(result.err, HasSubstr("launch environment: slurm: rank 0 of 4")) << result.err;
  EXPECT_THAT(result.err, HasSubstr("store node0:2")) << result.err;
}

// Both shipped batch scripts: srun starting every rank, and srun starting one braid-run
// per node.
TEST(Slurm, SbatchOfEachShippedScriptTrains) {
  SKIP_WITHOUT_SLURM();
  for (const char* script : {"train_3d.sbatch", "braid-run-per-node.sbatch"}) {
    SCOPED_TRACE(script);
    const fs::path out =
        fs::temp_directory_path() / fmt::format("braid-sbatch-{}-{}.out", ::getpid(), script);
    const std::string submit =
        shell_line({"sbatch", "--wait", "--output", out.string(), "--chdir", source_root().string(),
                    (source_root() / "examples/slurm" / script).string()});
    auto result =
        ChildProcess(
            {emulated_slurm(), "--timeout", "200", "/bin/sh", "-c", submit},
            {{"BUILD_DIR", fs::path(train_3d()).parent_path().parent_path()}, {"STEPS", "8"}}, 240s)
            .wait();
    std::ifstream file(out);
    std::stringstream job_output;
    job_output << file.rdbuf();
    fs::remove(out);
    ASSERT_EQ(result.status, 0) << result.out << result.err << job_output.str();
    expect_trained({.status = 0, .out = job_output.str(), .err = ""});
  }
}

TEST(Slurm, BraidRunStartedOncePerNodeBySrunStartsEachNodesRanks) {
  SKIP_WITHOUT_SLURM();
  auto result = ChildProcess({emulated_slurm(), "--timeout", "200", "srun", "-N", "2",
                              "--ntasks-per-node", "1", braid_run(), "-n", "2", "--no-prefix",
                              train_3d(), "--tp", "2", "--pp", "2", "--steps", "8"},
                             {}, 240s)
                    .wait();
  ASSERT_EQ(result.status, 0) << result.out << result.err;
  expect_trained(result);
  EXPECT_THAT(result.err, HasSubstr("braid-run: node 1 of 2, 2 rank(s) each, from srun's step"))
      << result.err;
}

// mpirun across the 2 emulated nodes, 2 ranks on each, reaching node1 through braid-run's
// launch agent as through ssh. OpenMPI names no store, so the job says where it is.
Outcome by_mpirun(const std::vector<std::string>& program) {
  std::vector<std::string> argv{
      braid_run(), "--emulate-nodes",        "2",  "--on-first-node", "--timeout", "150",
      "mpirun",    "--allow-run-as-root",    "-H", "node0:2,node1:2", "-np",       "4",
      "-x",        "BRAID_STORE=node0:29400"};
  argv.insert(argv.end(), program.begin(), program.end());
  return ChildProcess(argv, {}, 180s).wait();
}

// torchrun on each of the 2 emulated nodes, 2 ranks each, its store on node0:29400.
Outcome by_torchrun(const std::vector<std::string>& program) {
  return on_every_node([&](int node) {
    std::vector<std::string> words{torch_python(),
                                   "-m",
                                   "torch.distributed.run",
                                   "--nnodes",
                                   "2",
                                   "--nproc-per-node",
                                   "2",
                                   "--node-rank",
                                   std::to_string(node),
                                   "--master-addr",
                                   "node0",
                                   "--master-port",
                                   "29400",
                                   "--no-python"};
    words.insert(words.end(), program.begin(), program.end());
    return shell_line(words);
  });
}

// The same binary under each launcher, on 2 nodes of 2 ranks, finds the same ranks in the
// same places, whichever launcher's variables it read.
TEST(SameRanks, UnderBraidRun) {
  SKIP_WITHOUT_NAMESPACES();
  auto result = ChildProcess({braid_run(), "--emulate-nodes", "2", "-n", "2", "--timeout", "100",
                              rank_probe(), "env"},
                             {}, 120s)
                    .wait();
  ASSERT_EQ(result.status, 0) << result.out << result.err;
  EXPECT_EQ(places(result.out), two_by_two()) << result.out;
  EXPECT_THAT(result.out, HasSubstr("source=braid"));
}

TEST(SameRanks, UnderSrun) {
  SKIP_WITHOUT_SLURM();
  auto result = ChildProcess({emulated_slurm(), "--timeout", "100", "srun", "-N", "2",
                              "--ntasks-per-node", "2", rank_probe(), "env"},
                             {}, 120s)
                    .wait();
  ASSERT_EQ(result.status, 0) << result.out << result.err;
  EXPECT_EQ(places(result.out), two_by_two()) << result.out;
  EXPECT_THAT(result.out, HasSubstr("source=slurm"));
}

TEST(SameRanks, UnderMpirun) {
  SKIP_WITHOUT_MPIRUN();
  auto result = by_mpirun({rank_probe(), "env"});
  ASSERT_EQ(result.status, 0) << result.out << result.err;
  EXPECT_EQ(places(result.out), two_by_two()) << result.out;
  EXPECT_THAT(result.out, HasSubstr("source=openmpi"));
}

TEST(SameRanks, UnderTorchrun) {
  SKIP_WITHOUT_TORCHRUN();
  auto result = by_torchrun({rank_probe(), "env"});
  ASSERT_EQ(result.status, 0) << result.out << result.err;
  EXPECT_EQ(places(result.out), two_by_two()) << result.out;
  EXPECT_THAT(result.out, HasSubstr("source=torchrun"));
}

// Kubeflow's pods: braid-run reads the PET_* variables torchrun would.
TEST(SameRanks, UnderBraidRunReadingKubeflowsVariables) {
  SKIP_WITHOUT_NAMESPACES();
  auto result = on_every_node([](int node) {
    return shell_line({"env", "PET_NNODES=2", "PET_NPROC_PER_NODE=2",
                       fmt::format("PET_NODE_RANK={}", node), "PET_MASTER_ADDR=node0",
                       "PET_MASTER_PORT=29500", braid_run(), "--no-prefix", rank_probe(), "env"});
  });
  ASSERT_EQ(result.status, 0) << result.out << result.err;
  EXPECT_EQ(places(result.out), two_by_two()) << result.out;
}

// Ranks joined into one world by launchers that name the store differently: mpirun not at
// all (the job passes BRAID_STORE), torchrun by its own store's address (braid's is on the
// port after it).
TEST(Launchers, MpirunAcrossNodesTrains) {
  SKIP_WITHOUT_MPIRUN();
  auto result = by_mpirun({train_3d(), "--tp", "2", "--pp", "2", "--steps", "6"});
  ASSERT_EQ(result.status, 0) << result.out << result.err;
  expect_trained(result);
  EXPECT_THAT(result.err, HasSubstr("launch environment: openmpi: rank 0 of 4")) << result.err;
  EXPECT_THAT(result.err, HasSubstr("store node0:29400 (BRAID_STORE)")) << result.err;
}

TEST(Launchers, TorchrunAcrossNodesTrains) {
  SKIP_WITHOUT_TORCHRUN();
  auto result = by_torchrun({train_3d(), "--tp", "2", "--pp", "2", "--steps", "6"});
  ASSERT_EQ(result.status, 0) << result.out << result.err;
  expect_trained(result);
  EXPECT_THAT(result.err, HasSubstr("launch environment: torchrun: rank 0 of 4")) << result.err;
  EXPECT_THAT(result.err, HasSubstr("store node0:29401")) << result.err;
}

// The `command:` of a shipped manifest, a flow sequence of quoted words.
std::vector<std::string> manifest_command(const fs::path& manifest) {
  std::ifstream file(manifest);
  std::string line;
  static const std::regex command(R"(^\s*command:\s*\[(.*)\]\s*$)");
  static const std::regex word(R"re("([^"]*)")re");
  while (std::getline(file, line)) {
    std::smatch match;
    if (!std::regex_match(line, match, command)) continue;
    const std::string list = match[1];
    std::vector<std::string> words;
    for (std::sregex_iterator it(list.begin(), list.end(), word), end; it != end; ++it) {
      words.push_back((*it)[1]);
    }
    return words;
  }
  ADD_FAILURE() << manifest << " has no command: [...] line";
  return {};
}

// Each manifest's command, with the binaries on PATH as in the image, on 2 nodes whose
// environment is what its operator sets on each pod (the service names replaced by the
// emulated nodes' names).
TEST(Kubernetes, EachShippedManifestsCommandTrainsUnderItsOperatorsEnvironment) {
  SKIP_WITHOUT_SLURM();
  const std::string path =
      fmt::format("{}:{}:/usr/bin:/bin", fs::path(braid_run()).parent_path().string(),
                  fs::path(train_3d()).parent_path().string());
  struct Pods {
    const char* manifest;
    std::function<std::vector<std::string>(int node)> env;
  };
  const std::vector<Pods> operators = {
      {"examples/kubernetes/trainjob.yaml",
       [](int node) {
         return std::vector<std::string>{"PET_NNODES=2", "PET_NPROC_PER_NODE=2",
                                         fmt::format("PET_NODE_RANK={}", node),
                                         "PET_MASTER_ADDR=node0", "PET_MASTER_PORT=29500"};
       }},
      // The Training Operator's PyTorchJob with nprocPerNode: PET_* for torchrun, the
      // master's service in PET_MASTER_* and MASTER_*, and the pod's RANK and WORLD_SIZE.
      {"examples/kubernetes/pytorchjob.yaml",
       [](int node) {
         return std::vector<std::string>{"PET_NNODES=2",
                                         "PET_NPROC_PER_NODE=2",
                                         fmt::format("PET_NODE_RANK={}", node),
                                         "PET_MASTER_ADDR=node0",
                                         "PET_MASTER_PORT=23456",
                                         "MASTER_ADDR=node0",
                                         "MASTER_PORT=23456",
                                         fmt::format("RANK={}", node),
                                         "WORLD_SIZE=4"};
       }},
  };
  for (const Pods& pods : operators) {
    SCOPED_TRACE(pods.manifest);
    const std::vector<std::string> command = manifest_command(source_root() / pods.manifest);
    ASSERT_FALSE(command.empty());
    auto result = on_every_node([&](int node) {
      std::vector<std::string> words{"env", "PATH=" + path, "BRAID_TOKEN=manifest-test"};
      for (const std::string& variable : pods.env(node)) words.push_back(variable);
      words.insert(words.end(), command.begin(), command.end());
      return shell_line(words);
    });
    ASSERT_EQ(result.status, 0) << result.out << result.err;
    expect_trained(result);
  }
}

}  // namespace
}  // namespace braid
