// Communicators split from a parent, on worlds of threads-as-ranks
// (tests/support/rank_threads.hpp): who joins which, running beside the parent, and the
// communicator ids coming back for reuse without mixing an old communicator's messages in.
#include <chrono>
#include <cstdint>
#include <memory>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include <braid/collectives/communicator.hpp>
#include <braid/core/error.hpp>

#include "../support/rank_threads.hpp"

namespace braid::collectives {
namespace {

using braid::testing::run_ranks;

TEST(Split, CommunicatorsSplitByColorRunConcurrentlyWithTheirParent) {
  constexpr int kWorld = 4;
  run_ranks(kWorld, [&](std::shared_ptr<Communicator> comm) -> asio::awaitable<void> {
    const int me = comm->rank();
    // Even and odd ranks, ordered by descending key; rank 3 joins none in the second split.
    auto parity = co_await comm->split(me % 2, -me);
    auto none = co_await comm->split(me == 3 ? -1 : 0, me);
    EXPECT_EQ(parity->size(), 2);
    EXPECT_EQ(parity->rank(), me < 2 ? 1 : 0);  // key -me: the higher world rank comes first
    EXPECT_NE(parity->id(), comm->id());
    if (me == 3) {
      EXPECT_EQ(none, nullptr);
    } else {
      EXPECT_EQ(none->size(), 3);
      EXPECT_NE(none->id(), parity->id());
    }
    std::vector<std::int64_t> in_pair{me}, in_world{me};
    auto pair_sum = comm->launch(parity->all_reduce(Buffer(in_pair), ReduceOp::sum));
    auto world_sum = comm->launch(comm->all_reduce(Buffer(in_world), ReduceOp::sum));
    while (!pair_sum.ready() || !world_sum.ready()) {
      co_await asio::post(comm->runtime().executor(), asio::use_awaitable);
    }
    pair_sum.get();
    world_sum.get();
    EXPECT_EQ(in_pair[0], me % 2 == 0 ? 0 + 2 : 1 + 3);
    EXPECT_EQ(in_world[0], 6);
  });
}

TEST(Subgroup, IsMadeByItsMembersAloneInTheOrderTheyName) {
  run_ranks(3, [&](std::shared_ptr<Communicator> comm) -> asio::awaitable<void> {
    const int me = comm->rank();
    if (me == 1) co_return;  // not a member: it calls nothing
    // World ranks 2 and 0, in that order: world rank 2 is the subgroup's rank 0. Twice,
    // the second a communicator of its own.
    // (Named lists: GCC 12 mishandles a braced list inside co_await.)
    const std::vector<int> members{2, 0};
    auto first = co_await comm->subgroup(members);
    auto second = co_await comm->subgroup(members);
    EXPECT_EQ(first->size(), 2);
    EXPECT_EQ(first->rank(), me == 2 ? 0 : 1);
    EXPECT_EQ(first->world_rank(0), 2);
    EXPECT_NE(first->id(), comm->id());
    EXPECT_NE(second->id(), first->id());
    std::vector<std::int64_t> values{me + 1};
    co_await first->all_reduce(Buffer(values), ReduceOp::sum);
    EXPECT_EQ(values[0], 4);  // world ranks 0 and 2: 1 + 3
    std::vector<std::int64_t> from_first{me == 2 ? 7 : 0};
    co_await second->broadcast(Buffer(from_first), 0);
    EXPECT_EQ(from_first[0], 7);
    // With a key of the caller's (what a rendezvous of its own drew), in either order.
    auto keyed = co_await comm->subgroup(members, "drawn-elsewhere");
    EXPECT_NE(keyed->id(), second->id());
    std::vector<std::int64_t> ones{1};
    co_await keyed->all_reduce(Buffer(ones), ReduceOp::sum);
    EXPECT_EQ(ones[0], 2);
  });
}

TEST(Subgroup, OfOneRankNeedsNoOtherMember) {
  run_ranks(2, [&](std::shared_ptr<Communicator> comm) -> asio::awaitable<void> {
    const std::vector<int> members{comm->rank()};
    auto alone = co_await comm->subgroup(members);
    EXPECT_EQ(alone->size(), 1);
    std::vector<std::int64_t> values{comm->rank() + 10};
    co_await alone->all_reduce(Buffer(values), ReduceOp::sum);
    EXPECT_EQ(values[0], comm->rank() + 10);
  });
}

TEST(Subgroup, RefusesAListWithoutThisRank) {
  run_ranks(2, [&](std::shared_ptr<Communicator> comm) -> asio::awaitable<void> {
    const int other = 1 - comm->rank();
    try {
      const std::vector<int> members{other};
      co_await comm->subgroup(members);
      ADD_FAILURE() << "a subgroup without this rank was made";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), Errc::invalid_argument);
      EXPECT_NE(std::string(e.what()).find("this rank"), std::string::npos) << e.what();
    }
  });
}

// The first member hands the subgroup's name out through the store: a member waiting for it
// learns at once that the first failed, or ended its program, before handing it out.
TEST(Subgroup, AMemberWaitingForTheNameFailsAtOnceWhenTheFirstMemberLeavesWithoutIt) {
  for (const bool throws : {true, false}) {
    const auto started = std::chrono::steady_clock::now();
    auto failures = braid::testing::run_ranks_collecting(
        2,
        [&](std::shared_ptr<Communicator> comm) -> asio::awaitable<void> {
          if (comm->rank() == 0) {
            if (throws) throw std::runtime_error("rank 0 gives up before the subgroup");
            co_return;  // ends its program
          }
          const std::vector<int> members{0, 1};
          co_await comm->subgroup(members);
        },
        {.timeout = std::chrono::seconds(30)});
    EXPECT_LT(std::chrono::steady_clock::now() - started, std::chrono::seconds(5));
    ASSERT_TRUE(failures[1]) << "rank 1 made a subgroup without rank 0";
    try {
      std::rethrow_exception(failures[1]);
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), Errc::peer_failed) << e.what();
      EXPECT_NE(std::string(e.what()).find(throws ? "rank 0 failed" : "rank 0 ended its program"),
                std::string::npos)
          << e.what();
    }
  }
}

TEST(Split, IdsComeBackOnceEveryMemberDestroyedItsCommunicatorSoSplittingNeverRunsOut) {
  // More splits than the message tag has ids for, each used and then dropped.
  constexpr int kSplits = 4200;
  static_assert(kSplits > static_cast<int>(transport::max_communicators));
  run_ranks(2, [&](std::shared_ptr<Communicator> comm) -> asio::awaitable<void> {
    const int me = comm->rank();
    std::set<std::uint32_t> ids;
    for (int i = 0; i < kSplits; ++i) {
      std::shared_ptr<Communicator> group = co_await comm->split(0, me);
      ids.insert(group->id());
      if (i % 500 == 0) {  // used, not only made
        std::vector<std::int32_t> value{me + i};
        co_await group->all_reduce(Buffer(value), ReduceOp::sum);
        EXPECT_EQ(value[0], 1 + 2 * i);
      }
    }
    // One alive at a time: the split after a destruction takes its id back.
    EXPECT_LE(ids.size(), 2u);
    EXPECT_EQ(comm->id(), 1u);
  });
}

TEST(Split, GroupsSplittingAtOnceNeverTakeTheSameFreedId) {
  // Two pairs split and drop in a loop, concurrently: their rank 0s take freed ids from
  // the one pool at the same moments, and must never both take the same.
  constexpr int kRounds = 200;
  run_ranks(4, [&](std::shared_ptr<Communicator> comm) -> asio::awaitable<void> {
    const int me = comm->rank();
    std::shared_ptr<Communicator> pair = co_await comm->split(me % 2, me);
    std::set<std::uint32_t> ids;
    for (int round = 0; round < kRounds; ++round) {
      std::shared_ptr<Communicator> child = co_await pair->split(0, me);
      std::vector<std::int64_t> mine{child->id()}, everyone(4);
      co_await comm->all_gather(Buffer(mine), Buffer(everyone));
      EXPECT_EQ(everyone[0], everyone[2]);
      EXPECT_EQ(everyone[1], everyone[3]);
      EXPECT_NE(everyone[0], everyone[1]) << "round " << round;
      ids.insert(child->id());
    }
    EXPECT_LE(ids.size(), 4u);  // reused, not drawn afresh each round
  });
}

TEST(Split, AReusedIdNeverDeliversAMessageItsLastCommunicatorLeftUnreceived) {
  run_ranks(2, [&](std::shared_ptr<Communicator> comm) -> asio::awaitable<void> {
    const int me = comm->rank();
    std::shared_ptr<Communicator> first = co_await comm->split(0, me);
    const std::uint32_t first_id = first->id();
    const std::int64_t first_serial = first->serial();
    std::vector<float> stale{1.0f};
    if (me == 0) co_await first->send(Buffer(stale), 1);  // rank 1 never receives it
    first.reset();
    std::shared_ptr<Communicator> second = co_await comm->split(0, me);
    EXPECT_EQ(second->id(), first_id);          // the id came back...
    EXPECT_NE(second->serial(), first_serial);  // ...the serial never does
    std::vector<float> fresh{me == 0 ? 2.0f : 0.0f};
    if (me == 0) {
      co_await second->send(Buffer(fresh), 1);
    } else {
      const std::size_t got = co_await second->recv(Buffer(fresh), 0);
      EXPECT_EQ(got, 1u);
      EXPECT_EQ(fresh[0], 2.0f);  // not the first communicator's 1.0
    }
  });
}

}  // namespace
}  // namespace braid::collectives
