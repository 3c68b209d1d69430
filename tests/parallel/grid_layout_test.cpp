// GridLayout (grid_layout.hpp): each rank's coordinates and every group's members, checked
// against Megatron-Core's documented example (parallel_state.py, initialize_model_parallel:
// 16 ranks, TP 2, PP 4, DP 2) and its generate_masked_orthogonal_rank_groups for other
// shapes and orders.
#include <set>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <braid/parallel/grid_layout.hpp>

#include "../support/expect_error.hpp"

namespace braid::parallel {
namespace {

using braid::testing::expect_invalid_argument;
using Groups = std::vector<std::vector<int>>;
using ::testing::ElementsAre;

GridSpec spec(int tp, int cp, int dp, int pp,
              std::vector<Axis> order = {all_axes.begin(), all_axes.end()}) {
  return GridSpec{.degrees = {tp, cp, dp, pp}, .order = std::move(order)};
}

// Every group of `axes` holds every rank once, and each rank's members() and group_index()
// agree with the list.
void expect_partition(const GridLayout& grid, Axes axes) {
  const Groups groups = grid.groups(axes);
  ASSERT_EQ(static_cast<int>(groups.size()), grid.group_count(axes));
  std::set<int> seen;
  for (std::size_t g = 0; g < groups.size(); ++g) {
    ASSERT_EQ(static_cast<int>(groups[g].size()), grid.group_size(axes));
    for (int rank : groups[g]) {
      EXPECT_TRUE(seen.insert(rank).second) << rank << " is in two groups of " << axes.name();
      EXPECT_EQ(grid.members(axes, rank), groups[g]) << axes.name() << " rank " << rank;
      EXPECT_EQ(grid.group_index(axes, rank), static_cast<int>(g));
    }
  }
  EXPECT_EQ(static_cast<int>(seen.size()), grid.world_size());
}

TEST(GridLayout, MegatronCoresSixteenRankExampleGivesItsGroups) {
  const GridLayout grid(16, spec(2, 1, 0, 4));  // dp inferred: 16 / (2 * 4)
  EXPECT_EQ(grid.degree(Axis::dp), 2);
  EXPECT_EQ(grid.describe(), "tp=2 cp=1 dp=2 pp=4 order tp-cp-dp-pp");
  EXPECT_EQ(grid.groups(Axis::tp),
            (Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}, {8, 9}, {10, 11}, {12, 13}, {14, 15}}));
  EXPECT_EQ(grid.groups(Axis::dp),
            (Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}, {8, 10}, {9, 11}, {12, 14}, {13, 15}}));
  EXPECT_EQ(grid.groups(Axis::pp),
            (Groups{{0, 4, 8, 12}, {1, 5, 9, 13}, {2, 6, 10, 14}, {3, 7, 11, 15}}));
  EXPECT_EQ(grid.groups(Axis::cp).size(), 16u);  // degree 1: a group of one per rank
  EXPECT_EQ(grid.members(Axis::cp, 9), (std::vector<int>{9}));
  // Megatron's "tp-dp" (tensor-and-data) and "tp-pp" (model-parallel) groups.
  EXPECT_EQ(grid.groups({Axis::tp, Axis::dp}),
            (Groups{{0, 1, 2, 3}, {4, 5, 6, 7}, {8, 9, 10, 11}, {12, 13, 14, 15}}));
  EXPECT_EQ(grid.groups(Axes::parse("pp-tp")),
            (Groups{{0, 1, 4, 5, 8, 9, 12, 13}, {2, 3, 6, 7, 10, 11, 14, 15}}));
  EXPECT_EQ(grid.groups({Axis::tp, Axis::cp, Axis::dp, Axis::pp}).size(), 1u);
  for (Axes axes : {Axes(Axis::tp), Axes(Axis::dp), Axes(Axis::pp), Axes(Axis::cp),
                    Axes{Axis::tp, Axis::dp}, Axes{Axis::dp, Axis::pp}, Axes{Axis::tp, Axis::pp}}) {
    expect_partition(grid, axes);
  }
}

TEST(GridLayout, CoordinatesAreTheRanksDigitsFastestAxisFirst) {
  const GridLayout grid(16, spec(2, 1, 2, 4));
  // rank = tp + 2 * dp + 4 * pp
  EXPECT_EQ(grid.coordinates(0), (GridLayout::Coordinates{0, 0, 0, 0}));
  EXPECT_EQ(grid.coordinates(5), (GridLayout::Coordinates{1, 0, 0, 1}));
  EXPECT_EQ(grid.coordinates(14), (GridLayout::Coordinates{0, 0, 1, 3}));
  for (int rank = 0; rank < 16; ++rank) {
    EXPECT_EQ(grid.rank_at(grid.coordinates(rank)), rank);
    EXPECT_EQ(grid.coordinate(rank, Axis::tp), rank % 2);
    EXPECT_EQ(grid.coordinate(rank, Axis::dp), rank / 2 % 2);
    EXPECT_EQ(grid.stage(rank), rank / 4);
  }
  EXPECT_THAT(grid.order(), ElementsAre(Axis::tp, Axis::cp, Axis::dp, Axis::pp));
}

TEST(GridLayout, ContextParallelSitsBetweenTensorAndDataByDefault) {
  // Megatron-Core's context_parallel_size docstring: 8 GPUs, tp 4, cp 2 -> cp groups
  // [0,4] [1,5] [2,6] [3,7].
  const GridLayout grid(8, spec(4, 2, 0, 1));
  EXPECT_EQ(grid.groups(Axis::cp), (Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  EXPECT_EQ(grid.groups(Axis::tp), (Groups{{0, 1, 2, 3}, {4, 5, 6, 7}}));
  // Megatron's "dp-cp" group, its gradients' group.
  EXPECT_EQ(grid.groups({Axis::dp, Axis::cp}), (Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));

  // 16 ranks, tp 2 cp 2 dp 2 pp 2: rank = tp + 2 cp + 4 dp + 8 pp.
  const GridLayout four(16, spec(2, 2, 2, 2));
  EXPECT_EQ(four.members(Axis::cp, 5), (std::vector<int>{5, 7}));
  EXPECT_EQ(four.members({Axis::cp, Axis::dp}, 5), (std::vector<int>{1, 3, 5, 7}));
  EXPECT_EQ(four.members(Axis::pp, 5), (std::vector<int>{5, 13}));
  EXPECT_EQ(four.group_index({Axis::cp, Axis::dp}, 13), 3);  // tp 1 + 2 * pp 1
  for (Axes axes : {Axes(Axis::tp), Axes(Axis::cp), Axes{Axis::cp, Axis::dp},
                    Axes{Axis::tp, Axis::cp, Axis::pp}}) {
    expect_partition(four, axes);
  }
}

TEST(GridLayout, ANonDefaultOrderMovesDataParallelOutermost) {
  // generate_masked_orthogonal_rank_groups' own example: order tp-pp-dp, 8 ranks of 2-2-2,
  // dp groups [[0, 4], [1, 5], [2, 6], [3, 7]].
  const GridLayout grid(8, spec(2, 1, 2, 2, {Axis::tp, Axis::pp, Axis::dp}));
  EXPECT_EQ(grid.describe(), "tp=2 cp=1 dp=2 pp=2 order tp-pp-dp");
  EXPECT_THAT(grid.order(), ElementsAre(Axis::tp, Axis::pp, Axis::dp, Axis::cp));
  EXPECT_EQ(grid.groups(Axis::dp), (Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  EXPECT_EQ(grid.groups(Axis::pp), (Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
  EXPECT_EQ(grid.groups(Axis::tp), (Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
  EXPECT_EQ(grid.coordinates(6), (GridLayout::Coordinates{0, 0, 1, 1}));
  // Its docstring's other example: sizes [tp, dp, pp] = [2, 3, 4], order tp-dp-pp, the dp
  // groups run [0, 2, 4], [1, 3, 5], ..., [19, 21, 23].
  const GridLayout wide(24, spec(2, 1, 3, 4, {Axis::tp, Axis::dp, Axis::pp}));
  const Groups dp = wide.groups(Axis::dp);
  ASSERT_EQ(dp.size(), 8u);
  EXPECT_EQ(dp[0], (std::vector<int>{0, 2, 4}));
  EXPECT_EQ(dp[1], (std::vector<int>{1, 3, 5}));
  EXPECT_EQ(dp[7], (std::vector<int>{19, 21, 23}));
}

TEST(GridLayout, PipelineNeighboursWrapAroundAsMegatronCoresDo) {
  const GridLayout grid(16, spec(2, 1, 2, 4));
  EXPECT_EQ(grid.next_stage_rank(1), 5);
  EXPECT_EQ(grid.previous_stage_rank(5), 1);
  EXPECT_EQ(grid.next_stage_rank(13), 1);  // last stage -> first
  EXPECT_EQ(grid.previous_stage_rank(2), 14);
  EXPECT_TRUE(grid.is_first_stage(3));
  EXPECT_TRUE(grid.is_last_stage(12));
  EXPECT_FALSE(grid.is_last_stage(8));
  const GridLayout flat(4, spec(2, 1, 2, 1));
  EXPECT_EQ(flat.next_stage_rank(3), 3);
  EXPECT_EQ(flat.previous_stage_rank(3), 3);
  EXPECT_TRUE(flat.is_first_stage(2) && flat.is_last_stage(2));
}

TEST(GridLayout, EmbeddingGroupsAreEachPipelinesFirstAndLastStage) {
  const GridLayout grid(16, spec(2, 1, 2, 4));
  EXPECT_EQ(grid.embedding_members(0), (std::vector<int>{0, 12}));
  EXPECT_EQ(grid.embedding_members(9), (std::vector<int>{1, 13}));  // 9 is stage 2
  EXPECT_EQ(grid.embedding_members(15), (std::vector<int>{3, 15}));
  EXPECT_EQ(grid.position_embedding_members(14), (std::vector<int>{2}));
  EXPECT_TRUE(grid.in_embedding_group(12));
  EXPECT_FALSE(grid.in_embedding_group(9));
  EXPECT_TRUE(grid.in_position_embedding_group(3));
  EXPECT_FALSE(grid.in_position_embedding_group(12));
  // With one stage the rank holds both embeddings alone.
  const GridLayout flat(4, spec(2, 1, 2, 1));
  EXPECT_EQ(flat.embedding_members(3), (std::vector<int>{3}));
  EXPECT_TRUE(flat.in_embedding_group(3));
}

TEST(GridLayout, DegreesThatDoNotMakeTheWorldFailNamingThemAndTheWorld) {
  expect_invalid_argument([] { GridLayout(8, spec(2, 1, 2, 4)); },
                          "tp=2 cp=1 dp=2 pp=4 make 16 ranks, but the world has 8");
  expect_invalid_argument([] { GridLayout(10, spec(4, 1, 0, 1)); },
                          "dp cannot be inferred: the world's 10 ranks are not a multiple of "
                          "tp*cp*pp (tp=4 cp=1 pp=1)");
  expect_invalid_argument([] { GridLayout(4, spec(1 << 30, 1 << 30, 1 << 30, 1 << 30)); },
                          "make more than 2^63 ranks, but the world has 4");
  expect_invalid_argument([] { GridLayout(0, spec(1, 1, 0, 1)); }, "at least 1 rank, not 0");
  expect_invalid_argument([] { GridLayout(4, spec(0, 1, 4, 1)); }, "tp=0 is not a degree");
}

TEST(GridLayout, OrdersMustNameEveryAxisThatMovesRanksOnce) {
  expect_invalid_argument(
      [] {
        GridLayout(8, spec(2, 1, 2, 2, {Axis::tp, Axis::dp}));
      },
      "order tp-dp leaves out pp, whose degree is 2");
  expect_invalid_argument([] { GridLayout(8, spec(2, 1, 2, 2, {})); },
                          "order '' leaves out tp, whose degree is 2");
  expect_invalid_argument(
      [] {
        GridLayout(8, spec(2, 1, 2, 2, {Axis::tp, Axis::dp, Axis::pp, Axis::dp}));
      },
      "names dp twice");
  // Degree-1 axes may be left out; they go last and move nothing.
  const GridLayout grid(4, spec(2, 1, 2, 1, {Axis::dp, Axis::tp}));
  EXPECT_EQ(grid.groups(Axis::tp), (Groups{{0, 2}, {1, 3}}));
  EXPECT_EQ(grid.describe(), "tp=2 cp=1 dp=2 pp=1 order dp-tp");
}

TEST(GridLayout, QueriesOutsideTheGridAreInvalidArguments) {
  const GridLayout grid(4, spec(2, 1, 2, 1));
  expect_invalid_argument([&] { grid.coordinates(4); }, "rank 4 is outside the grid's 4 ranks");
  expect_invalid_argument([&] { grid.members(Axis::tp, -1); }, "rank -1 is outside");
  expect_invalid_argument([&] { grid.rank_at({0, 0, 2, 0}); }, "coordinate dp=2 is outside");
  expect_invalid_argument([&] { grid.members(Axes{}, 0); }, "names none");
}

}  // namespace
}  // namespace braid::parallel
