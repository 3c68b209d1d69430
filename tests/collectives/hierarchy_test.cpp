// HierarchyPlan (hierarchy.hpp): how members group into nodes, and the rails or leaders a
// hierarchical collective crosses nodes with, for uniform and uneven layouts.
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <braid/collectives/hierarchy.hpp>
#include <braid/core/enforce.hpp>

namespace braid::collectives {
namespace {

using ::testing::ElementsAre;

TEST(HierarchyPlan, TwoNodesOfTwoFormRailsOfTheSameLocalIndex) {
  const std::vector<int> nodes{0, 0, 1, 1};
  const auto plan = HierarchyPlan::from_nodes(nodes, 3);
  EXPECT_EQ(plan.nodes, 2);
  EXPECT_TRUE(plan.uniform);
  EXPECT_TRUE(plan.worth_it());
  EXPECT_THAT(plan.local_group, ElementsAre(2, 3));
  EXPECT_EQ(plan.local_rank, 1);
  EXPECT_THAT(plan.cross_group, ElementsAre(1, 3));
  EXPECT_EQ(plan.cross_rank, 1);
}

TEST(HierarchyPlan, InterleavedPlacementGroupsByNodeNotByRankOrder) {
  // Round-robin placement (mpirun --map-by node): ranks 0 and 2 on one node.
  const std::vector<int> nodes{7, 3, 7, 3};
  const auto plan = HierarchyPlan::from_nodes(nodes, 2);
  EXPECT_THAT(plan.node_of, ElementsAre(0, 1, 0, 1));  // dense, by first appearance
  EXPECT_THAT(plan.local_group, ElementsAre(0, 2));
  EXPECT_EQ(plan.local_rank, 1);
  EXPECT_THAT(plan.cross_group, ElementsAre(2, 3));
}

TEST(HierarchyPlan, EveryRankOfAUniformPlanIsOnExactlyOneRail) {
  const std::vector<int> nodes{0, 0, 0, 1, 1, 1, 2, 2, 2};
  std::vector<int> seen(nodes.size(), 0);
  for (int r = 0; r < static_cast<int>(nodes.size()); ++r) {
    const auto plan = HierarchyPlan::from_nodes(nodes, r);
    ASSERT_EQ(plan.cross_group.size(), 3u);
    EXPECT_EQ(plan.cross_group[static_cast<std::size_t>(plan.cross_rank)], r);
    if (plan.cross_rank == 0) {
      for (int member : plan.cross_group) ++seen[static_cast<std::size_t>(member)];
    }
  }
  EXPECT_THAT(seen, ::testing::Each(1));
}

TEST(HierarchyPlan, UnevenNodesCrossThroughTheirLeadersOnly) {
  // Slurm "2(x1),1(x1)": three ranks, two nodes.
  const std::vector<int> nodes{0, 0, 1};
  const auto leader = HierarchyPlan::from_nodes(nodes, 0);
  EXPECT_FALSE(leader.uniform);
  EXPECT_TRUE(leader.is_leader());
  EXPECT_THAT(leader.cross_group, ElementsAre(0, 2));
  EXPECT_EQ(leader.cross_rank, 0);
  const auto follower = HierarchyPlan::from_nodes(nodes, 1);
  EXPECT_FALSE(follower.is_leader());
  EXPECT_TRUE(follower.cross_group.empty());
  EXPECT_EQ(follower.cross_rank, -1);
  const auto alone = HierarchyPlan::from_nodes(nodes, 2);
  EXPECT_THAT(alone.local_group, ElementsAre(2));
  EXPECT_THAT(alone.cross_group, ElementsAre(0, 2));
}

TEST(HierarchyPlan, IsWorthItOnlyWhenSomeNodeHoldsSeveralMembersOfSeveralNodes) {
  const std::vector<int> one_node{0, 0, 0};
  const std::vector<int> one_per_node{0, 1, 2};
  EXPECT_FALSE(HierarchyPlan::from_nodes(one_node, 0).worth_it());
  EXPECT_FALSE(HierarchyPlan::from_nodes(one_per_node, 0).worth_it());
  const std::vector<int> single{5};
  const auto plan = HierarchyPlan::from_nodes(single, 0);
  EXPECT_EQ(plan.nodes, 1);
  EXPECT_FALSE(plan.worth_it());
}

TEST(HierarchyPlan, ARankOutsideTheMembersIsABrokenInvariant) {
  const std::vector<int> nodes{0, 1};
  EXPECT_THROW(HierarchyPlan::from_nodes(nodes, 2), InvariantError);
  EXPECT_THROW(HierarchyPlan::from_nodes({}, 0), InvariantError);
}

}  // namespace
}  // namespace braid::collectives
