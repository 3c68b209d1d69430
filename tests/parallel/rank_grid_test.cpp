// RankGrid (rank_grid.hpp) on 4 thread ranks (tests/support/rank_threads.hpp): its groups
// are communicators over the layout's members, made once; ranks that disagree on the grid
// or on which group to make fail together, each naming both sides, instead of hanging.
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <braid/collectives/communicator.hpp>
#include <braid/core/error.hpp>
#include <braid/parallel/rank_grid.hpp>

#include "../support/rank_threads.hpp"

namespace braid::parallel {
namespace {

using braid::testing::run_ranks;
using braid::testing::run_ranks_collecting;
using collectives::Communicator;
using ::testing::HasSubstr;

constexpr int kWorld = 4;
// Short enough that a hang fails the test, not the suite's timeout.
const Communicator::Options kOptions{.timeout = std::chrono::seconds(20)};

config::EnvLookup env_of(std::map<std::string, std::string> vars = {}) {
  return [vars = std::move(vars)](std::string_view name) -> std::optional<std::string> {
    auto it = vars.find(std::string(name));
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

// Sums `value` over `group` and returns the sum.
asio::awaitable<std::int64_t> sum_over(Communicator& group, std::int64_t value) {
  std::vector<std::int64_t> data{value};
  co_await group.all_reduce(Buffer(data), ReduceOp::sum);
  co_return data[0];
}

// Runs `body` on every rank; every rank must fail with a braid::Error of `code` whose
// message contains `needle`, with this rank and "RankGrid" as its context.
void expect_every_rank_fails(const braid::testing::RankBody& body, Errc code,
                             std::string_view needle) {
  const auto failures = run_ranks_collecting(kWorld, body, kOptions);
  for (int rank = 0; rank < kWorld; ++rank) {
    const auto& failure = failures[static_cast<std::size_t>(rank)];
    ASSERT_TRUE(failure) << "rank " << rank << " did not fail";
    try {
      std::rethrow_exception(failure);
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), code) << e.what();
      EXPECT_EQ(e.context().rank, rank);
      EXPECT_EQ(e.context().operation, "RankGrid");
      EXPECT_THAT(e.what(), HasSubstr(std::string(needle))) << rank;
    } catch (const std::exception& e) {
      ADD_FAILURE() << "rank " << rank << ": not a braid::Error: " << e.what();
    }
  }
}

TEST(RankGrid, TensorParallelGroupSumsOnlyTheTensorPartners) {
  run_ranks(
      kWorld,
      [](std::shared_ptr<Communicator> world) -> asio::awaitable<void> {
        const int me = world->rank();
        auto grid = co_await RankGrid::create(world, {.tp = 2, .dp = 2}, env_of());
        EXPECT_EQ(grid->describe(), "tp=2 cp=1 dp=2 pp=1 order tp-cp-dp-pp");
        EXPECT_EQ(grid->coordinate(Axis::tp), me % 2);
        EXPECT_EQ(grid->coordinate(Axis::dp), me / 2);
        EXPECT_EQ(grid->members(Axis::tp), (std::vector<int>{me - me % 2, me - me % 2 + 1}));

        auto tp = co_await grid->group(Axis::tp);
        if (!tp) {
          ADD_FAILURE() << "no communicator";
          co_return;
        }
        EXPECT_EQ(tp->size(), 2);
        EXPECT_EQ(tp->rank(), me % 2);  // members keep their world order
        EXPECT_EQ(co_await sum_over(*tp, 10 + me), me < 2 ? 10 + 11 : 12 + 13);

        auto dp = co_await grid->group("dp");
        EXPECT_EQ(co_await sum_over(*dp, 10 + me), me % 2 == 0 ? 10 + 12 : 11 + 13);
        auto everyone = co_await grid->group("dp-tp");
        EXPECT_EQ(everyone->size(), kWorld);

        // Degree 1 still makes a communicator: this rank alone.
        auto pp = co_await grid->group(Axis::pp);
        if (!pp) {
          ADD_FAILURE() << "no communicator";
          co_return;
        }
        EXPECT_EQ(pp->size(), 1);
        EXPECT_EQ(co_await sum_over(*pp, 10 + me), 10 + me);
      },
      kOptions);
}

TEST(RankGrid, AGroupIsMadeOnceAndTheSameCommunicatorReturnedAfter) {
  run_ranks(
      kWorld,
      [](std::shared_ptr<Communicator> world) -> asio::awaitable<void> {
        auto grid = co_await RankGrid::create(world, {.tp = 2}, env_of());  // dp inferred: 2
        EXPECT_EQ(grid->degree(Axis::dp), 2);
        auto first = co_await grid->group({Axis::tp, Axis::dp});
        auto again = co_await grid->group("dp-tp");  // the same set, named another way
        auto typed = co_await grid->group(Axes{Axis::dp, Axis::tp});
        EXPECT_EQ(first.get(), again.get());
        EXPECT_EQ(first.get(), typed.get());
        // Only a first request is collective: ranks asking twice still line up with the rest.
        if (world->rank() % 2 == 0) (void)co_await grid->group(Axis::tp);
        auto tp = co_await grid->group(Axis::tp);
        EXPECT_EQ(tp->size(), 2);
      },
      kOptions);
}

TEST(RankGrid, RanksAskingForDifferentGridsFailTogetherNamingBothGrids) {
  // Rank 1 asks for tp=2 dp=2, the others for tp=1 dp=4: a split on these would pair
  // rank 1 with a partner that never asked.
  expect_every_rank_fails(
      [](std::shared_ptr<Communicator> world) -> asio::awaitable<void> {
        GridOptions options{.tp = world->rank() == 1 ? 2 : 1};
        co_await RankGrid::create(world, options, env_of());
      },
      Errc::invalid_argument,
      "rank 1's grid tp=2 cp=1 dp=2 pp=1 order tp-cp-dp-pp differs from rank 0's tp=1 cp=1 "
      "dp=4 pp=1 order tp-cp-dp-pp");
}

TEST(RankGrid, OneRanksMalformedKnobFailsEveryRankNamingTheRankAndVariable) {
  expect_every_rank_fails(
      [](std::shared_ptr<Communicator> world) -> asio::awaitable<void> {
        auto env = world->rank() == 2 ? env_of({{"BRAID_TP", "two"}}) : env_of({{"BRAID_TP", "2"}});
        co_await RankGrid::create(world, {}, env);
      },
      Errc::invalid_environment,
      "rank 2 could not read its grid: BRAID_TP='two' is not an integer");
}

TEST(RankGrid, DegreesThatDoNotDivideTheWorldFailOnEveryRank) {
  expect_every_rank_fails(
      [](std::shared_ptr<Communicator> world) -> asio::awaitable<void> {
        co_await RankGrid::create(world, {.tp = 3}, env_of());
      },
      Errc::invalid_argument,
      "dp cannot be inferred: the world's 4 ranks are not a multiple of tp*cp*pp (tp=3");
  expect_every_rank_fails(
      [](std::shared_ptr<Communicator> world) -> asio::awaitable<void> {
        co_await RankGrid::create(world, {.tp = 2, .dp = 4}, env_of());
      },
      Errc::invalid_argument, "tp=2 cp=1 dp=4 pp=1 make 8 ranks, but the world has 4");
}

TEST(RankGrid, RanksAskingForDifferentGroupsFailTogetherAndMakeNoSplit) {
  run_ranks(
      kWorld,
      [](std::shared_ptr<Communicator> world) -> asio::awaitable<void> {
        const int me = world->rank();
        auto grid = co_await RankGrid::create(world, {.tp = 2, .dp = 2}, env_of());
        try {
          // Ranks 2 and 3 ask for dp while 0 and 1 ask for tp.
          (void)co_await grid->group(me < 2 ? Axis::tp : Axis::dp);
          ADD_FAILURE() << "rank " << me << " made a group the others did not ask for";
        } catch (const Error& e) {
          EXPECT_EQ(e.code(), Errc::desync) << e.what();
          // Ranks 2 and 3 name themselves, ranks 0 and 1 the first that differs.
          EXPECT_THAT(e.what(), HasSubstr(fmt::format("rank {} asked for the dp group while rank 0 "
                                                      "asked for the tp group (ranks 2 and 3 "
                                                      "differ from rank 0)",
                                                      me < 2 ? 2 : me)));
        }
        // Nothing was split, so the grid is still in step: the same request now succeeds.
        auto tp = co_await grid->group(Axis::tp);
        EXPECT_EQ(co_await sum_over(*tp, 1), 2);
      },
      kOptions);
}

TEST(RankGrid, AMalformedGroupNameOnOneRankFailsEveryRank) {
  run_ranks(
      kWorld,
      [](std::shared_ptr<Communicator> world) -> asio::awaitable<void> {
        const int me = world->rank();
        auto grid = co_await RankGrid::create(world, {.tp = 2, .dp = 2}, env_of());
        try {
          (void)co_await grid->group(me == 3 ? "tp-xp" : "tp");
          ADD_FAILURE() << "rank " << me << " made a group";
        } catch (const Error& e) {
          EXPECT_EQ(e.code(), Errc::invalid_argument) << e.what();
          EXPECT_THAT(e.what(), HasSubstr(me == 3 ? "'xp' is not an axis"
                                                  : "rank 3 asked for a group of no axis or a "
                                                    "malformed axis list"));
        }
      },
      kOptions);
}

TEST(RankGrid, EmbeddingGroupsHoldTheFirstAndLastStageAndNullElsewhere) {
  run_ranks(
      kWorld,
      [](std::shared_ptr<Communicator> world) -> asio::awaitable<void> {
        const int me = world->rank();
        auto grid = co_await RankGrid::create(world, {.pp = 4}, env_of());  // one pipeline
        EXPECT_EQ(grid->stage(), me);
        EXPECT_EQ(grid->is_first_stage(), me == 0);
        EXPECT_EQ(grid->is_last_stage(), me == 3);
        EXPECT_EQ(grid->next_stage_rank(), (me + 1) % kWorld);
        EXPECT_EQ(grid->previous_stage_rank(), (me + 3) % kWorld);
        EXPECT_EQ(grid->embedding_members(), (std::vector<int>{0, 3}));
        EXPECT_EQ(grid->position_embedding_members(), (std::vector<int>{0}));

        auto embedding = co_await grid->embedding_group();
        auto position = co_await grid->position_embedding_group();
        if (me == 0 || me == 3) {
          if (!embedding) {
            ADD_FAILURE() << "no communicator";
            co_return;
          }
          EXPECT_EQ(embedding->size(), 2);
          EXPECT_EQ(co_await sum_over(*embedding, me), 0 + 3);
        } else {
          EXPECT_EQ(embedding, nullptr);
        }
        if (me == 0) {
          if (!position) {
            ADD_FAILURE() << "no communicator";
            co_return;
          }
          EXPECT_EQ(position->size(), 1);
        } else {
          EXPECT_EQ(position, nullptr);
        }
        // A group this rank is not in is made too: asking again does not split again.
        EXPECT_EQ((co_await grid->embedding_group()).get(), embedding.get());
      },
      kOptions);
}

}  // namespace
}  // namespace braid::parallel
