// All-reduce against the serial reference on worlds of threads-as-ranks
// (tests/support/rank_threads.hpp): every algorithm, dtype and reduce op at awkward counts,
// out of place and in place, and the hierarchical algorithm on ranks placed on pretend nodes.
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <braid/collectives/communicator.hpp>

#include "../support/rank_threads.hpp"
#include "../support/scoped_env.hpp"
#include "all_reduce_check.hpp"
#include "communicator_helpers.hpp"
#include "typed_values.hpp"

namespace braid::collectives {
namespace {

using braid::testing::run_ranks;
using testing::forcing;
using testing::Mismatch;
using testing::TypedVector;

constexpr DType kAllDtypes[] = {DType::f32, DType::f64, DType::f16, DType::bf16,
                                DType::i32, DType::i64, DType::u8};
constexpr ReduceOp kAllOps[] = {ReduceOp::sum, ReduceOp::avg, ReduceOp::min, ReduceOp::max,
                                ReduceOp::prod};
// 0, 1, primes, counts that do not divide by any world here, and one that takes several
// ring pieces per block.
constexpr std::size_t kCounts[] = {0, 1, 7, 13, 1031, 300007};

// One all-reduce out of place and one in place, on owned vectors.
asio::awaitable<void> check_all_reduce(Communicator& comm, DType dtype, ReduceOp op,
                                       std::size_t count, std::string_view label,
                                       Mismatch& mismatch) {
  TypedVector input(dtype, count);
  TypedVector output(dtype, count);
  co_await testing::check_all_reduce(comm, input, output, op, label, mismatch);
}

class AllReduce : public ::testing::TestWithParam<int> {};

TEST_P(AllReduce, EveryAlgorithmDtypeAndOpMatchesTheSerialReference) {
  const int world = GetParam();
  // Shared memory twice: reading peers' buffers directly, and copying through the segment.
  struct Variant {
    const char* algorithm;
    const char* single_copy;
  };
  for (const auto [algorithm, single_copy] :
       {Variant{"ring", "auto"}, Variant{"recursive_doubling", "auto"},
        Variant{"halving_doubling", "auto"}, Variant{"shared_memory", "1"},
        Variant{"shared_memory", "0"}}) {
    const braid::testing::ScopedEnv policy("BRAID_SHM_SINGLE_COPY", single_copy);
    Communicator::Options options;
    options.selection = forcing(fmt::format("allreduce:0-inf:{}", algorithm));
    run_ranks(
        world,
        [&](std::shared_ptr<Communicator> comm) -> asio::awaitable<void> {
          Mismatch mismatch;
          for (DType dtype : kAllDtypes) {
            for (ReduceOp op : kAllOps) {
              for (std::size_t count : kCounts) {
                if (count > 2000 && (world > 4 || (dtype != DType::f32 && dtype != DType::bf16)))
                  continue;
                co_await check_all_reduce(
                    *comm, dtype, op, count,
                    fmt::format("{} (single copy {})", algorithm, single_copy), mismatch);
              }
            }
          }
          EXPECT_EQ(mismatch.what, "");
        },
        options);
  }
}

INSTANTIATE_TEST_SUITE_P(Worlds, AllReduce, ::testing::Values(1, 2, 3, 4, 8),
                         [](const auto& info) { return fmt::format("ranks{}", info.param); });

// Ranks on pretend nodes (tests/support/rank_threads.hpp): 2 nodes x 2, uneven 2 + 1, round-robin
// placement, and 3 nodes x 2.
struct NodeLayout {
  const char* name;
  std::vector<int> node_of_rank;
};

class Hierarchical : public ::testing::TestWithParam<NodeLayout> {};

TEST_P(Hierarchical, AllReduceMatchesTheSerialReferenceForEveryDtypeAndOp) {
  const std::vector<int>& nodes = GetParam().node_of_rank;
  const int world = static_cast<int>(nodes.size());
  Communicator::Options options;
  options.selection = forcing("allreduce:0-inf:hierarchical");
  run_ranks(
      world,
      [&](std::shared_ptr<Communicator> comm) -> asio::awaitable<void> {
        EXPECT_EQ(comm->algorithm_for(CollectiveKind::all_reduce, 8), Algorithm::hierarchical);
        Mismatch mismatch;
        for (DType dtype : kAllDtypes) {
          for (ReduceOp op : kAllOps) {
            for (std::size_t count : kCounts) {
              if (count > 2000 && dtype != DType::f32) continue;
              co_await check_all_reduce(*comm, dtype, op, count, "hierarchical", mismatch);
            }
          }
        }
        EXPECT_EQ(mismatch.what, "");
      },
      options, nodes);
}

// The phase across nodes takes its algorithm from the selection table (its bytes, its
// ranks): each one the table can name gives the reference result.
TEST_P(Hierarchical, TheCrossNodePhaseRunsWhicheverAlgorithmTheTableNames) {
  const std::vector<int>& nodes = GetParam().node_of_rank;
  const int world = static_cast<int>(nodes.size());
  for (const char* across : {"ring", "recursive_doubling", "halving_doubling"}) {
    Communicator::Options options;
    options.selection = forcing(fmt::format("allreduce:0-inf:hierarchical#0-inf:{}", across));
    run_ranks(
        world,
        [&](std::shared_ptr<Communicator> comm) -> asio::awaitable<void> {
          Mismatch mismatch;
          for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg}) {
            for (std::size_t count : kCounts) {
              co_await check_all_reduce(*comm, DType::f32, op, count,
                                        fmt::format("hierarchical, {} across", across), mismatch);
            }
          }
          EXPECT_EQ(mismatch.what, "");
        },
        options, nodes);
  }
}

// 70001 elements: one chunk a block; 1000003: several, pipelined over the rails.
TEST_P(Hierarchical, TheBuiltInTableChoosesItForLargeVectorsAndEveryRankEndsBitIdentical) {
  const std::vector<int>& nodes = GetParam().node_of_rank;
  const int world = static_cast<int>(nodes.size());
  for (const std::size_t count : {std::size_t{70001}, std::size_t{1000003}}) {
    std::vector<std::vector<float>> results(static_cast<std::size_t>(world));
    run_ranks(
        world,
        [&](std::shared_ptr<Communicator> comm) -> asio::awaitable<void> {
          EXPECT_EQ(comm->algorithm_for(CollectiveKind::all_reduce, 1 << 20),
                    Algorithm::hierarchical);
          EXPECT_EQ(comm->algorithm_for(CollectiveKind::all_reduce, 8),
                    Algorithm::recursive_doubling);
          // Values whose float sums depend on the order they are added in.
          std::vector<float> data(count);
          for (std::size_t i = 0; i < data.size(); ++i) {
            data[i] =
                1.0f / static_cast<float>(
                           1 + (i * 7919 + static_cast<std::size_t>(comm->rank()) * 104729) % 1009);
          }
          co_await comm->all_reduce(Buffer(data), ReduceOp::sum);
          results[static_cast<std::size_t>(comm->rank())] = std::move(data);
        },
        {}, nodes);
    // Each element near the sum of the ranks' values, and bit-identical everywhere.
    for (std::size_t i = 0; i < count; i += 9973) {
      double want = 0;
      for (int r = 0; r < world; ++r) {
        want +=
            1.0 / static_cast<double>(1 + (i * 7919 + static_cast<std::size_t>(r) * 104729) % 1009);
      }
      EXPECT_NEAR(results[0][i], want, 1e-5 * want) << "element " << i << " of " << count;
    }
    for (int r = 1; r < world; ++r) {
      EXPECT_EQ(std::memcmp(results[0].data(), results[static_cast<std::size_t>(r)].data(),
                            results[0].size() * sizeof(float)),
                0)
          << "rank " << r << " differs from rank 0 (" << count << " elements)";
    }
  }
}

TEST_P(Hierarchical, SplitCommunicatorsPlanTheirOwnMembersNodes) {
  const std::vector<int>& nodes = GetParam().node_of_rank;
  const int world = static_cast<int>(nodes.size());
  run_ranks(
      world,
      [&](std::shared_ptr<Communicator> comm) -> asio::awaitable<void> {
        // One member per node in each half: nothing hierarchical left to do.
        auto by_local_index = co_await comm->split(comm->hierarchy().local_rank, comm->rank());
        EXPECT_FALSE(by_local_index->hierarchy().worth_it());
        EXPECT_EQ(by_local_index->hierarchy().nodes, by_local_index->size());
        std::vector<std::int64_t> one{comm->rank() + 1};
        co_await by_local_index->all_reduce(Buffer(one), ReduceOp::sum);
        std::int64_t expected = 0;
        for (int i = 0; i < by_local_index->size(); ++i)
          expected += by_local_index->world_rank(i) + 1;
        EXPECT_EQ(one[0], expected);
      },
      {}, nodes);
}

INSTANTIATE_TEST_SUITE_P(Layouts, Hierarchical,
                         ::testing::Values(NodeLayout{"two_by_two", {0, 0, 1, 1}},
                                           NodeLayout{"uneven", {0, 0, 1}},
                                           NodeLayout{"round_robin", {0, 1, 0, 1}},
                                           NodeLayout{"three_by_two", {0, 0, 1, 1, 2, 2}}),
                         [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace braid::collectives
