// Many collectives launched before any is awaited, on a world of threads-as-ranks
// (tests/support/rank_threads.hpp): each completes with its own result whatever the order
// they are awaited in.
#include <cstdint>
#include <memory>
#include <vector>

#include <gtest/gtest.h>

#include <braid/collectives/communicator.hpp>

#include "../support/rank_threads.hpp"

namespace braid::collectives {
namespace {

using braid::testing::run_ranks;

TEST(InFlight, ManyCollectivesIssuedTogetherCompleteInAnyOrderWithTheRightResults) {
  constexpr int kWorld = 4;
  constexpr int kBuckets = 24;
  run_ranks(kWorld, [&](std::shared_ptr<Communicator> comm) -> asio::awaitable<void> {
    std::vector<std::vector<float>> buckets;
    for (int b = 0; b < kBuckets; ++b) {
      buckets.emplace_back(static_cast<std::size_t>(1 + b * 997),
                           static_cast<float>(comm->rank() + b));
    }
    std::vector<std::int64_t> broadcasted(100, comm->rank() == 2 ? 42 : 0);
    // Issue everything first (the order every rank agrees on), then await.
    std::vector<Future<void>> pending;
    for (auto& bucket : buckets)
      pending.push_back(comm->launch(comm->all_reduce(Buffer(bucket), ReduceOp::sum)));
    pending.push_back(comm->launch(comm->broadcast(Buffer(broadcasted), 2)));
    pending.push_back(comm->launch(comm->barrier()));
    for (auto it = pending.rbegin(); it != pending.rend(); ++it) {
      // Waiting on the runtime thread itself would deadlock: poll instead.
      while (!it->ready()) co_await asio::post(comm->runtime().executor(), asio::use_awaitable);
      it->get();
    }
    for (int b = 0; b < kBuckets; ++b) {
      const float expected = static_cast<float>(0 + 1 + 2 + 3 + kWorld * b);
      EXPECT_EQ(buckets[static_cast<std::size_t>(b)].front(), expected) << "bucket " << b;
      EXPECT_EQ(buckets[static_cast<std::size_t>(b)].back(), expected) << "bucket " << b;
    }
    EXPECT_EQ(broadcasted, std::vector<std::int64_t>(100, 42));
  });
}

}  // namespace
}  // namespace braid::collectives
