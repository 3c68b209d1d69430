// The one collective interface: code written against a CollectiveGroup runs on a
// Communicator (here, threads as ranks) and would on an NcclCommunicator unchanged; both
// implement it (checked at compile time where braid is built with NCCL).
#include <numeric>
#include <type_traits>
#include <vector>

#include <gtest/gtest.h>

#include <braid/build_config.hpp>
#include <braid/collectives/collective_group.hpp>
#include <braid/collectives/communicator.hpp>
#if BRAID_WITH_CUDA
#include <braid/collectives/nccl_communicator.hpp>
#endif

#include "../support/rank_threads.hpp"

namespace braid::collectives {
namespace {

static_assert(std::is_base_of_v<CollectiveGroup, Communicator>);
#if BRAID_WITH_CUDA
static_assert(std::is_base_of_v<CollectiveGroup, NcclCommunicator>);
#endif

// A step a library would write once: average a vector, gather every rank's count, and pass
// a token around the ring with point-to-point calls.
struct StepResult {
  std::vector<float> averaged;
  std::vector<int> counts;
  int token = -1;
};

asio::awaitable<StepResult> library_step(CollectiveGroup& group, std::vector<float> values) {
  StepResult out;
  out.averaged = std::move(values);
  co_await group.all_reduce(Buffer(out.averaged), ReduceOp::avg);
  std::vector<int> mine{static_cast<int>(out.averaged.size()) + group.rank()};
  out.counts.assign(static_cast<std::size_t>(group.size()), 0);
  co_await group.all_gather(Buffer(mine), Buffer(out.counts));
  const int next = (group.rank() + 1) % group.size();
  const int previous = (group.rank() + group.size() - 1) % group.size();
  std::vector<int> token{group.rank() * 10};
  std::vector<int> arrived{-1};
  if (group.rank() % 2 == 0) {
    co_await group.send(Buffer(token), next);
    EXPECT_EQ(co_await group.recv(Buffer(arrived), previous), 1u);
  } else {
    EXPECT_EQ(co_await group.recv(Buffer(arrived), previous), 1u);
    co_await group.send(Buffer(token), next);
  }
  out.token = arrived[0];
  co_await group.barrier();
  co_return out;
}

TEST(CollectiveGroup, CodeWrittenAgainstTheInterfaceRunsOnACommunicator) {
  constexpr int kRanks = 4;
  std::vector<StepResult> results(kRanks);
  braid::testing::run_ranks(
      kRanks, [&](std::shared_ptr<Communicator> comm) -> asio::awaitable<void> {
        const int rank = comm->rank();
        CollectiveGroup& group = *comm;
        results[static_cast<std::size_t>(rank)] =
            co_await library_step(group, std::vector<float>(5, static_cast<float>(rank)));
      });
  for (int rank = 0; rank < kRanks; ++rank) {
    const StepResult& r = results[static_cast<std::size_t>(rank)];
    EXPECT_EQ(r.averaged, std::vector<float>(5, 1.5f)) << "rank " << rank;
    EXPECT_EQ(r.counts, (std::vector<int>{5, 6, 7, 8})) << "rank " << rank;
    EXPECT_EQ(r.token, ((rank + kRanks - 1) % kRanks) * 10) << "rank " << rank;
  }
}

}  // namespace
}  // namespace braid::collectives
