#include <arpa/inet.h>
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
                                       {"SLURM_NTASKS", "10"},
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
  Vars vars{{"SLURM_PROCID", "4"},  {"SLURM_NTASKS", "10"}, {"SLURM_LOCALID", "0"},
            {"SLURM_NODEID", "1"},  {"SLURM_NNODES", "3"},  {"SLURM_TASKS_PER_NODE", "4(x2),2"},
            {"BRAID_STORE", "n0:1"}};
  EXPECT_EQ(parse_launch_env(env_of(vars)).local_world_size, 4);
  vars["SLURM_TASKS_PER_NODE"] = "3,5,2";
  EXPECT_EQ(parse_launch_env(env_of(vars)).local_world_size, 5);
}

TEST(Bootstrap, SlurmUniformTasksPerNodeNeedsNoNodeId) {
  auto info = parse_launch_env(env_of({{"SLURM_PROCID", "5"},
                                       {"SLURM_NTASKS", "8"},
                                       {"SLURM_NTASKS_PER_NODE", "4"},
                                       {"BRAID_STORE", "n0:29500"}}));
  expect_ranks(info, 5, 8, 1, 4, 1, 2);
  info = parse_launch_env(env_of({{"SLURM_PROCID", "2"},
                                  {"SLURM_NTASKS", "4"},
                                  {"SLURM_NNODES", "1"},
                                  {"SLURM_TASKS_PER_NODE", "4"}}));
  expect_ranks(info, 2, 4, 2, 4, 0, 1);
  EXPECT_EQ(info.store_host, "127.0.0.1");
}

TEST(Bootstrap, MalformedSlurmTaskListsAreErrors) {
  Vars vars{{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "4"}, {"SLURM_NODEID", "0"}};
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

TEST(Bootstrap, SlurmAllocationWithoutATaskIsNotALaunch) {
  // salloc shells carry the allocation's SLURM_* but no SLURM_PROCID.
  EXPECT_THAT(error_for({{"SLURM_NTASKS", "4"}, {"SLURM_NNODES", "1"}}),
              HasSubstr("no launcher environment"));
}

TEST(Bootstrap, ConventionsArePickedInPrecedenceOrder) {
  Vars vars{{"SLURM_PROCID", "0"},
            {"SLURM_NTASKS", "1"},
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
                           "SLURM_PROCID", "BRAID_WORLD_SIZE=1"}) {
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
  EXPECT_THAT(error_for({{"SLURM_PROCID", "0"}}), HasSubstr("is set but SLURM_NTASKS is not"));
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
