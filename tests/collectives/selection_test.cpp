// The selection table (selection.hpp): the built-in rules cover every collective at every
// size and world, BRAID_ALGO overrides take precedence where they apply and fall through
// to the built-in rules elsewhere, malformed overrides are errors naming BRAID_ALGO and
// the problem, and the names of kinds and algorithms round-trip.
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <braid/collectives/selection.hpp>
#include <braid/core/error.hpp>

namespace braid::collectives {
namespace {

using ::testing::HasSubstr;

constexpr std::size_t KiB = 1024;
constexpr std::size_t MiB = 1024 * KiB;
constexpr std::size_t GiB = 1024 * MiB;

TEST(SelectionTable, BuiltInRulesCoverEveryCollectiveAtEverySizeAndWorld) {
  const SelectionTable table = SelectionTable::built_in();
  for (CollectiveKind kind : all_collective_kinds) {
    for (std::size_t bytes : {std::size_t{0}, std::size_t{8}, 64 * KiB, 1 * MiB, 1 * GiB}) {
      for (int world = 1; world <= 64; ++world) {
        Algorithm chosen{};
        ASSERT_NO_THROW(chosen = table.select(kind, bytes, world))
            << to_string(kind) << " of " << bytes << " bytes on " << world << " ranks";
        EXPECT_TRUE(implements(kind, chosen)) << to_string(kind) << " of " << bytes << " bytes on "
                                              << world << " ranks chose " << to_string(chosen);
      }
    }
  }
}

TEST(SelectionTable, BuiltInRulesOnlyNameAlgorithmsBraidHasForTheirKind) {
  const SelectionTable table = SelectionTable::built_in();
  for (const SelectionRule& rule : table.rules()) {
    EXPECT_TRUE(implements(rule.kind, rule.algorithm))
        << to_string(rule.kind) << " " << to_string(rule.algorithm);
  }
}

TEST(SelectionTable, AnEmptyOverrideLeavesTheBuiltInRules) {
  EXPECT_EQ(SelectionTable::with_overrides("").rules().size(),
            SelectionTable::built_in().rules().size());
  EXPECT_EQ(SelectionTable::with_overrides(" ; ").rules().size(),
            SelectionTable::built_in().rules().size());
}

TEST(SelectionTable, OverridesPickTheirAlgorithmForTheSizesTheyCover) {
  const auto table =
      SelectionTable::with_overrides("allreduce:0-64k:recursive_doubling#64k-inf:ring");
  EXPECT_EQ(table.select(CollectiveKind::all_reduce, 1 * KiB, 4), Algorithm::recursive_doubling);
  EXPECT_EQ(table.select(CollectiveKind::all_reduce, 1 * MiB, 4), Algorithm::ring);
  // Where the built-in table would choose otherwise: shared memory from 16k on one node,
  // halving_doubling from 16k to 1m across nodes.
  EXPECT_EQ(SelectionTable::built_in().select(CollectiveKind::all_reduce, 32 * KiB, 4),
            Algorithm::shared_memory);
  EXPECT_EQ(SelectionTable::built_in().select(CollectiveKind::all_reduce, 32 * KiB, 4,
                                              {.one_node = false}),
            Algorithm::halving_doubling);
  EXPECT_EQ(SelectionTable::built_in().select(CollectiveKind::all_reduce, 4 * MiB, 4,
                                              {.one_node = false}),
            Algorithm::ring);
  EXPECT_EQ(table.select(CollectiveKind::all_reduce, 32 * KiB, 4), Algorithm::recursive_doubling);
  EXPECT_EQ(table.select(CollectiveKind::all_reduce, 256 * KiB, 4), Algorithm::ring);
  // Ranges are [lo, hi): 64k itself belongs to the second range.
  EXPECT_EQ(table.select(CollectiveKind::all_reduce, 64 * KiB - 1, 4),
            Algorithm::recursive_doubling);
  EXPECT_EQ(table.select(CollectiveKind::all_reduce, 64 * KiB, 4), Algorithm::ring);
}

TEST(SelectionTable, HierarchicalAllReduceIsChosenOnlyWhenMembersGroupIntoSeveralNodes) {
  const SelectionTable table = SelectionTable::built_in();
  const MemberPlacement two_by_two{.one_node = false, .grouped_nodes = true};
  const MemberPlacement one_per_node{.one_node = false, .grouped_nodes = false};
  EXPECT_EQ(table.select(CollectiveKind::all_reduce, 1 * MiB, 4, two_by_two),
            Algorithm::hierarchical);
  EXPECT_EQ(table.select(CollectiveKind::all_reduce, 64 * KiB, 4, two_by_two),
            Algorithm::hierarchical);
  EXPECT_EQ(table.select(CollectiveKind::all_reduce, 1 * MiB, 4, one_per_node), Algorithm::ring);
  EXPECT_EQ(table.select(CollectiveKind::all_reduce, 1 * MiB, 4), Algorithm::shared_memory);
  // Latency-bound sizes stay with recursive doubling, and other collectives are unaffected.
  EXPECT_EQ(table.select(CollectiveKind::all_reduce, 8, 4, two_by_two),
            Algorithm::recursive_doubling);
  EXPECT_EQ(table.select(CollectiveKind::broadcast, 64 * KiB, 4, two_by_two),
            Algorithm::binomial_tree);
  // Large broadcasts beyond one node go down the chain, on one node through shared memory.
  EXPECT_EQ(table.select(CollectiveKind::broadcast, 1 * MiB, 4, two_by_two), Algorithm::ring);
  EXPECT_EQ(table.select(CollectiveKind::broadcast, 1 * MiB, 4, one_per_node), Algorithm::ring);
  EXPECT_EQ(table.select(CollectiveKind::broadcast, 1 * MiB, 4), Algorithm::shared_memory);
  // An override may name it, and it still applies only where it can run.
  const auto forced = SelectionTable::with_overrides("allreduce:0-inf:hierarchical");
  EXPECT_EQ(forced.select(CollectiveKind::all_reduce, 8, 4, two_by_two), Algorithm::hierarchical);
  EXPECT_EQ(forced.select(CollectiveKind::all_reduce, 8, 4, one_per_node),
            Algorithm::recursive_doubling);
}

// Reduce-scatter and all-gather go hierarchical at every size where every node holds as
// many members (rails line up), and stay on the ring where nodes are uneven or hold one.
TEST(SelectionTable, HierarchicalReduceScatterAndAllGatherNeedEvenNodes) {
  const SelectionTable table = SelectionTable::built_in();
  const MemberPlacement even{.one_node = false, .grouped_nodes = true, .even_nodes = true};
  const MemberPlacement uneven{.one_node = false, .grouped_nodes = true, .even_nodes = false};
  const MemberPlacement one_per_node{.one_node = false};
  for (CollectiveKind kind : {CollectiveKind::reduce_scatter, CollectiveKind::all_gather}) {
    for (std::size_t bytes : {std::size_t{8}, 64 * MiB}) {
      EXPECT_EQ(table.select(kind, bytes, 4, even), Algorithm::hierarchical) << to_string(kind);
      EXPECT_EQ(table.select(kind, bytes, 3, uneven), Algorithm::ring) << to_string(kind);
      EXPECT_EQ(table.select(kind, bytes, 4, one_per_node), Algorithm::ring) << to_string(kind);
      EXPECT_EQ(table.select(kind, bytes, 4), Algorithm::shared_memory) << to_string(kind);
    }
  }
  // The uneven all-reduce keeps its leaders' shape.
  EXPECT_EQ(table.select(CollectiveKind::all_reduce, 1 * MiB, 3, uneven), Algorithm::hierarchical);
  const auto forced = SelectionTable::with_overrides("allgather:0-inf:hierarchical");
  EXPECT_EQ(forced.select(CollectiveKind::all_gather, 8, 3, uneven), Algorithm::ring);
}

TEST(SelectionTable, SmallAllReducesAndBarriersGoThroughSharedMemoryOnOneNodeOnly) {
  const SelectionTable table = SelectionTable::built_in();
  const MemberPlacement across{.one_node = false};
  // On one node, shared memory at every size (up to 16k one wait through the inline
  // slots); across nodes recursive doubling to 16k.
  EXPECT_EQ(table.select(CollectiveKind::all_reduce, 8, 2), Algorithm::shared_memory);
  EXPECT_EQ(table.select(CollectiveKind::all_reduce, 4 * KiB, 8), Algorithm::shared_memory);
  EXPECT_EQ(table.select(CollectiveKind::all_reduce, 16 * KiB, 8), Algorithm::shared_memory);
  EXPECT_EQ(table.select(CollectiveKind::all_reduce, 8, 2, across), Algorithm::recursive_doubling);
  EXPECT_EQ(table.select(CollectiveKind::all_reduce, 8 * KiB, 2, across),
            Algorithm::recursive_doubling);
  EXPECT_EQ(table.select(CollectiveKind::barrier, 0, 4), Algorithm::shared_memory);
  EXPECT_EQ(table.select(CollectiveKind::barrier, 0, 4, across), Algorithm::dissemination);
}

TEST(SelectionTable, KindsAreAcceptedWithAndWithoutTheUnderscore) {
  for (const char* spelling : {"allreduce:0-inf:ring", "all_reduce:0-inf:ring"}) {
    const auto table = SelectionTable::with_overrides(spelling);
    EXPECT_EQ(table.select(CollectiveKind::all_reduce, 8, 2), Algorithm::ring) << spelling;
  }
  const auto table =
      SelectionTable::with_overrides("alltoall:0-inf:pairwise;reducescatter:0-inf:ring");
  EXPECT_EQ(table.rules().front().kind, CollectiveKind::all_to_all);
  EXPECT_EQ(table.rules()[1].kind, CollectiveKind::reduce_scatter);
}

TEST(SelectionTable, SeveralKindsAndSpacesAroundTheParts) {
  const auto table = SelectionTable::with_overrides(
      " allreduce : 0 - 1k : ring ; broadcast:0-inf:binomial_tree ;");
  EXPECT_EQ(table.select(CollectiveKind::all_reduce, 512, 2), Algorithm::ring);
  EXPECT_EQ(table.select(CollectiveKind::broadcast, 512, 2), Algorithm::binomial_tree);
  EXPECT_EQ(table.rules().size(), SelectionTable::built_in().rules().size() + 2);
}

TEST(SelectionTable, AWorldLimitedRuleAppliesOnlyToWorldsInItsRange) {
  const auto table = SelectionTable::with_overrides("allreduce:0-inf:ring@3-8");
  // 8k on one node, the built-in table: shared_memory.
  EXPECT_EQ(table.select(CollectiveKind::all_reduce, 8 * KiB, 2), Algorithm::shared_memory);
  EXPECT_EQ(table.select(CollectiveKind::all_reduce, 8 * KiB, 3), Algorithm::ring);
  EXPECT_EQ(table.select(CollectiveKind::all_reduce, 8 * KiB, 8), Algorithm::ring);
  EXPECT_EQ(table.select(CollectiveKind::all_reduce, 8 * KiB, 9), Algorithm::shared_memory);

  const auto single = SelectionTable::with_overrides("allreduce:0-inf:ring@4");
  EXPECT_EQ(single.select(CollectiveKind::all_reduce, 8 * KiB, 3), Algorithm::shared_memory);
  EXPECT_EQ(single.select(CollectiveKind::all_reduce, 8 * KiB, 4), Algorithm::ring);
  EXPECT_EQ(single.select(CollectiveKind::all_reduce, 8 * KiB, 5), Algorithm::shared_memory);

  const auto open = SelectionTable::with_overrides("allreduce:0-inf:ring@16-inf");
  EXPECT_EQ(open.select(CollectiveKind::all_reduce, 8 * KiB, 15), Algorithm::shared_memory);
  EXPECT_EQ(open.select(CollectiveKind::all_reduce, 8 * KiB, 64), Algorithm::ring);
}

TEST(SelectionTable, OverridesFallThroughToTheBuiltInRulesWhereTheyDoNotApply) {
  const auto table = SelectionTable::with_overrides("allreduce:0-1k:ring");
  const auto built_in = SelectionTable::built_in();
  EXPECT_EQ(table.select(CollectiveKind::all_reduce, 512, 4), Algorithm::ring);
  for (std::size_t bytes : {2 * KiB, 64 * KiB, 4 * MiB}) {
    EXPECT_EQ(table.select(CollectiveKind::all_reduce, bytes, 4),
              built_in.select(CollectiveKind::all_reduce, bytes, 4))
        << bytes;
  }
  // Other kinds are untouched.
  for (CollectiveKind kind : all_collective_kinds) {
    if (kind == CollectiveKind::all_reduce) continue;
    EXPECT_EQ(table.select(kind, 512, 4), built_in.select(kind, 512, 4)) << to_string(kind);
  }
}

TEST(SelectionTable, TheFirstMatchingOverrideWins) {
  const auto table =
      SelectionTable::with_overrides("allreduce:0-inf:ring@2;allreduce:0-inf:halving_doubling");
  EXPECT_EQ(table.select(CollectiveKind::all_reduce, 8, 2), Algorithm::ring);
  EXPECT_EQ(table.select(CollectiveKind::all_reduce, 8, 3), Algorithm::halving_doubling);
}

TEST(SelectionTable, ATableWithoutAMatchingRuleIsAnInvalidArgumentNamingTheCall) {
  // Tables from built_in() and with_overrides() have no gaps; a default-constructed one
  // has no rules at all.
  const SelectionTable empty;
  try {
    empty.select(CollectiveKind::barrier, 0, 2);
    FAIL() << "expected an Error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::invalid_argument);
    EXPECT_THAT(e.what(), HasSubstr("no algorithm selected for barrier of 0 bytes on 2 ranks"));
  }
}

struct Malformed {
  const char* text;
  const char* problem;  // a part of the message naming what is wrong
};

class MalformedOverride : public ::testing::TestWithParam<Malformed> {};

TEST_P(MalformedOverride, IsAnInvalidEnvironmentErrorNamingBraidAlgoAndTheProblem) {
  const Malformed& c = GetParam();
  try {
    SelectionTable::with_overrides(c.text);
    FAIL() << "'" << c.text << "' was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::invalid_environment) << e.what();
    EXPECT_THAT(e.what(), HasSubstr("BRAID_ALGO"));
    EXPECT_THAT(e.what(), HasSubstr(c.problem));
  }
}

INSTANTIATE_TEST_SUITE_P(
    Cases, MalformedOverride,
    ::testing::Values(Malformed{"allreduc:0-inf:ring", "unknown collective 'allreduc'"},
                      Malformed{"allreduce:0-inf:rign", "unknown algorithm 'rign'"},
                      Malformed{"allreduce:0-inf", "unknown algorithm ''"},
                      Malformed{"barrier:0-inf:ring", "braid has no ring barrier"},
                      Malformed{"allgather:0-inf:recursive_doubling",
                                "braid has no recursive_doubling all_gather"},
                      Malformed{"allreduce:0-12q:ring", "'12q' is not a size"},
                      Malformed{"allreduce:k-1m:ring", "'' is not a size"},
                      Malformed{"allreduce:-1-1m:ring", "'' is not a size"},
                      Malformed{"allreduce:64k-1k:ring", "the range '64k-1k' is empty"},
                      Malformed{"allreduce:1k-1k:ring", "the range '1k-1k' is empty"},
                      Malformed{"allreduce:ring", "'ring' is not a range lo-hi"},
                      Malformed{"allreduce:0:ring", "'0' is not a range lo-hi"},
                      Malformed{"allreduce", "'allreduce' has no ranges"},
                      Malformed{"allreduce:", "has no ranges"},
                      Malformed{"allreduce:0-inf:ring@0-4", "'0' is not a world size"},
                      Malformed{"allreduce:0-inf:ring@x", "'x' is not a world size"},
                      Malformed{"allreduce:0-inf:ring@8-3", "the world range '8-3' is empty"},
                      // A later group's error is still reported.
                      Malformed{"allreduce:0-inf:ring;gather:0-inf:ring",
                                "braid has no ring gather"}),
    [](const auto& info) { return "case" + std::to_string(info.index); });

TEST(SelectionTable, AMalformedOverrideQuotesTheWholeString) {
  const std::string text = "allreduce:0-1k:ring;reduce:0-inf:ring";
  try {
    SelectionTable::with_overrides(text);
    FAIL() << "accepted";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("BRAID_ALGO='" + text + "'"));
  }
}

// The words of each line of describe(), header first.
std::vector<std::vector<std::string>> words_by_line(const std::string& text) {
  std::vector<std::vector<std::string>> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    std::istringstream words(line);
    std::vector<std::string>& out = lines.emplace_back();
    for (std::string word; words >> word;) out.push_back(word);
  }
  return lines;
}

TEST(SelectionTable, DescribeListsEveryRuleOverridesFirst) {
  const auto table = SelectionTable::with_overrides(
      "allreduce:0-64k:recursive_doubling#64k-inf:ring@3-8;barrier:0-100:dissemination@2-inf");
  const auto lines = words_by_line(table.describe());
  ASSERT_EQ(lines.size(), table.rules().size() + 1) << table.describe();
  EXPECT_EQ(lines[0], (std::vector<std::string>{"collective", "from", "to", "ranks", "algorithm"}));
  EXPECT_EQ(lines[1],
            (std::vector<std::string>{"all_reduce", "0", "64k", "any", "recursive_doubling"}));
  EXPECT_EQ(lines[2], (std::vector<std::string>{"all_reduce", "64k", "inf", "3-8", "ring"}));
  EXPECT_EQ(lines[3], (std::vector<std::string>{"barrier", "0", "100", "2-inf", "dissemination"}));
  // Then the built-in rules, each kind at least once.
  std::set<std::string> kinds;
  for (std::size_t i = 4; i < lines.size(); ++i) {
    ASSERT_EQ(lines[i].size(), 5U) << table.describe();
    kinds.insert(lines[i][0]);
  }
  for (CollectiveKind kind : all_collective_kinds) {
    EXPECT_TRUE(kinds.contains(std::string(to_string(kind)))) << to_string(kind);
  }
}

TEST(SelectionTable, DescribeOfTheBuiltInTableNamesEachRulesAlgorithm) {
  const auto table = SelectionTable::built_in();
  const auto lines = words_by_line(table.describe());
  ASSERT_EQ(lines.size(), table.rules().size() + 1);
  for (std::size_t i = 0; i < table.rules().size(); ++i) {
    EXPECT_EQ(lines[i + 1].front(), to_string(table.rules()[i].kind));
    EXPECT_EQ(lines[i + 1].back(), to_string(table.rules()[i].algorithm));
  }
}

TEST(Names, AlgorithmsRoundTripThroughTheirNames) {
  std::set<std::string_view> seen;
  for (Algorithm algorithm : all_algorithms) {
    const std::string_view name = to_string(algorithm);
    EXPECT_NE(name, "?");
    EXPECT_TRUE(seen.insert(name).second) << name << " twice";
    EXPECT_EQ(parse_algorithm(name), algorithm) << name;
  }
  EXPECT_EQ(parse_algorithm(""), std::nullopt);
  EXPECT_EQ(parse_algorithm("Ring"), std::nullopt);
  EXPECT_EQ(parse_algorithm("ring "), std::nullopt);
  EXPECT_EQ(parse_algorithm("recursivedoubling"), std::nullopt);
}

TEST(Names, CollectiveKindsRoundTripWithAndWithoutUnderscores) {
  std::set<std::string_view> seen;
  for (CollectiveKind kind : all_collective_kinds) {
    const std::string_view name = to_string(kind);
    EXPECT_NE(name, "?");
    EXPECT_TRUE(seen.insert(name).second) << name << " twice";
    EXPECT_EQ(parse_collective_kind(name), kind) << name;
    std::string squeezed(name);
    std::erase(squeezed, '_');
    EXPECT_EQ(parse_collective_kind(squeezed), kind) << squeezed;
  }
  EXPECT_EQ(parse_collective_kind(""), std::nullopt);
  EXPECT_EQ(parse_collective_kind("all"), std::nullopt);
  EXPECT_EQ(parse_collective_kind("all_reduce_"), std::nullopt);
  EXPECT_EQ(parse_collective_kind("allreducee"), std::nullopt);
  EXPECT_EQ(parse_collective_kind("AllReduce"), std::nullopt);
}

}  // namespace
}  // namespace braid::collectives
