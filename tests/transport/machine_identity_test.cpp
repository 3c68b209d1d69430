// A World's check of its ranks' nodes against their machines (machine_identity.hpp): the
// launchers' nodes are trusted only where the kernel agrees, and UCX is kept off shared
// memory between ranks of different nodes that could reach each other's memory.
#include "transport/machine_identity.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <braid/core/error.hpp>

namespace braid::transport::detail {
namespace {

using ::testing::HasSubstr;

MachineIdentity machine(std::string boot_id, std::uint64_t ipc, std::uint64_t pid) {
  return MachineIdentity{.hostname = "host",
                         .boot_id = std::move(boot_id),
                         .ipc_namespace = ipc,
                         .pid_namespace = pid};
}

TEST(MachineIdentity, ThisProcessHasABootIdAndNamespaces) {
  const MachineIdentity me = MachineIdentity::of_this_process();
  EXPECT_EQ(me.boot_id.size(), 36U) << me.boot_id;  // a UUID
  EXPECT_NE(me.ipc_namespace, 0U);
  EXPECT_NE(me.pid_namespace, 0U);
  EXPECT_TRUE(me.shares_memory_with(MachineIdentity::of_this_process()));
}

TEST(MachineIdentity, APlacementReadsBackAsPublished) {
  const auto [node, read] = decode_placement(encode_placement(3, machine("b00t", 11, 12)), 5);
  EXPECT_EQ(node, 3);
  EXPECT_EQ(read.hostname, "host");
  EXPECT_EQ(read.boot_id, "b00t");
  EXPECT_EQ(read.ipc_namespace, 11U);
  EXPECT_EQ(read.pid_namespace, 12U);
}

TEST(MachineIdentity, APlacementThatIsNotOneIsAProtocolErrorNamingTheRank) {
  const std::string garbage = "not a placement";
  try {
    decode_placement(Bytes(garbage.begin(), garbage.end()), 5);
    FAIL() << "garbage decoded";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::protocol_error);
    EXPECT_THAT(e.what(), HasSubstr("rank 5"));
  }
}

TEST(PlacementCheck, NodesOnMachinesOfTheirOwnKeepSharedMemory) {
  const std::vector<int> nodes{0, 0, 1, 1};
  const std::vector<MachineIdentity> machines{machine("a", 1, 2), machine("a", 1, 2),
                                              machine("b", 1, 2), machine("b", 1, 2)};
  for (int rank = 0; rank < 4; ++rank) {
    EXPECT_FALSE(check_placement(nodes, machines, rank).network_only) << rank;
  }
}

TEST(PlacementCheck, NodesInNamespacesOfTheirOwnOnOneMachineKeepSharedMemory) {
  const std::vector<int> nodes{0, 0, 1, 1};
  const std::vector<MachineIdentity> machines{machine("a", 1, 2), machine("a", 1, 2),
                                              machine("a", 3, 4), machine("a", 3, 4)};
  EXPECT_FALSE(check_placement(nodes, machines, 0).network_only);
  EXPECT_FALSE(check_placement(nodes, machines, 3).network_only);
}

TEST(PlacementCheck, NodesSharingAnIpcOrPidNamespaceKeepUcxToTheNetwork) {
  const std::vector<int> nodes{0, 1};
  // One IPC namespace: posix and sysv shared memory reach across.
  auto ipc = check_placement(nodes, std::vector{machine("a", 1, 2), machine("a", 1, 9)}, 0);
  EXPECT_TRUE(ipc.network_only);
  EXPECT_THAT(ipc.why, HasSubstr("rank(s) 1 of other nodes"));
  // One PID namespace: cross-memory attach reaches across.
  EXPECT_TRUE(
      check_placement(nodes, std::vector{machine("a", 1, 2), machine("a", 8, 2)}, 1).network_only);
}

TEST(PlacementCheck, RanksGivenOneNodeOnTwoMachinesAreRefusedByName) {
  const std::vector<int> nodes{0, 1, 0};
  const std::vector<MachineIdentity> machines{machine("a", 1, 2), machine("b", 1, 2),
                                              machine("c", 1, 2)};
  try {
    check_placement(nodes, machines, 1);
    FAIL() << "two machines on one node were accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::invalid_environment);
    EXPECT_THAT(e.what(), HasSubstr("ranks 0 and 2 both run on node 0"));
    EXPECT_THAT(e.what(), HasSubstr("give each machine its own node rank"));
  }
}

TEST(PlacementCheck, EachRanksPlaceNamesItsNodeHostAndTheNodesRanks) {
  const std::vector<int> nodes{0, 0, 1, 1, 1};
  std::vector<MachineIdentity> machines(5, machine("a", 1, 2));
  machines[2].hostname = machines[3].hostname = machines[4].hostname = "gpu7";
  const std::vector<std::string> places = describe_places(nodes, machines);
  ASSERT_EQ(places.size(), 5U);
  EXPECT_EQ(places[0], "; it ran on node 0 (host), with ranks 0-1");
  EXPECT_EQ(places[3], "; it ran on node 1 (gpu7), with ranks 2-4");
}

}  // namespace
}  // namespace braid::transport::detail
