#include <arpa/inet.h>
#include <cstdint>
#include <map>
#include <netinet/in.h>
#include <string>
#include <sys/socket.h>
#include <unistd.h>

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <braid/core/error.hpp>
#include <braid/transport/bootstrap.hpp>

using ::testing::HasSubstr;
using ::testing::Not;

namespace braid::transport {
namespace {

using Vars = std::map<std::string, std::string>;

config::EnvLookup env_of(Vars vars) {
  return [vars = std::move(vars)](std::string_view name) -> std::optional<std::string> {
    auto it = vars.find(std::string(name));
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

// The message of the invalid_environment error parsing `vars` throws.
std::string error_for(Vars vars) {
  try {
    parse_launch_env(env_of(std::move(vars)));
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::invalid_environment);
    return e.detail();
  }
  ADD_FAILURE() << "parse_launch_env accepted the environment";
  return "";
}

// A Slurm step's store port as bootstrap.hpp's rule 4 gives it: 20000 + splitmix64's
// finaliser of (SLURM_JOB_ID << 32 ^ SLURM_STEP_ID) % 10000. Written out here rather than
// asked of the library, because every node of a step computes it alone and they must meet:
// a change to the formula has to fail a test, not follow it.
std::uint16_t slurm_step_port(std::uint64_t job, std::uint64_t step) {
  std::uint64_t mix = (job << 32) ^ step;
  mix = (mix ^ (mix >> 30)) * 0xbf58476d1ce4e5b9ULL;
  mix = (mix ^ (mix >> 27)) * 0x94d049bb133111ebULL;
  mix ^= mix >> 31;
  return static_cast<std::uint16_t>(20000 + mix % 10000);
}

void expect_ranks(const LaunchInfo& info, int rank, int world, int local_rank, int local_world,
                  int node_rank, int nodes) {
  EXPECT_EQ(info.rank, rank);
  EXPECT_EQ(info.world_size, world);
  EXPECT_EQ(info.local_rank, local_rank);
  EXPECT_EQ(info.local_world_size, local_world);
  EXPECT_EQ(info.node_rank, node_rank);
  EXPECT_EQ(info.num_nodes, nodes);
}

TEST(Bootstrap, ReadsEveryBraidVariable) {
  auto info = parse_launch_env(env_of({{"BRAID_RANK", "5"},
                                       {"BRAID_WORLD_SIZE", "8"},
                                       {"BRAID_LOCAL_RANK", "1"},
                                       {"BRAID_LOCAL_WORLD_SIZE", "4"},
                                       {"BRAID_NODE_RANK", "1"},
                                       {"BRAID_NNODES", "2"},
                                       {"BRAID_STORE", "node0:1234"},
                                       {"BRAID_TOKEN", "s3cret"}}));
  expect_ranks(info, 5, 8, 1, 4, 1, 2);
  EXPECT_EQ(info.store_host, "node0");
  EXPECT_EQ(info.store_port, 1234);
  EXPECT_EQ(info.token, "s3cret");
  EXPECT_EQ(info.source, "braid");
}

TEST(Bootstrap, ReadsTorchrun) {
  auto info = parse_launch_env(env_of({{"RANK", "3"},
                                       {"WORLD_SIZE", "4"},
                                       {"LOCAL_RANK", "1"},
                                       {"LOCAL_WORLD_SIZE", "2"},
                                       {"GROUP_RANK", "1"},
                                       {"GROUP_WORLD_SIZE", "2"},
                                       {"MASTER_ADDR", "10.0.0.1"},
                                       {"MASTER_PORT", "29400"}}));
  expect_ranks(info, 3, 4, 1, 2, 1, 2);
  EXPECT_EQ(info.store_host, "10.0.0.1");
  EXPECT_EQ(info.store_port, 29400);
  EXPECT_EQ(info.token, "");
  EXPECT_EQ(info.source, "torchrun");
}

TEST(Bootstrap, ReadsOpenMpiAndDerivesNodesFromBlockPlacement) {
  auto info = parse_launch_env(env_of({{"OMPI_COMM_WORLD_RANK", "6"},
                                       {"OMPI_COMM_WORLD_SIZE", "8"},
                                       {"OMPI_COMM_WORLD_LOCAL_RANK", "2"},
                                       {"OMPI_COMM_WORLD_LOCAL_SIZE", "4"},
                                       {"OMPI_COMM_WORLD_NODE_RANK", "2"},
                                       {"MASTER_ADDR", "head"},
                                       {"MASTER_PORT", "29500"}}));
  expect_ranks(info, 6, 8, 2, 4, 1, 2);
  EXPECT_EQ(info.source, "openmpi");
}

TEST(Bootstrap, OpenMpiOnOneNodeServesTheStoreOnLoopback) {
  auto info = parse_launch_env(env_of({{"OMPI_COMM_WORLD_RANK", "1"},
                                       {"OMPI_COMM_WORLD_SIZE", "4"},
                                       {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                                       {"OMPI_COMM_WORLD_LOCAL_SIZE", "4"}}));
  expect_ranks(info, 1, 4, 1, 4, 0, 1);
  EXPECT_EQ(info.store_host, "127.0.0.1");
  EXPECT_EQ(info.store_port, kDefaultStorePort);
}

TEST(Bootstrap, OpenMpiAcrossNodesWithoutAStoreIsAnError) {
  auto message = error_for({{"OMPI_COMM_WORLD_RANK", "1"},
                            {"OMPI_COMM_WORLD_SIZE", "4"},
                            {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                            {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}});
  EXPECT_THAT(message, HasSubstr("openmpi environment spans 2 nodes but names no store"));
  EXPECT_THAT(message, HasSubstr("BRAID_STORE=host:port"));
  EXPECT_THAT(message, HasSubstr("MASTER_ADDR and MASTER_PORT"));
}

TEST(Bootstrap, OpenMpiRoundRobinPlacementCannotYieldANodeRank) {
  // mpirun --map-by node: rank 1 is the first rank of the second node.
  auto message = error_for({{"OMPI_COMM_WORLD_RANK", "1"},
                            {"OMPI_COMM_WORLD_SIZE", "4"},
                            {"OMPI_COMM_WORLD_LOCAL_RANK", "0"},
                            {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"},
                            {"BRAID_STORE", "head:29500"}});
  EXPECT_THAT(message, HasSubstr("cannot derive the node rank: OMPI_COMM_WORLD_RANK=1 with "
                                 "OMPI_COMM_WORLD_LOCAL_RANK=0 and OMPI_COMM_WORLD_LOCAL_SIZE=2"));
  EXPECT_THAT(message, HasSubstr("set the BRAID_* variables"));
}

TEST(Bootstrap, OpenMpiWithUnevenNodesCannotYieldTheNodeCount) {
  auto message = error_for({{"OMPI_COMM_WORLD_RANK", "4"},
                            {"OMPI_COMM_WORLD_SIZE", "6"},
                            {"OMPI_COMM_WORLD_LOCAL_RANK", "0"},
                            {"OMPI_COMM_WORLD_LOCAL_SIZE", "4"}});
  EXPECT_THAT(message, HasSubstr("cannot derive the number of nodes: OMPI_COMM_WORLD_SIZE=6 is "
                                 "not a multiple of OMPI_COMM_WORLD_LOCAL_SIZE=4"));
}

TEST(Bootstrap, ReadsSlurmWithUnevenTasksPerNode) {
  auto info = parse_launch_env(env_of({{"SLURM_PROCID", "9"},
                                       {"SLURM_STEP_NUM_TASKS", "10"},
                                       {"SLURM_LOCALID", "1"},
                                       {"SLURM_NODEID", "2"},
                                       {"SLURM_NNODES", "3"},
                                       {"SLURM_TASKS_PER_NODE", "4(x2),2"},
                                       {"MASTER_ADDR", "n0"},
                                       {"MASTER_PORT", "29500"}}));
  expect_ranks(info, 9, 10, 1, 2, 2, 3);
  EXPECT_EQ(info.source, "slurm");
}

TEST(Bootstrap, SlurmTaskListIsWalkedByNode) {
  Vars vars{{"SLURM_PROCID", "4"},  {"SLURM_STEP_NUM_TASKS", "10"},
            {"SLURM_LOCALID", "0"}, {"SLURM_NODEID", "1"},
            {"SLURM_NNODES", "3"},  {"SLURM_TASKS_PER_NODE", "4(x2),2"},
            {"BRAID_STORE", "n0:1"}};
  EXPECT_EQ(parse_launch_env(env_of(vars)).local_world_size, 4);
  vars["SLURM_TASKS_PER_NODE"] = "3,5,2";
  EXPECT_EQ(parse_launch_env(env_of(vars)).local_world_size, 5);
}

TEST(Bootstrap, SlurmUniformTasksPerNodeNeedsNoNodeId) {
  auto info = parse_launch_env(env_of({{"SLURM_PROCID", "5"},
                                       {"SLURM_STEP_NUM_TASKS", "8"},
                                       {"SLURM_NTASKS_PER_NODE", "4"},
                                       {"BRAID_STORE", "n0:29500"}}));
  expect_ranks(info, 5, 8, 1, 4, 1, 2);
  info = parse_launch_env(env_of({{"SLURM_PROCID", "2"},
                                  {"SLURM_STEP_NUM_TASKS", "4"},
                                  {"SLURM_NNODES", "1"},
                                  {"SLURM_TASKS_PER_NODE", "4"}}));
  expect_ranks(info, 2, 4, 2, 4, 0, 1);
  EXPECT_EQ(info.store_host, "127.0.0.1");
}

TEST(Bootstrap, MalformedSlurmTaskListsAreErrors) {
  Vars vars{{"SLURM_PROCID", "0"}, {"SLURM_STEP_NUM_TASKS", "4"}, {"SLURM_NODEID", "0"}};
  for (const char* list : {"4(x", "4(2)", "x", "4,,2", "4(x2", "0", "4(x2)3", "4,"}) {
    vars["SLURM_TASKS_PER_NODE"] = list;
    EXPECT_THAT(
        error_for(vars),
        HasSubstr(fmt::format("SLURM_TASKS_PER_NODE='{}' is not a Slurm task count list", list)));
  }
  vars["SLURM_TASKS_PER_NODE"] = "2(x2)";
  vars["SLURM_NODEID"] = "2";
  vars["SLURM_PROCID"] = "3";
  EXPECT_THAT(error_for(vars),
              HasSubstr("SLURM_NODEID=2 is beyond the 2 node(s) in SLURM_TASKS_PER_NODE='2(x2)'"));
  vars.erase("SLURM_NODEID");
  vars["SLURM_TASKS_PER_NODE"] = "3,1";
  EXPECT_THAT(error_for(vars),
              HasSubstr("SLURM_TASKS_PER_NODE='3,1' differs between nodes but SLURM_NODEID is "
                        "not set"));
}

TEST(Bootstrap, SlurmAllocationWithoutAStepIsNotALaunch) {
  // salloc shells carry the allocation's SLURM_*, SLURM_PROCID among them, but srun alone
  // starts a step and sets SLURM_STEP_NUM_TASKS.
  EXPECT_THAT(error_for({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "4"}, {"SLURM_NNODES", "1"}}),
              HasSubstr("no launcher environment"));
}

TEST(Bootstrap, AnSbatchScriptsOwnProcessIsNoLauncherEnvironment) {
  // The batch script runs once, on the first node, with the allocation's numbers: read as
  // rank 0 of 64 it would wait at join for 63 ranks nobody starts.
  Vars vars{{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "64"}, {"SLURM_NNODES", "1"},
            {"SLURM_NODEID", "0"}, {"SLURM_LOCALID", "0"}, {"SLURM_JOB_ID", "4242"}};
  EXPECT_THAT(error_for(vars), HasSubstr("no launcher environment"));
  EXPECT_FALSE(parse_slurm_step(env_of(vars)));
  // So a single process runs there as it runs anywhere, and nothing else is reported.
  vars["BRAID_WORLD_SIZE"] = "1";
  auto info = parse_launch_env(env_of(vars));
  EXPECT_EQ(info.source, "braid");
  expect_ranks(info, 0, 1, 0, 1, 0, 1);
  EXPECT_EQ(info.store_port, 0);
  EXPECT_TRUE(info.outranked.empty());
}

TEST(Bootstrap, WithinAStepTheOlderSlurmNamesStandInForUnsetStepNames) {
  Vars vars{{"SLURM_PROCID", "3"}, {"SLURM_STEP_NUM_TASKS", "4"},     {"SLURM_NODEID", "1"},
            {"SLURM_NNODES", "2"}, {"SLURM_TASKS_PER_NODE", "2(x2)"}, {"BRAID_STORE", "h:1"}};
  auto info = parse_launch_env(env_of(vars));
  expect_ranks(info, 3, 4, 1, 2, 1, 2);
  EXPECT_THAT(info.description, HasSubstr("SLURM_TASKS_PER_NODE='2(x2)' gives node 1"));
  EXPECT_THAT(info.description, HasSubstr("SLURM_NNODES=2"));
  // But not for the world size: SLURM_NTASKS may be the allocation's (srun --preserve-env).
  vars["SLURM_NTASKS"] = "16";
  EXPECT_EQ(parse_launch_env(env_of(vars)).world_size, 4);
}

TEST(Bootstrap, ConventionsArePickedInPrecedenceOrder) {
  Vars vars{{"SLURM_PROCID", "0"},
            {"SLURM_STEP_NUM_TASKS", "1"},
            {"OMPI_COMM_WORLD_RANK", "1"},
            {"OMPI_COMM_WORLD_SIZE", "2"},
            {"RANK", "2"},
            {"WORLD_SIZE", "3"},
            {"BRAID_RANK", "3"},
            {"BRAID_WORLD_SIZE", "4"}};
  const std::vector<std::pair<std::string, int>> expected{
      {"braid", 3}, {"torchrun", 2}, {"openmpi", 1}, {"slurm", 0}};
  const std::vector<std::vector<std::string>> drop{
      {"BRAID_RANK", "BRAID_WORLD_SIZE"},
      {"RANK", "WORLD_SIZE"},
      {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"}};
  for (std::size_t i = 0; i < expected.size(); ++i) {
    auto info = parse_launch_env(env_of(vars));
    EXPECT_EQ(info.source, expected[i].first);
    EXPECT_EQ(info.rank, expected[i].second);
    if (i < drop.size()) {
      for (const auto& name : drop[i]) vars.erase(name);
    }
  }
}

TEST(Bootstrap, BraidStoreWinsOverMasterAddr) {
  Vars vars{{"RANK", "0"},
            {"WORLD_SIZE", "2"},
            {"MASTER_ADDR", "a"},
            {"MASTER_PORT", "1"},
            {"BRAID_STORE", "b:2"}};
  auto info = parse_launch_env(env_of(vars));
  EXPECT_EQ(info.store_host, "b");
  EXPECT_EQ(info.store_port, 2);
  vars.erase("BRAID_STORE");
  info = parse_launch_env(env_of(vars));
  EXPECT_EQ(info.store_host, "a");
  EXPECT_EQ(info.store_port, 1);
}

TEST(Bootstrap, ASingleProcessNeedsOnlyTheWorldSize) {
  auto info = parse_launch_env(env_of({{"BRAID_WORLD_SIZE", "1"}}));
  expect_ranks(info, 0, 1, 0, 1, 0, 1);
  EXPECT_EQ(info.store_host, "127.0.0.1");
  EXPECT_EQ(info.store_port, 0);
}

TEST(Bootstrap, DerivesLocalAndNodeRanksFromTheNodeCount) {
  auto info = parse_launch_env(env_of({{"BRAID_RANK", "5"},
                                       {"BRAID_WORLD_SIZE", "8"},
                                       {"BRAID_NNODES", "2"},
                                       {"BRAID_STORE", "h:1"}}));
  expect_ranks(info, 5, 8, 1, 4, 1, 2);
}

TEST(Bootstrap, WithoutNodeInformationTheJobIsOneNode) {
  auto info = parse_launch_env(env_of({{"RANK", "2"}, {"WORLD_SIZE", "3"}}));
  expect_ranks(info, 2, 3, 2, 3, 0, 1);
  EXPECT_EQ(info.store_host, "127.0.0.1");
  EXPECT_EQ(info.store_port, kDefaultStorePort);
}

TEST(Bootstrap, EmptyValuesCountAsUnset) {
  auto info = parse_launch_env(env_of({{"BRAID_WORLD_SIZE", "1"},
                                       {"BRAID_RANK", ""},
                                       {"RANK", ""},
                                       {"BRAID_STORE", " "},
                                       {"MASTER_ADDR", ""}}));
  EXPECT_EQ(info.source, "braid");
  EXPECT_EQ(info.store_host, "127.0.0.1");
}

TEST(Bootstrap, NoEnvironmentNamesEveryConventionLookedFor) {
  auto message = error_for({{"BRAID_TOKEN", "x"}, {"MASTER_ADDR", "h"}});
  for (const char* name : {"BRAID_RANK", "braid-run", "RANK/WORLD_SIZE", "OMPI_COMM_WORLD_RANK",
                           "SLURM_STEP_NUM_TASKS", "BRAID_WORLD_SIZE=1"}) {
    EXPECT_THAT(message, HasSubstr(name));
  }
}

TEST(Bootstrap, MalformedNumbersNameTheVariableAndValue) {
  EXPECT_THAT(error_for({{"RANK", "x"}, {"WORLD_SIZE", "2"}}),
              HasSubstr("RANK='x' is not an integer"));
  EXPECT_THAT(error_for({{"BRAID_RANK", "1"}, {"BRAID_WORLD_SIZE", "2.5"}}),
              HasSubstr("BRAID_WORLD_SIZE='2.5' is not an integer"));
  EXPECT_THAT(error_for({{"RANK", "-1"}, {"WORLD_SIZE", "2"}}),
              HasSubstr("RANK=-1 must not be negative"));
  EXPECT_THAT(error_for({{"RANK", "0"}, {"WORLD_SIZE", "0"}}),
              HasSubstr("WORLD_SIZE=0 must be at least 1"));
  EXPECT_THAT(error_for({{"RANK", "0"}, {"WORLD_SIZE", "99999999999"}}),
              HasSubstr("WORLD_SIZE=99999999999 is too large"));
  // Sizes an int holds but no job has: a typo, refused before anything is sized by it.
  EXPECT_THAT(error_for({{"BRAID_RANK", "0"}, {"BRAID_WORLD_SIZE", "2147483647"}}),
              HasSubstr("BRAID_WORLD_SIZE=2147483647 is more ranks than a braid job may have"));
  EXPECT_THAT(error_for({{"RANK", "0"}, {"WORLD_SIZE", "100000000"}}),
              HasSubstr("WORLD_SIZE=100000000 is more ranks"));
}

TEST(Bootstrap, RanksMustLieBelowTheirSizes) {
  EXPECT_THAT(error_for({{"BRAID_RANK", "4"}, {"BRAID_WORLD_SIZE", "4"}}),
              HasSubstr("BRAID_RANK=4 is not below BRAID_WORLD_SIZE=4"));
  EXPECT_THAT(
      error_for(
          {{"RANK", "1"}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "2"}, {"LOCAL_WORLD_SIZE", "2"}}),
      HasSubstr("LOCAL_RANK=2 is not below LOCAL_WORLD_SIZE=2"));
  EXPECT_THAT(error_for({{"RANK", "1"},
                         {"WORLD_SIZE", "4"},
                         {"GROUP_RANK", "2"},
                         {"GROUP_WORLD_SIZE", "2"},
                         {"MASTER_ADDR", "h"},
                         {"MASTER_PORT", "1"}}),
              HasSubstr("GROUP_RANK=2 is not below GROUP_WORLD_SIZE=2"));
  EXPECT_THAT(error_for({{"RANK", "1"}, {"WORLD_SIZE", "4"}, {"LOCAL_WORLD_SIZE", "8"}}),
              HasSubstr("LOCAL_WORLD_SIZE=8 is larger than WORLD_SIZE=4"));
  EXPECT_THAT(error_for({{"BRAID_RANK", "1"},
                         {"BRAID_WORLD_SIZE", "4"},
                         {"BRAID_LOCAL_RANK", "3"},
                         {"BRAID_NNODES", "2"},
                         {"BRAID_STORE", "h:1"}}),
              HasSubstr("BRAID_LOCAL_RANK=3 is not below local world size 2 (derived)"));
}

TEST(Bootstrap, UnevenSizesCannotBeDerived) {
  EXPECT_THAT(
      error_for({{"BRAID_RANK", "1"}, {"BRAID_WORLD_SIZE", "5"}, {"BRAID_NNODES", "2"}}),
      HasSubstr("cannot derive the local world size: BRAID_WORLD_SIZE=5 is not a multiple of "
                "BRAID_NNODES=2; set BRAID_LOCAL_WORLD_SIZE"));
}

TEST(Bootstrap, PartialConventionsNameWhatIsMissing) {
  EXPECT_THAT(error_for({{"RANK", "0"}}),
              HasSubstr("RANK=0 is set but WORLD_SIZE is not (a partial torchrun environment)"));
  EXPECT_THAT(error_for({{"WORLD_SIZE", "1"}}), HasSubstr("WORLD_SIZE=1 is set but RANK is not"));
  EXPECT_THAT(error_for({{"BRAID_WORLD_SIZE", "2"}}),
              HasSubstr("BRAID_WORLD_SIZE=2 is set but BRAID_RANK is not (a partial braid "
                        "environment)"));
  EXPECT_THAT(error_for({{"BRAID_LOCAL_RANK", "0"}}),
              HasSubstr("BRAID_LOCAL_RANK=0 is set but BRAID_WORLD_SIZE is not"));
  EXPECT_THAT(error_for({{"OMPI_COMM_WORLD_RANK", "0"}}),
              HasSubstr("is set but OMPI_COMM_WORLD_SIZE is not"));
  EXPECT_THAT(error_for({{"SLURM_STEP_NUM_TASKS", "2"}}),
              HasSubstr("SLURM_STEP_NUM_TASKS=2 is set but SLURM_PROCID is not (a partial slurm "
                        "environment)"));
  EXPECT_THAT(error_for({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}}),
              HasSubstr("MASTER_ADDR=h is set but MASTER_PORT is not"));
  EXPECT_THAT(error_for({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "1"}}),
              HasSubstr("MASTER_PORT=1 is set but MASTER_ADDR is not"));
}

TEST(Bootstrap, StoreAddressesAreCheckedAndIpv6Parses) {
  Vars vars{{"BRAID_WORLD_SIZE", "1"}};
  vars["BRAID_STORE"] = "[::1]:29500";
  auto info = parse_launch_env(env_of(vars));
  EXPECT_EQ(info.store_host, "::1");
  EXPECT_EQ(info.store_port, 29500);

  const std::vector<std::pair<std::string, std::string>> bad{
      {"host", "BRAID_STORE='host' must be host:port"},
      {":80", "BRAID_STORE=':80' must be host:port"},
      {"::1:29500", "write an IPv6 address in brackets"},
      {"[::1]", "BRAID_STORE='[::1]' must be [address]:port"},
      {"[]:1", "must be [address]:port"},
      {"h:0", "BRAID_STORE='h:0' has port '0', not a port number (1-65535)"},
      {"h:65536", "has port '65536'"},
      {"h:", "has port ''"},
      {"h:80x", "has port '80x'"}};
  for (const auto& [store, message] : bad) {
    vars["BRAID_STORE"] = store;
    EXPECT_THAT(error_for(vars), HasSubstr(message)) << store;
  }
  EXPECT_THAT(
      error_for(
          {{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "70000"}}),
      HasSubstr("MASTER_PORT=70000 is not a port number (1-65535)"));
}

TEST(Bootstrap, BracketedMasterAddrIsUnwrapped) {
  auto info = parse_launch_env(env_of(
      {{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "[fe80::1]"}, {"MASTER_PORT", "5"}}));
  EXPECT_EQ(info.store_host, "fe80::1");
}

TEST(Bootstrap, HostPortRoundTrips) {
  for (const char* host : {"127.0.0.1", "node-7.cluster", "::1", "fe80::1:2"}) {
    auto text = format_host_port(host, 4242);
    auto parsed = parse_host_port(text, "X");
    EXPECT_EQ(parsed.host, host) << text;
    EXPECT_EQ(parsed.port, 4242);
  }
  EXPECT_EQ(format_host_port("::1", 1), "[::1]:1");
}

TEST(Bootstrap, OpenMpiReadsPmixRankWhereItsOwnRankIsUnset) {
  Vars vars{{"PMIX_RANK", "3"},
            {"OMPI_COMM_WORLD_SIZE", "4"},
            {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
            {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"},
            {"BRAID_STORE", "head:29500"}};
  auto info = parse_launch_env(env_of(vars));
  expect_ranks(info, 3, 4, 1, 2, 1, 2);
  EXPECT_EQ(info.source, "openmpi");
  vars["OMPI_COMM_WORLD_RANK"] = "3";
  EXPECT_EQ(parse_launch_env(env_of(vars)).rank, 3);
  vars["OMPI_COMM_WORLD_RANK"] = "2";
  EXPECT_THAT(error_for(vars), HasSubstr("OMPI_COMM_WORLD_RANK=2 disagrees with PMIX_RANK=3"));
}

TEST(Bootstrap, PmixRankAloneIsNoOpenMpiEnvironment) {
  // srun --mpi=pmix sets PMIX_RANK for its tasks too.
  auto info = parse_launch_env(
      env_of({{"PMIX_RANK", "1"}, {"SLURM_PROCID", "1"}, {"SLURM_STEP_NUM_TASKS", "2"}}));
  EXPECT_EQ(info.source, "slurm");
  EXPECT_TRUE(info.outranked.empty());
  EXPECT_THAT(error_for({{"PMIX_RANK", "1"}}), HasSubstr("no launcher environment"));
}

TEST(Bootstrap, SlurmPrefersTheStepsVariablesToTheAllocations) {
  // srun --preserve-env inside an allocation of 4 nodes x 4 tasks, starting 2 x 2 tasks:
  // SLURM_NTASKS, SLURM_NNODES, SLURM_TASKS_PER_NODE and SLURM_JOB_NODELIST still
  // describe the allocation.
  auto info = parse_launch_env(env_of({{"SLURM_PROCID", "3"},
                                       {"SLURM_LOCALID", "1"},
                                       {"SLURM_NODEID", "1"},
                                       {"SLURM_NTASKS", "16"},
                                       {"SLURM_NNODES", "4"},
                                       {"SLURM_TASKS_PER_NODE", "4(x4)"},
                                       {"SLURM_JOB_NODELIST", "n[1-4]"},
                                       {"SLURM_STEP_NUM_TASKS", "4"},
                                       {"SLURM_STEP_NUM_NODES", "2"},
                                       {"SLURM_STEP_TASKS_PER_NODE", "2(x2)"},
                                       {"SLURM_STEP_NODELIST", "n[3-4]"},
                                       {"SLURM_JOB_ID", "7"}}));
  expect_ranks(info, 3, 4, 1, 2, 1, 2);
  EXPECT_EQ(info.store_host, "n3");
  EXPECT_EQ(info.store_port, slurm_step_port(7, 0));  // SLURM_STEP_ID unset: step 0
}

TEST(Bootstrap, SlurmStoreIsOnTheStepsFirstNodeAtAPortFromTheJobAndStepIds) {
  Vars vars{{"SLURM_PROCID", "3"},
            {"SLURM_STEP_NUM_TASKS", "4"},
            {"SLURM_LOCALID", "1"},
            {"SLURM_NODEID", "1"},
            {"SLURM_NNODES", "2"},
            {"SLURM_TASKS_PER_NODE", "2(x2)"},
            {"SLURM_JOB_NODELIST", "node[0-1]"},
            {"SLURM_JOB_ID", "123456"},
            {"SLURM_STEP_ID", "2"}};
  auto info = parse_launch_env(env_of(vars));
  EXPECT_EQ(info.store_host, "node0");
  EXPECT_EQ(info.store_port, slurm_step_port(123456, 2));
  EXPECT_EQ(info.token, "");
  vars["SLURM_STEP_NODELIST"] = "gpu[07-08]";
  info = parse_launch_env(env_of(vars));
  EXPECT_EQ(info.store_host, "gpu07");
  auto address = slurm_store_address(env_of(vars));
  ASSERT_TRUE(address);
  EXPECT_EQ(address->host, "gpu07");
  EXPECT_EQ(address->port, slurm_step_port(123456, 2));
  // BRAID_STORE and MASTER_ADDR/MASTER_PORT still come first.
  vars["MASTER_ADDR"] = "m";
  vars["MASTER_PORT"] = "1";
  EXPECT_EQ(parse_launch_env(env_of(vars)).store_host, "m");
  vars["BRAID_STORE"] = "b:2";
  EXPECT_EQ(parse_launch_env(env_of(vars)).store_host, "b");
}

TEST(Bootstrap, SlurmOnOneNodeServesTheStoreOnLoopbackAtTheStepsPort) {
  Vars vars{{"SLURM_PROCID", "1"},
            {"SLURM_STEP_NUM_TASKS", "4"},
            {"SLURM_NNODES", "1"},
            {"SLURM_JOB_NODELIST", "node7"},
            {"SLURM_JOB_ID", "42"}};
  auto info = parse_launch_env(env_of(vars));
  EXPECT_EQ(info.store_host, "127.0.0.1");
  EXPECT_EQ(info.store_port, slurm_step_port(42, 0));
  vars.erase("SLURM_JOB_ID");
  EXPECT_EQ(parse_launch_env(env_of(vars)).store_port, kDefaultStorePort);
  vars = {{"SLURM_PROCID", "0"}, {"SLURM_STEP_NUM_TASKS", "1"}, {"SLURM_JOB_ID", "42"}};
  EXPECT_EQ(parse_launch_env(env_of(vars)).store_port, 0);  // one rank: any free port
}

TEST(Bootstrap, TwoStepsOfOneJobServeTheirStoresAtDifferentPorts) {
  // srun ... & srun ... &: a job's steps may run at once on one node.
  Vars vars{{"SLURM_PROCID", "1"},
            {"SLURM_STEP_NUM_TASKS", "4"},
            {"SLURM_STEP_NUM_NODES", "1"},
            {"SLURM_JOB_ID", "123456"},
            {"SLURM_STEP_ID", "0"}};
  const std::uint16_t first = parse_launch_env(env_of(vars)).store_port;
  vars["SLURM_STEP_ID"] = "1";
  const std::uint16_t second = parse_launch_env(env_of(vars)).store_port;
  EXPECT_NE(first, second);
  EXPECT_EQ(first, slurm_step_port(123456, 0));
  EXPECT_EQ(second, slurm_step_port(123456, 1));
  // Every task of a step finds the same port without a word exchanged.
  vars["SLURM_PROCID"] = "3";
  EXPECT_EQ(parse_launch_env(env_of(vars)).store_port, second);
  // Whatever the ids, below Linux's ephemeral ports (32768-60999).
  for (const char* job : {"0", "1", "9999", "10000", "123456", "4294967295"}) {
    for (const char* step : {"0", "1", "2", "4294967294"}) {
      vars["SLURM_JOB_ID"] = job;
      vars["SLURM_STEP_ID"] = step;
      const std::uint16_t port = parse_launch_env(env_of(vars)).store_port;
      EXPECT_GE(port, 20000) << job << "." << step;
      EXPECT_LE(port, 29999) << job << "." << step;
    }
  }
}

TEST(Bootstrap, SlurmAcrossNodesWithoutJobIdOrNodeListIsAnError) {
  Vars vars{{"SLURM_PROCID", "0"},
            {"SLURM_STEP_NUM_TASKS", "4"},
            {"SLURM_NNODES", "2"},
            {"SLURM_JOB_NODELIST", "n[1-2]"}};
  EXPECT_THAT(error_for(vars),
              HasSubstr("the slurm environment spans 2 nodes but names no store: set "
                        "BRAID_STORE=host:port"));
  EXPECT_THAT(error_for(vars), HasSubstr("SLURM_JOB_ID and SLURM_STEP_NODELIST would place it"));
  EXPECT_FALSE(slurm_store_address(env_of(vars)));
  vars.erase("SLURM_JOB_NODELIST");
  vars["SLURM_JOB_ID"] = "5";
  EXPECT_THAT(error_for(vars), HasSubstr("spans 2 nodes but names no store"));
  EXPECT_FALSE(slurm_store_address(env_of(vars)));
}

TEST(Bootstrap, MalformedSlurmJobAndStepIdsAndNodeListsAreErrors) {
  Vars vars{{"SLURM_PROCID", "0"},
            {"SLURM_STEP_NUM_TASKS", "4"},
            {"SLURM_NNODES", "2"},
            {"SLURM_JOB_NODELIST", "n[1-2]"}};
  vars["SLURM_JOB_ID"] = "x";
  EXPECT_THAT(error_for(vars), HasSubstr("SLURM_JOB_ID='x' is not an integer"));
  vars["SLURM_JOB_ID"] = "-3";
  EXPECT_THAT(error_for(vars), HasSubstr("SLURM_JOB_ID=-3 must not be negative"));
  vars["SLURM_JOB_ID"] = "3";
  vars["SLURM_STEP_ID"] = "y";
  EXPECT_THAT(error_for(vars), HasSubstr("SLURM_STEP_ID='y' is not an integer"));
  vars["SLURM_STEP_ID"] = "-1";
  EXPECT_THAT(error_for(vars), HasSubstr("SLURM_STEP_ID=-1 must not be negative"));
  vars["SLURM_STEP_ID"] = "0";
  EXPECT_NO_THROW(parse_launch_env(env_of(vars)));
  // Checked even where BRAID_STORE makes the list unnecessary: Slurm wrote it, so it holds.
  vars["BRAID_STORE"] = "h:1";
  vars["SLURM_JOB_NODELIST"] = "n[2-1]";
  EXPECT_THAT(error_for(vars), HasSubstr("SLURM_JOB_NODELIST='n[2-1]' is not a Slurm host list"));
  vars["SLURM_STEP_NODELIST"] = "n[1-";
  EXPECT_THAT(error_for(vars), HasSubstr("SLURM_STEP_NODELIST='n[1-' is not a Slurm host list"));
}

TEST(Bootstrap, SlurmVariablesThatDisagreeAreErrorsNamingBoth) {
  const Vars consistent{
      {"SLURM_PROCID", "3"}, {"SLURM_STEP_NUM_TASKS", "4"},     {"SLURM_NODEID", "1"},
      {"SLURM_NNODES", "2"}, {"SLURM_TASKS_PER_NODE", "2(x2)"}, {"SLURM_JOB_NODELIST", "n[1-2]"},
      {"BRAID_STORE", "h:1"}};
  EXPECT_NO_THROW(parse_launch_env(env_of(consistent)));
  const std::vector<std::pair<Vars, std::string>> cases{
      {{{"SLURM_STEP_NUM_TASKS", "5"}},
       "the Slurm variables disagree: SLURM_STEP_NUM_TASKS=5 but SLURM_TASKS_PER_NODE='2(x2)' "
       "adds up to 4 tasks"},
      {{{"SLURM_STEP_TASKS_PER_NODE", "3(x2)"}},
       "SLURM_STEP_NUM_TASKS=4 but SLURM_STEP_TASKS_PER_NODE='3(x2)' adds up to 6 tasks"},
      {{{"SLURM_NNODES", "3"}},
       "the Slurm variables disagree: SLURM_NNODES=3 but SLURM_TASKS_PER_NODE='2(x2)' lists 2 "
       "node(s)"},
      {{{"SLURM_JOB_NODELIST", "n[1-3]"}},
       "the Slurm variables disagree: SLURM_NNODES=2 but SLURM_JOB_NODELIST='n[1-3]' names 3 "
       "host(s)"},
      {{{"SLURM_STEP_NODELIST", "n1"}, {"SLURM_NODEID", "0"}, {"SLURM_PROCID", "1"}},
       "SLURM_NNODES=2 but SLURM_STEP_NODELIST='n1' names 1 host(s)"},
      {{{"SLURM_TASKS_PER_NODE", "1(x1000000000)"}},
       "SLURM_STEP_NUM_TASKS=4 but SLURM_TASKS_PER_NODE='1(x1000000000)' adds up to 1000000000 "
       "tasks"},
      {{{"SLURM_TASKS_PER_NODE", "2000000000(x2000000000)"}},
       "adds up to more than 2147483647 tasks"},
  };
  for (const auto& [changes, message] : cases) {
    Vars vars = consistent;
    for (const auto& [name, value] : changes) vars[name] = value;
    EXPECT_THAT(error_for(vars), HasSubstr(message)) << message;
  }
  // Without a task list, the node list alone bounds SLURM_NODEID.
  Vars vars = consistent;
  vars.erase("SLURM_TASKS_PER_NODE");
  vars.erase("SLURM_NNODES");
  vars["SLURM_NODEID"] = "2";
  EXPECT_THAT(error_for(vars),
              HasSubstr("SLURM_NODEID=2 is beyond the 2 host(s) of SLURM_JOB_NODELIST='n[1-2]'"));
}

TEST(Bootstrap, UnderTorchrunsAgentStoreBraidsStoreIsAtTheNextPort) {
  Vars vars{{"RANK", "1"},
            {"WORLD_SIZE", "2"},
            {"MASTER_ADDR", "10.0.0.1"},
            {"MASTER_PORT", "29500"},
            {"TORCHELASTIC_USE_AGENT_STORE", "True"}};
  auto info = parse_launch_env(env_of(vars));
  EXPECT_EQ(info.store_host, "10.0.0.1");
  EXPECT_EQ(info.store_port, 29501);
  for (const char* yes : {"true", "1"}) {
    vars["TORCHELASTIC_USE_AGENT_STORE"] = yes;
    EXPECT_EQ(parse_launch_env(env_of(vars)).store_port, 29501) << yes;
  }
  for (const char* no : {"False", "false", "0", ""}) {
    vars["TORCHELASTIC_USE_AGENT_STORE"] = no;
    EXPECT_EQ(parse_launch_env(env_of(vars)).store_port, 29500) << no;
  }
  vars["TORCHELASTIC_USE_AGENT_STORE"] = "maybe";
  EXPECT_THAT(error_for(vars),
              HasSubstr("TORCHELASTIC_USE_AGENT_STORE='maybe' is neither True nor False"));
  vars["TORCHELASTIC_USE_AGENT_STORE"] = "True";
  vars["MASTER_PORT"] = "65535";
  EXPECT_THAT(error_for(vars),
              HasSubstr("MASTER_PORT=65535 leaves no port after it for braid's store"));
  // BRAID_STORE names braid's own store: nothing to step around.
  vars["BRAID_STORE"] = "b:29500";
  EXPECT_EQ(parse_launch_env(env_of(vars)).store_port, 29500);
}

TEST(Bootstrap, DescriptionSaysWhatWasReadAndWhatDerived) {
  auto info = parse_launch_env(env_of({{"SLURM_PROCID", "3"},
                                       {"SLURM_STEP_NUM_TASKS", "4"},
                                       {"SLURM_LOCALID", "1"},
                                       {"SLURM_NODEID", "1"},
                                       {"SLURM_NNODES", "2"},
                                       {"SLURM_TASKS_PER_NODE", "2(x2)"},
                                       {"SLURM_JOB_NODELIST", "node[0-1]"},
                                       {"SLURM_JOB_ID", "42"},
                                       {"SLURM_STEP_ID", "1"}}));
  // The port is a hash, so the expected line is built around it.
  EXPECT_EQ(info.description,
            fmt::format("slurm: rank 3 of 4 (SLURM_PROCID=3, SLURM_STEP_NUM_TASKS=4), local rank "
                        "1 of 2 (SLURM_LOCALID=1, the 2 task(s) SLURM_TASKS_PER_NODE='2(x2)' gives "
                        "node 1), node 1 of 2 (SLURM_NODEID=1, SLURM_NNODES=2); store node0:{} "
                        "(the first host of SLURM_JOB_NODELIST='node[0-1]', port 20000 + a hash "
                        "of SLURM_JOB_ID=42 and SLURM_STEP_ID=1 % 10000)",
                        slurm_step_port(42, 1)));
  EXPECT_EQ(describe(info), info.description);  // nothing else present

  info = parse_launch_env(env_of({{"BRAID_RANK", "5"},
                                  {"BRAID_WORLD_SIZE", "8"},
                                  {"BRAID_NNODES", "2"},
                                  {"BRAID_STORE", "h:1"}}));
  EXPECT_EQ(info.description,
            "braid: rank 5 of 8 (BRAID_RANK=5, BRAID_WORLD_SIZE=8), local rank 1 of 4 (derived), "
            "node 1 of 2 (BRAID_NNODES=2, node rank derived); store h:1 (BRAID_STORE)");
  EXPECT_THAT(parse_launch_env(env_of({{"BRAID_WORLD_SIZE", "1"}})).description,
              HasSubstr("rank 0 of 1 (BRAID_WORLD_SIZE=1, rank derived)"));
  EXPECT_THAT(parse_launch_env(env_of({{"RANK", "0"},
                                       {"WORLD_SIZE", "2"},
                                       {"MASTER_ADDR", "a"},
                                       {"MASTER_PORT", "7"},
                                       {"TORCHELASTIC_USE_AGENT_STORE", "True"}}))
                  .description,
              HasSubstr("store a:8 (MASTER_ADDR, MASTER_PORT=7 + 1: torchrun's own store "
                        "holds MASTER_PORT (TORCHELASTIC_USE_AGENT_STORE=True))"));
}

TEST(Bootstrap, OutrankedConventionsAreReportedAsAgreeingOrNot) {
  // braid-run sets torchrun's variables too, to the same numbers.
  Vars vars{{"BRAID_RANK", "1"},       {"BRAID_WORLD_SIZE", "2"}, {"RANK", "1"},
            {"WORLD_SIZE", "2"},       {"LOCAL_RANK", "1"},       {"LOCAL_WORLD_SIZE", "2"},
            {"BRAID_STORE", "h:29500"}};
  auto info = parse_launch_env(env_of(vars));
  ASSERT_EQ(info.outranked.size(), 1u);
  EXPECT_EQ(info.outranked[0].source, "torchrun");
  EXPECT_EQ(info.outranked[0].verdict, OutrankedLaunch::Verdict::agrees);
  EXPECT_FALSE(outranked_disagree(info));
  EXPECT_EQ(describe(info),
            info.description +
                "; torchrun also present and agrees: rank 1 of 2 (RANK=1, WORLD_SIZE=2), local "
                "rank 1 of 2 (LOCAL_RANK=1, LOCAL_WORLD_SIZE=2), node 0 of 1 (derived); the "
                "first present of braid, torchrun, openmpi, slurm is followed");

  // srun -N 2 torchrun --standalone: each node's torchrun thinks it is the whole job.
  vars = {{"RANK", "1"},
          {"WORLD_SIZE", "2"},
          {"LOCAL_RANK", "1"},
          {"LOCAL_WORLD_SIZE", "2"},
          {"MASTER_ADDR", "127.0.0.1"},
          {"MASTER_PORT", "29500"},
          {"SLURM_PROCID", "1"},
          {"SLURM_STEP_NUM_TASKS", "2"},
          {"SLURM_NNODES", "2"},
          {"SLURM_NODEID", "1"},
          {"SLURM_TASKS_PER_NODE", "1(x2)"}};
  info = parse_launch_env(env_of(vars));
  EXPECT_EQ(info.source, "torchrun");
  ASSERT_EQ(info.outranked.size(), 1u);
  EXPECT_EQ(info.outranked[0].verdict, OutrankedLaunch::Verdict::disagrees);
  EXPECT_TRUE(outranked_disagree(info));
  EXPECT_THAT(describe(info),
              HasSubstr("; slurm also present and disagrees: rank 1 of 2 (SLURM_PROCID=1, "
                        "SLURM_STEP_NUM_TASKS=2)"));

  // What would fail the parse if followed is only reported when outranked.
  vars["SLURM_TASKS_PER_NODE"] = "x";
  vars["OMPI_COMM_WORLD_RANK"] = "0";
  info = parse_launch_env(env_of(vars));
  ASSERT_EQ(info.outranked.size(), 2u);
  EXPECT_EQ(info.outranked[0].source, "openmpi");
  EXPECT_EQ(info.outranked[0].verdict, OutrankedLaunch::Verdict::unreadable);
  EXPECT_EQ(info.outranked[1].verdict, OutrankedLaunch::Verdict::unreadable);
  EXPECT_THAT(describe(info),
              HasSubstr("; openmpi also present but unreadable: OMPI_COMM_WORLD_RANK=0 is set "
                        "but OMPI_COMM_WORLD_SIZE is not (a partial openmpi environment); slurm "
                        "also present but unreadable: SLURM_TASKS_PER_NODE='x' is not a Slurm "
                        "task count list"));
}

TEST(Bootstrap, TorchrunInsideAnSrunStepOfOneTaskPerNodeAgreesWithIt) {
  // srun -N 2 --ntasks-per-node 1 torchrun --nnodes 2 --nproc-per-node 2: Slurm started
  // this node's torchrun, and torchrun the two ranks on it.
  Vars vars{{"RANK", "3"},
            {"WORLD_SIZE", "4"},
            {"LOCAL_RANK", "1"},
            {"LOCAL_WORLD_SIZE", "2"},
            {"GROUP_RANK", "1"},
            {"GROUP_WORLD_SIZE", "2"},
            {"MASTER_ADDR", "n1"},
            {"MASTER_PORT", "29500"},
            {"TORCHELASTIC_USE_AGENT_STORE", "True"},
            {"SLURM_PROCID", "1"},
            {"SLURM_LOCALID", "0"},
            {"SLURM_NODEID", "1"},
            {"SLURM_STEP_NUM_TASKS", "2"},
            {"SLURM_STEP_NUM_NODES", "2"},
            {"SLURM_STEP_TASKS_PER_NODE", "1(x2)"},
            {"SLURM_STEP_NODELIST", "n[1-2]"},
            {"SLURM_JOB_ID", "77"},
            {"SLURM_STEP_ID", "0"}};
  auto info = parse_launch_env(env_of(vars));
  EXPECT_EQ(info.source, "torchrun");
  expect_ranks(info, 3, 4, 1, 2, 1, 2);
  ASSERT_EQ(info.outranked.size(), 1u);
  EXPECT_EQ(info.outranked[0].source, "slurm");
  EXPECT_EQ(info.outranked[0].verdict, OutrankedLaunch::Verdict::agrees);
  EXPECT_FALSE(outranked_disagree(info));
  EXPECT_EQ(info.outranked[0].description,
            "rank 1 of 2 (SLURM_PROCID=1, SLURM_STEP_NUM_TASKS=2), local rank 0 of 1 "
            "(SLURM_LOCALID=0, the 1 task(s) SLURM_STEP_TASKS_PER_NODE='1(x2)' gives node 1), "
            "node 1 of 2 (SLURM_NODEID=1, SLURM_STEP_NUM_NODES=2) (one per node: it started "
            "this node's launcher)");

  // One task per node, but torchrun numbered this node differently: not the same node.
  vars["GROUP_RANK"] = "0";
  vars["RANK"] = "1";
  info = parse_launch_env(env_of(vars));
  ASSERT_EQ(info.outranked.size(), 1u);
  EXPECT_EQ(info.outranked[0].verdict, OutrankedLaunch::Verdict::disagrees);

  // srun --ntasks-per-node 2 started two torchruns on each node: twice the processes
  // torchrun counts.
  vars["GROUP_RANK"] = "1";
  vars["RANK"] = "3";
  vars["SLURM_PROCID"] = "2";
  vars["SLURM_STEP_NUM_TASKS"] = "4";
  vars["SLURM_STEP_TASKS_PER_NODE"] = "2(x2)";
  info = parse_launch_env(env_of(vars));
  ASSERT_EQ(info.outranked.size(), 1u);
  EXPECT_EQ(info.outranked[0].verdict, OutrankedLaunch::Verdict::disagrees);
  EXPECT_TRUE(outranked_disagree(info));
  EXPECT_THAT(describe(info),
              HasSubstr("; slurm also present and disagrees: rank 2 of 4 (SLURM_PROCID=2, "
                        "SLURM_STEP_NUM_TASKS=4), local rank 0 of 2"));
  EXPECT_THAT(info.outranked[0].description, Not(HasSubstr("one per node")));
}

TEST(Bootstrap, ParseSlurmStepReadsTheStepWhateverElseIsSet) {
  // braid-run started once per node by srun takes its node from the step, not from the
  // BRAID_* or torchrun variables an enclosing launcher left behind.
  Vars vars{{"SLURM_PROCID", "1"},
            {"SLURM_LOCALID", "0"},
            {"SLURM_NODEID", "1"},
            {"SLURM_STEP_NUM_TASKS", "2"},
            {"SLURM_STEP_NUM_NODES", "2"},
            {"SLURM_STEP_TASKS_PER_NODE", "1(x2)"},
            {"SLURM_STEP_NODELIST", "gpu[07-08]"},
            {"SLURM_JOB_ID", "9001"},
            {"SLURM_STEP_ID", "3"},
            {"BRAID_RANK", "5"},
            {"BRAID_WORLD_SIZE", "8"},
            {"RANK", "6"},
            {"WORLD_SIZE", "16"},
            {"LOCAL_RANK", "2"},
            {"LOCAL_WORLD_SIZE", "4"}};
  EXPECT_EQ(parse_launch_env(env_of(vars)).source, "braid");
  auto step = parse_slurm_step(env_of(vars));
  ASSERT_TRUE(step);
  EXPECT_EQ(step->source, "slurm");
  expect_ranks(*step, 1, 2, 0, 1, 1, 2);
  EXPECT_EQ(step->store_host, "gpu07");
  EXPECT_EQ(step->store_port, slurm_step_port(9001, 3));
  EXPECT_TRUE(step->outranked.empty());
  EXPECT_THAT(step->description,
              HasSubstr("slurm: rank 1 of 2 (SLURM_PROCID=1, SLURM_STEP_NUM_TASKS=2)"));

  // The store follows parse_launch_env's rules: one set by hand still comes first.
  vars["BRAID_STORE"] = "head:29600";
  step = parse_slurm_step(env_of(vars));
  ASSERT_TRUE(step);
  EXPECT_EQ(step->store_host, "head");
  EXPECT_EQ(step->store_port, 29600);

  // A step that cannot be read is an error here, where parse_launch_env only reports it.
  vars["SLURM_STEP_TASKS_PER_NODE"] = "x";
  EXPECT_THROW(parse_slurm_step(env_of(vars)), Error);
  EXPECT_EQ(parse_launch_env(env_of(vars)).outranked.back().verdict,
            OutrankedLaunch::Verdict::unreadable);

  // Outside a step (an sbatch script, an salloc shell), nothing, whatever else is set.
  vars["SLURM_STEP_TASKS_PER_NODE"] = "1(x2)";
  vars.erase("SLURM_STEP_NUM_TASKS");
  EXPECT_FALSE(parse_slurm_step(env_of(vars)));
  vars["SLURM_STEP_NUM_TASKS"] = "";
  EXPECT_FALSE(parse_slurm_step(env_of(vars)));
}

TEST(Bootstrap, ALaunchInfoBuiltByHandHasNoDescription) {
  EXPECT_EQ(describe(LaunchInfo{}), "");
  EXPECT_FALSE(outranked_disagree(LaunchInfo{}));
}

TEST(FindFreePort, ReturnsANonZeroPortThatCanBeBoundOnEveryInterface) {
  const std::uint16_t port = find_free_port();
  ASSERT_NE(port, 0);
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_ANY);
  address.sin_port = htons(port);
  EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address), 0);
  ::close(fd);
}

}  // namespace
}  // namespace braid::transport
