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

#include "bootstrap_test_helpers.hpp"

using ::testing::HasSubstr;
using ::testing::Not;

namespace braid::transport {
namespace {

using namespace braid::transport::bootstrap_testing;

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

// Under braid-run the launcher serves the store and gives each start of the job a
// namespace in it; elsewhere rank 0 serves it and keys have no prefix.
TEST(Bootstrap, ReadsWhoServesTheStoreAndTheKeyPrefix) {
  auto info = parse_launch_env(env_of({{"BRAID_RANK", "0"},
                                       {"BRAID_WORLD_SIZE", "2"},
                                       {"BRAID_STORE", "node0:1234"},
                                       {"BRAID_STORE_SERVED_BY", "launcher"},
                                       {"BRAID_STORE_PREFIX", "braid/run/g/2/"}}));
  EXPECT_TRUE(info.store_served_by_launcher);
  EXPECT_EQ(info.store_prefix, "braid/run/g/2/");
  EXPECT_THAT(info.description, HasSubstr("served by the launcher"));
  auto plain = parse_launch_env(env_of({{"BRAID_RANK", "0"}, {"BRAID_WORLD_SIZE", "2"}}));
  EXPECT_FALSE(plain.store_served_by_launcher);
  EXPECT_EQ(plain.store_prefix, "");
  auto message = error_for(
      {{"BRAID_RANK", "0"}, {"BRAID_WORLD_SIZE", "2"}, {"BRAID_STORE_SERVED_BY", "rank1"}});
  EXPECT_THAT(message, HasSubstr("BRAID_STORE_SERVED_BY=rank1 is neither rank0 nor launcher"));
}

// An etcd cluster as the store: its members and the job's namespace reach the World, which
// then serves nothing (rank 0 included); a malformed URL names the variable.
TEST(Bootstrap, ReadsAnEtcdStore) {
  auto info = parse_launch_env(env_of({{"BRAID_RANK", "0"},
                                       {"BRAID_WORLD_SIZE", "2"},
                                       {"BRAID_STORE", "etcd://e0:2379,e1:2379/run-7"},
                                       {"BRAID_STORE_PREFIX", "braid/run/g/0/"}}));
  EXPECT_EQ(info.etcd_members, (std::vector<std::string>{"e0:2379", "e1:2379"}));
  EXPECT_EQ(info.etcd_namespace, "run-7/");
  EXPECT_EQ(info.store_host, "e0");
  EXPECT_EQ(info.store_port, 2379);
  EXPECT_EQ(info.store_prefix, "braid/run/g/0/");
  EXPECT_THAT(info.description, HasSubstr("store etcd://e0:2379,e1:2379/run-7"));
  auto message = error_for(
      {{"BRAID_RANK", "0"}, {"BRAID_WORLD_SIZE", "2"}, {"BRAID_STORE", "etcd://e0:2379,e1/run"}});
  EXPECT_THAT(message, HasSubstr("BRAID_STORE"));
  EXPECT_THAT(message, HasSubstr("'e1'"));
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
