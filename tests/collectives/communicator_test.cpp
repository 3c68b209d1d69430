// The Communicator's collectives against serial references, on worlds of threads-as-ranks
// (tests/support/rank_threads.hpp): every op, dtype and reduce op, awkward counts, in-place forms,
// operations in flight together, split communicators, and the errors for bad input.
#include <array>
#include <cstring>
#include <limits>
#include <map>
#include <numeric>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <string_view>

#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <braid/collectives/communicator.hpp>
#include <braid/core/error.hpp>
#include <braid/trace/recorder.hpp>

#include "../support/expect_error.hpp"
#include "../support/scoped_env.hpp"
#include "all_reduce_check.hpp"
#include "../support/rank_threads.hpp"
#include "typed_values.hpp"

namespace braid::collectives {
namespace {

using ::testing::HasSubstr;
using testing::Mismatch;
using braid::testing::run_ranks;
using braid::testing::run_ranks_collecting;
using testing::TypedVector;

constexpr DType kAllDtypes[] = {DType::f32, DType::f64, DType::f16, DType::bf16,
                                DType::i32, DType::i64, DType::u8};
constexpr ReduceOp kAllOps[] = {ReduceOp::sum, ReduceOp::avg, ReduceOp::min, ReduceOp::max,
                                ReduceOp::prod};
// 0, 1, primes, counts that do not divide by any world here, and one that takes several
// ring pieces per block.
constexpr std::size_t kCounts[] = {0, 1, 7, 13, 1031, 300007};

std::shared_ptr<const SelectionTable> forcing(std::string_view rules) {
  return std::make_shared<const SelectionTable>(SelectionTable::with_overrides(rules));
}

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

TEST_P(Hierarchical, TheBuiltInTableChoosesItForLargeVectorsAndEveryRankEndsBitIdentical) {
  const std::vector<int>& nodes = GetParam().node_of_rank;
  const int world = static_cast<int>(nodes.size());
  std::vector<std::vector<float>> results(static_cast<std::size_t>(world));
  run_ranks(
      world,
      [&](std::shared_ptr<Communicator> comm) -> asio::awaitable<void> {
        EXPECT_EQ(comm->algorithm_for(CollectiveKind::all_reduce, 1 << 20),
                  Algorithm::hierarchical);
        EXPECT_EQ(comm->algorithm_for(CollectiveKind::all_reduce, 8),
                  Algorithm::recursive_doubling);
        // Values whose float sums depend on the order they are added in.
        std::vector<float> data(70001);
        for (std::size_t i = 0; i < data.size(); ++i) {
          data[i] =
              1.0f / static_cast<float>(
                         1 + (i * 7919 + static_cast<std::size_t>(comm->rank()) * 104729) % 1009);
        }
        co_await comm->all_reduce(Buffer(data), ReduceOp::sum);
        results[static_cast<std::size_t>(comm->rank())] = std::move(data);
      },
      {}, nodes);
  for (int r = 1; r < world; ++r) {
    EXPECT_EQ(std::memcmp(results[0].data(), results[static_cast<std::size_t>(r)].data(),
                          results[0].size() * sizeof(float)),
              0)
        << "rank " << r << " differs from rank 0";
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

// A world size, and how data moves: by the message algorithms (shared memory refused, so
// the shared-memory rules fall back), or every collective reading peers' buffers directly.
struct Movement {
  int world;
  bool single_copy;
};

class DataMovement : public ::testing::TestWithParam<Movement> {};

// value of rank r's element i in the movement tests: unique per (rank, index).
double tagged(int rank, std::size_t i) {
  return static_cast<double>(rank * 100 + static_cast<int>(i % 97));
}

TEST_P(DataMovement, EveryOpMatchesTheSerialReferenceForEveryRootAndDtype) {
  const auto [world, single_copy] = GetParam();
  const braid::testing::ScopedEnv policy("BRAID_SHM_SINGLE_COPY", single_copy ? "1" : "0");
  Communicator::Options options;
  if (single_copy) {
    options.selection = forcing(
        "reducescatter:0-inf:shared_memory;allgather:0-inf:shared_memory;"
        "broadcast:0-inf:shared_memory;reduce:0-inf:shared_memory;gather:0-inf:shared_memory;"
        "scatter:0-inf:shared_memory;alltoall:0-inf:shared_memory");
  }
  run_ranks(
      world,
      [&](std::shared_ptr<Communicator> comm) -> asio::awaitable<void> {
        Mismatch m;
        const int me = comm->rank();
        const auto P = static_cast<std::size_t>(world);
        for (DType dtype : {DType::f32, DType::i64, DType::u8, DType::bf16}) {
          // u8 and bf16 hold rank * 100 + i % 97 only for small worlds: use a narrower tag.
          auto value = [&](int rank, std::size_t i) {
            const double v = tagged(rank, i);
            return dtype == DType::u8 || dtype == DType::bf16 ? std::fmod(v, 128.0) : v;
          };
          for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{5}, std::size_t{1031},
                                std::size_t{70001}}) {
            const std::string where = fmt::format("{} n {} rank {}", to_string(dtype), n, me);
            // reduce_scatter: block r of the sum.
            {
              TypedVector in(dtype, n * P), out(dtype, n);
              for (std::size_t i = 0; i < n * P; ++i)
                in.set(i, testing::value_for(me, i, dtype, ReduceOp::sum));
              co_await comm->reduce_scatter(in.buffer(), out.buffer(), ReduceOp::sum);
              for (std::size_t i = 0; i < n; ++i) {
                m.check(out, i,
                        testing::reference(world, static_cast<std::size_t>(me) * n + i, dtype,
                                           ReduceOp::sum),
                        [&] { return "reduce_scatter " + where; });
              }
              co_await comm->reduce_scatter(in.buffer(),
                                            ReduceOp::max);  // in place, after the above
            }
            // all_gather, out of place and in place.
            {
              TypedVector in(dtype, n), out(dtype, n * P);
              for (std::size_t i = 0; i < n; ++i) in.set(i, value(me, i));
              co_await comm->all_gather(in.buffer(), out.buffer());
              for (std::size_t r = 0; r < P; ++r) {
                for (std::size_t i = 0; i < n; ++i)
                  m.check(out, r * n + i, value(static_cast<int>(r), i),
                          [&] { return "all_gather " + where; });
              }
              TypedVector data(dtype, n * P);
              for (std::size_t i = 0; i < n; ++i)
                data.set(static_cast<std::size_t>(me) * n + i, value(me, i));
              co_await comm->all_gather(data.buffer());
              for (std::size_t r = 0; r < P; ++r) {
                for (std::size_t i = 0; i < n; ++i)
                  m.check(data, r * n + i, value(static_cast<int>(r), i),
                          [&] { return "all_gather in place " + where; });
              }
            }
            for (int root = 0; root < world; ++root) {
              const std::string rooted = fmt::format("{} root {}", where, root);
              // broadcast
              {
                TypedVector data(dtype, n);
                for (std::size_t i = 0; i < n; ++i) data.set(i, me == root ? value(root, i) : -1);
                co_await comm->broadcast(data.buffer(), root);
                for (std::size_t i = 0; i < n; ++i)
                  m.check(data, i, value(root, i), [&] { return "broadcast " + rooted; });
              }
              // reduce
              {
                TypedVector in(dtype, n), out(dtype, n);
                for (std::size_t i = 0; i < n; ++i)
                  in.set(i, testing::value_for(me, i, dtype, ReduceOp::sum));
                co_await comm->reduce(in.buffer(), out.buffer(), ReduceOp::sum, root);
                if (me == root) {
                  for (std::size_t i = 0; i < n; ++i)
                    m.check(out, i, testing::reference(world, i, dtype, ReduceOp::sum),
                            [&] { return "reduce " + rooted; });
                }
                for (std::size_t i = 0; i < n; ++i)
                  m.check(in, i, testing::value_for(me, i, dtype, ReduceOp::sum),
                          [&] { return "reduce leaves the input " + rooted; });
                co_await comm->reduce(in.buffer(), ReduceOp::sum, root);  // in place
                if (me == root) {
                  for (std::size_t i = 0; i < n; ++i)
                    m.check(in, i, testing::reference(world, i, dtype, ReduceOp::sum),
                            [&] { return "reduce in place " + rooted; });
                }
              }
              // gather and scatter
              {
                TypedVector in(dtype, n), out(dtype, me == root ? n * P : 0);
                for (std::size_t i = 0; i < n; ++i) in.set(i, value(me, i));
                co_await comm->gather(in.buffer(), out.buffer(), root);
                if (me == root) {
                  for (std::size_t r = 0; r < P; ++r) {
                    for (std::size_t i = 0; i < n; ++i)
                      m.check(out, r * n + i, value(static_cast<int>(r), i),
                              [&] { return "gather " + rooted; });
                  }
                }
                TypedVector source(dtype, me == root ? n * P : 0), block(dtype, n);
                if (me == root) {
                  for (std::size_t i = 0; i < n * P; ++i)
                    source.set(i, value(static_cast<int>(i / std::max<std::size_t>(n, 1)),
                                        i % std::max<std::size_t>(n, 1)));
                }
                co_await comm->scatter(source.buffer(), block.buffer(), root);
                for (std::size_t i = 0; i < n; ++i)
                  m.check(block, i, value(me, i), [&] { return "scatter " + rooted; });
              }
            }
            // all_to_all: block j of rank r holds (r, j) tags.
            {
              TypedVector in(dtype, n * P), out(dtype, n * P);
              for (std::size_t j = 0; j < P; ++j) {
                for (std::size_t i = 0; i < n; ++i) in.set(j * n + i, value(me, j * 7 + i));
              }
              co_await comm->all_to_all(in.buffer(), out.buffer());
              for (std::size_t r = 0; r < P; ++r) {
                for (std::size_t i = 0; i < n; ++i) {
                  m.check(out, r * n + i,
                          value(static_cast<int>(r), static_cast<std::size_t>(me) * 7 + i),
                          [&] { return "all_to_all " + where; });
                }
              }
              co_await comm->all_to_all(in.buffer());  // in place: the same result
              for (std::size_t r = 0; r < P; ++r) {
                for (std::size_t i = 0; i < n; ++i) {
                  m.check(in, r * n + i,
                          value(static_cast<int>(r), static_cast<std::size_t>(me) * 7 + i),
                          [&] { return "all_to_all in place " + where; });
                }
              }
            }
          }
        }
        co_await comm->barrier();
        EXPECT_EQ(m.what, "");
      },
      options);
}

INSTANTIATE_TEST_SUITE_P(Worlds, DataMovement,
                         ::testing::Values(Movement{1, false}, Movement{2, false},
                                           Movement{3, false}, Movement{4, false},
                                           Movement{8, false}, Movement{1, true}, Movement{2, true},
                                           Movement{3, true}, Movement{4, true}, Movement{8, true}),
                         [](const auto& info) {
                           return fmt::format("ranks{}_{}", info.param.world,
                                              info.param.single_copy ? "single_copy" : "messages");
                         });

// The variable-count forms by messages and with single copy, at sizes on both sides of
// the shared-memory rule. all_to_all_v's senders may bring inputs of very different sizes
// (below, the last rank's is thousands of times rank 0's) and must still take one path.
class VariableCounts : public ::testing::TestWithParam<bool> {};  // single copy

TEST_P(VariableCounts, AllGatherVAndAllToAllVMoveUnevenBlocksIncludingEmptyOnes) {
  const braid::testing::ScopedEnv policy("BRAID_SHM_SINGLE_COPY", GetParam() ? "1" : "0");
  constexpr int kWorld = 3;
  run_ranks(kWorld, [&](std::shared_ptr<Communicator> comm) -> asio::awaitable<void> {
    const int me = comm->rank();
    // 12 bytes in all (through the inline slots), then 80 KiB: past their 64 KiB.
    for (const std::vector<std::size_t>& counts :
         {std::vector<std::size_t>{1, 0, 2}, std::vector<std::size_t>{3, 0, 20001}}) {
      std::vector<std::int32_t> mine(counts[static_cast<std::size_t>(me)]);
      std::iota(mine.begin(), mine.end(), me * 10000);
      std::vector<std::int32_t> all(std::accumulate(counts.begin(), counts.end(), std::size_t{0}),
                                    -1);
      co_await comm->all_gather_v(Buffer(mine), Buffer(all), counts);
      std::vector<std::int32_t> expected;
      for (int r = 0; r < kWorld; ++r) {
        for (std::size_t i = 0; i < counts[static_cast<std::size_t>(r)]; ++i)
          expected.push_back(r * 10000 + static_cast<int>(i));
      }
      EXPECT_EQ(all, expected) << "counts " << counts[2];
    }

    // Rank r sends weight(r) * (r + j) elements to rank j, each holding 100 r + j: all
    // small, then with the last rank's input 72 KiB and rank 0's 24 bytes.
    for (const std::size_t last_weight : {1, 1000}) {
      const auto weight = [&](int r) { return r == kWorld - 1 ? last_weight : std::size_t{1}; };
      std::vector<std::size_t> send_counts, recv_counts;
      std::vector<std::int64_t> send;
      for (int j = 0; j < kWorld; ++j) {
        const std::size_t n = weight(me) * static_cast<std::size_t>(me + j);
        send_counts.push_back(n);
        send.insert(send.end(), n, 100 * me + j);
        recv_counts.push_back(weight(j) * static_cast<std::size_t>(j + me));
      }
      std::vector<std::int64_t> received(
          std::accumulate(recv_counts.begin(), recv_counts.end(), std::size_t{0}), -1);
      co_await comm->all_to_all_v(Buffer(send), send_counts, Buffer(received), recv_counts);
      std::vector<std::int64_t> want;
      for (int r = 0; r < kWorld; ++r)
        want.insert(want.end(), recv_counts[static_cast<std::size_t>(r)], 100 * r + me);
      EXPECT_EQ(received, want) << "last rank's weight " << last_weight;
    }
  });
}

INSTANTIATE_TEST_SUITE_P(Modes, VariableCounts, ::testing::Bool(), [](const auto& info) {
  return info.param ? std::string("single_copy") : std::string("messages");
});

// A rank that lags behind the others now and then: before one call in `one_in`, by up to
// 200 us, drawn from a generator seeded per rank.
class Straggler {
 public:
  Straggler(asio::any_io_executor executor, unsigned seed, unsigned one_in)
      : random_(seed), lag_(std::move(executor)), one_in_(one_in) {}
  asio::awaitable<void> maybe_lag() {
    if (random_() % one_in_ != 0) co_return;
    lag_.expires_after(std::chrono::microseconds(random_() % 200));
    co_await lag_.async_wait(asio::use_awaitable);
  }

 private:
  std::mt19937 random_;
  asio::steady_timer lag_;
  unsigned one_in_;
};

// Small all-reduces, barriers, all-gathers, reduce-scatters and all-to-alls go through
// eight inline slots per rank, used in turn by generation, with no wait for readers to
// finish; up to 16 bytes the vector rides in the slot's first cache line,
// beside its generation and fingerprint.
// Back to back, both sizes alternating, interleaved with operations that take generations
// of their own (a single-copy all-gather), and with one rank or another lagging at random,
// every result stays exact; a count that differs (one rank's vector in the line, another's
// past it) fails on every rank, naming both calls, and the next call works.
TEST(InlineSlots, BackToBackSmallAllReducesWithStragglersStayExactAndMismatchesFailEverywhere) {
  constexpr int kWorld = 3;
  std::atomic<int> mismatches{0};
  run_ranks(
      kWorld,
      [&](std::shared_ptr<Communicator> comm) -> asio::awaitable<void> {
        const int me = comm->rank();
        Straggler straggler(co_await asio::this_coro::executor, me + 7U, 5);
        for (int i = 0; i < 300; ++i) {
          co_await straggler.maybe_lag();
          const std::size_t count = i % 2 == 0 ? 2 : 5;  // 16 bytes: in the line; 40: past it
          std::vector<std::int64_t> values(count, me + i);
          co_await comm->all_reduce(Buffer(values), ReduceOp::sum);
          EXPECT_EQ(values, std::vector<std::int64_t>(count, 3 * i + 3)) << "round " << i;
          if (i % 7 == 0) {
            std::vector<float> block(8192, static_cast<float>(me + i));
            std::vector<float> all(kWorld * block.size());
            co_await comm->all_gather(Buffer(block), Buffer(all));
            EXPECT_EQ(all[2 * block.size()], static_cast<float>(2 + i));
          }
          if (i % 5 == 0) co_await comm->barrier();
          if (i % 3 == 0) {
            // The other collectives that take the inline slots when small.
            std::vector<std::int32_t> mine(2, me * 100 + i), gathered(2 * kWorld);
            co_await comm->all_gather(Buffer(mine), Buffer(gathered));
            EXPECT_EQ(gathered[4], 200 + i) << "round " << i;
            std::vector<std::int32_t> blocks(2 * kWorld), reduced(2);
            std::iota(blocks.begin(), blocks.end(), me + i);  // block b: me + i + 2b, + 1
            co_await comm->reduce_scatter(Buffer(blocks), Buffer(reduced), ReduceOp::sum);
            EXPECT_EQ(reduced[1], 3 * (i + 2 * me + 1) + 3) << "round " << i;
            std::vector<std::int32_t> sent(kWorld), received(kWorld);
            for (int to = 0; to < kWorld; ++to) sent[static_cast<std::size_t>(to)] = me * 10 + to;
            co_await comm->all_to_all(Buffer(sent), Buffer(received));
            EXPECT_EQ(received, (std::vector<std::int32_t>{me, 10 + me, 20 + me})) << "round " << i;
          }
        }
        std::vector<std::int64_t> uneven(me == 2 ? 3 : 2, 1);
        try {
          co_await comm->all_reduce(Buffer(uneven), ReduceOp::sum);
          ADD_FAILURE() << "rank " << me << " completed a mismatched small all-reduce";
        } catch (const Error& e) {
          EXPECT_EQ(e.code(), make_error_code(Errc::size_mismatch)) << e.what();
          EXPECT_THAT(e.what(), HasSubstr("all_reduce[shared_memory]"));
          EXPECT_THAT(e.what(), HasSubstr("rank 0 calls all_reduce(count 2, i64, sum)"));
          EXPECT_THAT(e.what(), HasSubstr("rank 2 calls all_reduce(count 3, i64, sum)"));
          ++mismatches;
        }
        std::vector<std::int64_t> ones(5, 1);
        co_await comm->all_reduce(Buffer(ones), ReduceOp::sum);
        EXPECT_EQ(ones, std::vector<std::int64_t>(5, 3));
      },
      Communicator::Options{.timeout = std::chrono::seconds(10), .check_fingerprints = false});
  EXPECT_EQ(mismatches.load(), kWorld);
}

// Small rooted collectives: the sending end returns at once and may run ahead of the
// receiving end, into the slot it wrote kInlineDepth (eight) operations before. Runs of 24
// calls of one kind in one direction (broadcasts from one root, gathers or reduces to it,
// scatters from it) let it get that far ahead, with random stragglers on every side; every
// call's values depend on its round, so data read from a slot reused too early shows.
TEST(InlineSlots, BackToBackRootedCollectivesWithStragglersDeliverEveryRoundsData) {
  constexpr int kWorld = 3;
  constexpr int kRun = 24;
  run_ranks(
      kWorld,
      [&](std::shared_ptr<Communicator> comm) -> asio::awaitable<void> {
        const int me = comm->rank();
        Straggler straggler(co_await asio::this_coro::executor, me + 11U, 4);
        for (int i = 0; i < 4 * kWorld * kRun * 2; ++i) {
          co_await straggler.maybe_lag();
          const int kind = (i / kRun) % 4;
          const int root = (i / (4 * kRun)) % kWorld;
          const std::size_t count = i % 2 == 0 ? 2 : 10;  // 8 bytes: in the line; 40: past it
          const bool at_root = me == root;
          std::vector<std::int32_t> mine(count, me * 1000 + i);
          if (kind == 0) {
            std::vector<std::int32_t> data(count, at_root ? i : -1);
            co_await comm->broadcast(Buffer(data), root);
            EXPECT_EQ(data, std::vector<std::int32_t>(count, i)) << "broadcast, round " << i;
          } else if (kind == 1) {
            std::vector<std::int32_t> gathered(at_root ? count * kWorld : 0);
            co_await comm->gather(Buffer(mine), Buffer(gathered), root);
            for (std::size_t r = 0; r < gathered.size() / count; ++r) {
              EXPECT_EQ(gathered[r * count + count - 1], static_cast<int>(r) * 1000 + i)
                  << "gather, round " << i;
            }
          } else if (kind == 2) {
            std::vector<std::int32_t> reduced(count);
            co_await comm->reduce(Buffer(mine), Buffer(reduced), ReduceOp::sum, root);
            if (at_root) {
              EXPECT_EQ(reduced, std::vector<std::int32_t>(count, 3000 + 3 * i))
                  << "reduce, round " << i;
            }
          } else {
            std::vector<std::int32_t> blocks(at_root ? count * kWorld : 0), block(count);
            for (std::size_t e = 0; e < blocks.size(); ++e) {
              blocks[e] = static_cast<std::int32_t>(e / count) * 1000 + i;
            }
            co_await comm->scatter(Buffer(blocks), Buffer(block), root);
            EXPECT_EQ(block, std::vector<std::int32_t>(count, me * 1000 + i))
                << "scatter, round " << i;
          }
          if (i % 64 == 63) {
            std::vector<std::int32_t> ones(2, 1);
            co_await comm->all_reduce(Buffer(ones), ReduceOp::sum);
            EXPECT_EQ(ones, std::vector<std::int32_t>(2, kWorld)) << "round " << i;
          }
        }
      },
      Communicator::Options{.timeout = std::chrono::seconds(10), .check_fingerprints = false});
}

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

// The sizes of the ring reduce-scatter step spans recorded while both ranks all-reduce
// 8 KiB and then 128 KiB over the ring, BRAID_TRACE_STEPS_KIB=`steps_kib`.
std::multiset<std::uint64_t> ring_steps_recorded(const char* steps_kib) {
  const braid::testing::ScopedEnv threshold("BRAID_TRACE_STEPS_KIB", steps_kib);
  const braid::testing::ScopedEnv every_op("BRAID_TRACE_SAMPLE_KIB", "0");
  trace::clear();
  trace::set_enabled(true);
  run_ranks(2,
            [](std::shared_ptr<Communicator> comm) -> asio::awaitable<void> {
              for (const std::size_t count : {std::size_t{2} << 10, std::size_t{32} << 10}) {
                std::vector<float> data(count, 1.0f);
                co_await comm->all_reduce(Buffer(data), ReduceOp::sum);
                EXPECT_EQ(data.front(), 2.0f);
              }
            },
            {.selection = forcing("allreduce:0-inf:ring")});
  trace::set_enabled(false);
  std::multiset<std::uint64_t> steps;
  int ops = 0;
  for (const trace::Record& record : trace::snapshot().records) {
    if (std::string_view(record.name) == "ring.reduce_scatter") steps.insert(record.bytes);
    if (std::string_view(record.name) == "all_reduce") ++ops;
  }
  EXPECT_EQ(ops, 4) << "every op records its own span, whatever its size";
  return steps;
}

TEST(Tracing, OpsBelowTheStepThresholdRecordTheirOwnSpanAloneAndLargerOnesTheirStepsToo) {
  const std::uint64_t small = 8 << 10, large = 128 << 10;
  EXPECT_EQ(ring_steps_recorded("64"), (std::multiset<std::uint64_t>{large, large}));
  EXPECT_EQ(ring_steps_recorded("0"), (std::multiset<std::uint64_t>{small, small, large, large}));
  EXPECT_EQ(ring_steps_recorded("1024"), std::multiset<std::uint64_t>{});
}

std::optional<std::int64_t> arg_of(const trace::Record& record, std::string_view key) {
  for (std::uint8_t i = 0; i < record.arg_count; ++i) {
    if (key == record.args[i].key) return record.args[i].value;
  }
  return std::nullopt;
}

// The summary matches one call's spans across ranks by (comm, seq): every member of a split
// communicator records its call under the same id, and the two groups under different ones.
TEST(Tracing, EveryMemberRecordsACallUnderItsCommunicatorsIdAndSequenceNumber) {
  const braid::testing::ScopedEnv every_op("BRAID_TRACE_SAMPLE_KIB", "0");
  std::array<std::uint32_t, 4> group_ids{};
  trace::clear();
  trace::set_enabled(true);
  run_ranks(4, [&](std::shared_ptr<Communicator> comm) -> asio::awaitable<void> {
    const int me = comm->rank();
    std::shared_ptr<Communicator> parity = co_await comm->split(me % 2, me);
    group_ids[static_cast<std::size_t>(me)] = parity->id();
    std::vector<float> data(4, 1.0f);
    co_await parity->all_reduce(Buffer(data), ReduceOp::sum);
  });
  trace::set_enabled(false);
  std::map<std::pair<std::int64_t, std::int64_t>, int> members;  // (comm, seq) -> spans
  for (const trace::Record& record : trace::snapshot().records) {
    if (std::string_view(record.name) != "all_reduce") continue;
    ASSERT_TRUE(arg_of(record, "comm") && arg_of(record, "seq"));
    ++members[{*arg_of(record, "comm"), *arg_of(record, "seq")}];
  }
  ASSERT_EQ(members.size(), 2u);
  EXPECT_EQ(members.begin()->second, 2);
  EXPECT_EQ(members.rbegin()->second, 2);
  EXPECT_EQ(members.begin()->first.first, std::min(group_ids[0], group_ids[1]));
  EXPECT_EQ(members.rbegin()->first.first, std::max(group_ids[0], group_ids[1]));
}

// Below BRAID_TRACE_SAMPLE_KIB a trace records one call in BRAID_TRACE_SAMPLE_EVERY after
// the communicator's first BRAID_TRACE_SAMPLE_EVERY: the same calls on every rank, each
// marked with what it stands for, and none of the left-out calls' steps.
TEST(Tracing, SmallOpsAreSampledAlikeOnEveryRankAndLargerOnesAllRecorded) {
  const braid::testing::ScopedEnv small("BRAID_TRACE_SAMPLE_KIB", "16");
  const braid::testing::ScopedEnv every("BRAID_TRACE_SAMPLE_EVERY", "8");
  const braid::testing::ScopedEnv steps("BRAID_TRACE_STEPS_KIB", "0");
  constexpr int kSmall = 400;
  constexpr int kLarge = 3;
  trace::clear();
  trace::set_enabled(true);
  run_ranks(2,
            [](std::shared_ptr<Communicator> comm) -> asio::awaitable<void> {
              std::vector<float> small(2, 1.0f);
              std::vector<float> large(8 << 10, 1.0f);  // 32 KiB
              for (int i = 0; i < kSmall; ++i) {
                small.assign(2, 1.0f);
                co_await comm->all_reduce(Buffer(small), ReduceOp::sum);
                EXPECT_EQ(small[1], 2.0f);
              }
              for (int i = 0; i < kLarge; ++i)
                co_await comm->all_reduce(Buffer(large), ReduceOp::max);
            },
            // The ring: every op, however small, has two step spans on each rank.
            {.selection = forcing("allreduce:0-inf:ring")});
  trace::set_enabled(false);
  const trace::Snapshot snapshot = trace::snapshot();
  std::map<std::int64_t, int> small_seqs;  // sequence -> ranks that recorded it
  int large = 0;
  int whole = 0;  // small ops recorded as themselves
  for (const trace::Record& record : snapshot.records) {
    if (std::string_view(record.name) != "all_reduce") continue;
    if (record.bytes >= (16 << 10)) {
      ++large;
      EXPECT_FALSE(arg_of(record, "sampled")) << "a large op stands for itself";
    } else if (!arg_of(record, "sampled")) {
      ++whole;
      EXPECT_LT(*arg_of(record, "seq"), 8);
    } else {
      EXPECT_EQ(arg_of(record, "sampled"), 8);
      EXPECT_EQ(arg_of(record, "comm"), 1) << "the world communicator's id, beside seq and sampled";
      EXPECT_GE(*arg_of(record, "seq"), 8);
      ++small_seqs[*arg_of(record, "seq")];
    }
  }
  EXPECT_EQ(large, 2 * kLarge);
  // 49 expected of the 392 after the first 8; a binomial's deviation is ~6.5.
  EXPECT_GT(small_seqs.size(), 20u);
  EXPECT_LT(small_seqs.size(), 90u);
  for (const auto& [seq, ranks] : small_seqs) EXPECT_EQ(ranks, 2) << "sequence " << seq;
  EXPECT_EQ(whole, 2 * 8) << "a communicator's first BRAID_TRACE_SAMPLE_EVERY calls are all "
                             "recorded, on every rank";
  // The small ops all ran before the first large one began: steps from before then are
  // theirs, two a rank for each recorded one (seq below 8, or sampled) and none for the rest.
  std::int64_t first_large = std::numeric_limits<std::int64_t>::max();
  for (const trace::Record& record : snapshot.records) {
    if (std::string_view(record.name) == "all_reduce" && record.bytes >= (16 << 10)) {
      first_large = std::min(first_large, record.begin_ns);
    }
  }
  std::size_t steps_of_small = 0;
  for (const trace::Record& record : snapshot.records) {
    if (record.category == trace::Category::step && record.begin_ns < first_large) {
      ++steps_of_small;
    }
  }
  EXPECT_EQ(steps_of_small, 2 * 2 * (8 + small_seqs.size()))
      << "a call left out leaves its steps out too";
}

// The _v forms are never sampled: each rank's bytes are its own, so a size rule would
// record a call on one rank and leave it out on another. Here rank 1 sends 20 KiB (above
// BRAID_TRACE_SAMPLE_KIB) and rank 0 sends 4 KiB (below), past the first calls.
TEST(Tracing, VariableSizedCollectivesAreRecordedOnEveryRankWhateverTheirSizes) {
  const braid::testing::ScopedEnv small("BRAID_TRACE_SAMPLE_KIB", "16");
  const braid::testing::ScopedEnv every("BRAID_TRACE_SAMPLE_EVERY", "4");
  constexpr int kCalls = 40;
  trace::clear();
  trace::set_enabled(true);
  run_ranks(2, [](std::shared_ptr<Communicator> comm) -> asio::awaitable<void> {
    const std::size_t mine = comm->rank() == 1 ? 5 << 10 : 1 << 10;  // floats to each rank
    const std::size_t theirs = comm->rank() == 1 ? 1 << 10 : 5 << 10;
    const std::vector<std::size_t> send_counts{mine, mine};
    const std::vector<std::size_t> recv_counts = comm->rank() == 0
                                                     ? std::vector<std::size_t>{mine, theirs}
                                                     : std::vector<std::size_t>{theirs, mine};
    std::vector<float> send(2 * mine, static_cast<float>(comm->rank() + 1));
    std::vector<float> received(recv_counts[0] + recv_counts[1], 0.0f);
    for (int i = 0; i < kCalls; ++i) {
      co_await comm->all_to_all_v(Buffer(send), send_counts, Buffer(received), recv_counts);
      EXPECT_EQ(received.back(), 2.0f);
    }
  });
  trace::set_enabled(false);
  int recorded = 0;
  for (const trace::Record& record : trace::snapshot().records) {
    if (std::string_view(record.name) != "all_to_all") continue;
    ++recorded;
    EXPECT_FALSE(arg_of(record, "sampled")) << "a _v call stands for itself";
  }
  EXPECT_EQ(recorded, 2 * kCalls);
}

// Making the communicators on `ranks` ranks fails on every rank with invalid_environment,
// in a message that contains `naming`.
void expect_environment_error_on_every_rank(int ranks, std::string_view naming) {
  const auto failures =
      run_ranks_collecting(ranks, [](auto) -> asio::awaitable<void> { co_return; });
  for (const std::exception_ptr& failure : failures) {
    ASSERT_TRUE(failure) << "the communicator was made";
    try {
      std::rethrow_exception(failure);
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), Errc::invalid_environment) << e.what();
      EXPECT_THAT(e.what(), HasSubstr(std::string(naming)));
    }
  }
}

TEST(Tracing, ANegativeStepThresholdIsAnEnvironmentErrorNamingTheKnob) {
  const braid::testing::ScopedEnv threshold("BRAID_TRACE_STEPS_KIB", "-1");
  expect_environment_error_on_every_rank(1, "BRAID_TRACE_STEPS_KIB=-1");
}

TEST(SharedMemory, AMalformedDoorbellSettingIsAnEnvironmentErrorNamingTheKnob) {
  const braid::testing::ScopedEnv doorbell("BRAID_SHM_DOORBELL", "sometimes");
  expect_environment_error_on_every_rank(2, "BRAID_SHM_DOORBELL");
}

TEST(PointToPoint, SendAndRecvMatchPerPairInCallOrder) {
  run_ranks(3, [&](std::shared_ptr<Communicator> comm) -> asio::awaitable<void> {
    const int me = comm->rank();
    const int next = (me + 1) % 3;
    const int prev = (me + 2) % 3;
    std::vector<float> first(4, static_cast<float>(me)), second(2, static_cast<float>(me + 10));
    std::vector<float> got_first(4), got_second(8);
    auto a = comm->launch(comm->send(Buffer(first), next));
    auto b = comm->launch(comm->send(Buffer(second), next));
    const std::size_t n1 = co_await comm->recv(Buffer(got_first), prev);
    const std::size_t n2 = co_await comm->recv(Buffer(got_second), prev);
    while (!a.ready() || !b.ready())
      co_await asio::post(comm->runtime().executor(), asio::use_awaitable);
    a.get();
    b.get();
    EXPECT_EQ(n1, 4u);
    EXPECT_EQ(n2, 2u);  // fewer than the buffer holds
    EXPECT_EQ(got_first[0], static_cast<float>(prev));
    EXPECT_EQ(got_second[1], static_cast<float>(prev + 10));
  });
}

TEST(BadInput, ArgumentErrorsAreThrownAtTheCallAndTakeNoPlaceInTheOrder) {
  run_ranks(2, [&](std::shared_ptr<Communicator> communicator) -> asio::awaitable<void> {
    // A local: the lambdas below must not capture the coroutine's parameter (GCC 12).
    const std::shared_ptr<Communicator> comm = communicator;
    std::vector<float> a(8), b(7);
    std::vector<std::int32_t> c(8);
    braid::testing::expect_invalid_argument(
        [&] { (void)comm->all_reduce(Buffer(a), Buffer(b), ReduceOp::sum); },
        "input has 8 elements and output 7");
    braid::testing::expect_invalid_argument(
        [&] { (void)comm->all_reduce(Buffer(a), Buffer(c), ReduceOp::sum); },
        "input is f32 and output is i32");
    braid::testing::expect_invalid_argument(
        [&] {
          (void)comm->all_reduce(Buffer(a).slice(0, 4), Buffer(a).slice(2, 4), ReduceOp::sum);
        },
        "overlap");
    braid::testing::expect_invalid_argument([&] { (void)comm->broadcast(Buffer(a), 2); },
                                            "root 2 is outside a communicator of 2 ranks");
    const Buffer labelled_cuda(a.data(), 8, DType::f32, MemoryKind::cuda, 0);
    if (!comm->accepts_cuda_buffers()) {
      braid::testing::expect_invalid_argument(
          [&] { (void)comm->all_reduce(labelled_cuda, ReduceOp::sum); },
          "this build of braid has no CUDA");
    }
    std::vector<float> d(8);
    const Buffer other_device(d.data(), 8, DType::f32, MemoryKind::cuda, 1);
    if (comm->accepts_cuda_buffers()) {
      braid::testing::expect_invalid_argument(
          [&] { (void)comm->all_reduce(labelled_cuda, other_device, ReduceOp::sum); },
          "both must be in the same place");
    }
    braid::testing::expect_invalid_argument(
        [&] { (void)comm->all_reduce(Buffer(d), labelled_cuda, ReduceOp::sum); }, "cuda memory");
    braid::testing::expect_invalid_argument([&] { (void)comm->all_gather(Buffer(b)); },
                                            "must split into 2 equal blocks");
    // Counts whose sum wraps around a size_t are refused, not summed modulo 2^64 into
    // something that matches the buffer.
    const std::vector<std::size_t> wrapping{std::numeric_limits<std::size_t>::max(), 9};
    const std::vector<std::size_t> eight{4, 4};
    braid::testing::expect_invalid_argument(
        [&] { (void)comm->all_to_all_v(Buffer(a), wrapping, Buffer(b), eight); },
        "the send counts add up to 18446744073709551615");
    // all_gather_v's 8 + SIZE_MAX wraps around to 7, which would match a 7-element output.
    const std::size_t max = std::numeric_limits<std::size_t>::max();
    const std::vector<std::size_t> mine_then_max =
        comm->rank() == 0 ? std::vector<std::size_t>{8, max} : std::vector<std::size_t>{max, 8};
    braid::testing::expect_invalid_argument(
        [&] { (void)comm->all_gather_v(Buffer(a), Buffer(b), mine_then_max); },
        "the counts add up to 18446744073709551615");
    // In place is this rank's block of the whole buffer; any other block that overlaps it
    // (the other rank's, one straddling two) is refused, the first block included.
    const std::size_t other = static_cast<std::size_t>(1 - comm->rank());
    braid::testing::expect_invalid_argument(
        [&] {
          (void)comm->reduce_scatter(Buffer(a), Buffer(a).slice(other * 4, 4), ReduceOp::sum);
        },
        "overlap");
    braid::testing::expect_invalid_argument(
        [&] { (void)comm->all_gather(Buffer(a).slice(2, 4), Buffer(a)); }, "overlap");
    braid::testing::expect_invalid_argument(
        [&] { (void)comm->gather(Buffer(a).slice(other * 4, 4), Buffer(a), comm->rank()); },
        "overlap");
    // Nothing above took a sequence number: the ranks are still in step.
    std::vector<float> ones(3, 1.0f);
    co_await comm->all_reduce(Buffer(ones), ReduceOp::sum);
    EXPECT_EQ(ones, std::vector<float>(3, 2.0f));
  });
}

TEST(Mismatch, CountsThatDifferAcrossRanksAreASizeMismatchNeverATruncation) {
  Communicator::Options options;
  options.timeout = std::chrono::seconds(3);
  options.check_fingerprints = false;
  auto failures = run_ranks_collecting(
      2,
      [&](std::shared_ptr<Communicator> comm) -> asio::awaitable<void> {
        std::vector<float> data(comm->rank() == 0 ? 1000 : 1001, 1.0f);
        co_await comm->all_reduce(Buffer(data), ReduceOp::sum);
      },
      options);
  int size_mismatches = 0;
  for (const auto& failure : failures) {
    ASSERT_TRUE(failure) << "a rank completed an all-reduce over mismatched counts";
    try {
      std::rethrow_exception(failure);
    } catch (const Error& e) {
      if (e.code() == Errc::size_mismatch) {
        ++size_mismatches;
        EXPECT_THAT(e.what(), HasSubstr("all_reduce["));
        EXPECT_THAT(e.what(), HasSubstr("counts or dtypes differ"));
      }
    }
  }
  EXPECT_GE(size_mismatches, 1);
}

// A partner that never makes the call: the wait runs out at the deadline, and the error
// says what usually causes that and how to find out which.
TEST(Mismatch, AWaitThatRunsOutSaysRanksMustMakeTheSameCallsAndHowToCheck) {
  Communicator::Options options;
  options.timeout = std::chrono::milliseconds(300);
  options.check_fingerprints = false;
  auto failures = run_ranks_collecting(
      2,
      [&](std::shared_ptr<Communicator> comm) -> asio::awaitable<void> {
        if (comm->rank() == 1) co_return;  // skips the all-reduce
        std::vector<float> data(1000, 1.0f);
        co_await comm->all_reduce(Buffer(data), ReduceOp::sum);
      },
      options);
  ASSERT_TRUE(failures[0]) << "rank 0's all-reduce completed without its partner";
  try {
    std::rethrow_exception(failures[0]);
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), make_error_code(Errc::timeout)) << e.what();
    EXPECT_THAT(e.what(), HasSubstr("all_reduce["));
    EXPECT_THAT(e.what(), HasSubstr("same calls in the same order with the same sizes"));
    EXPECT_THAT(e.what(), HasSubstr("BRAID_DEBUG=detail"));
  }
}

// Options for the mismatch tests: `rules` forced, no fingerprints (the algorithms must
// notice on their own), and a deadline short enough for a failure to show as one.
Communicator::Options unchecked_forcing(std::string_view rules) {
  Communicator::Options options;
  options.timeout = std::chrono::seconds(10);
  options.check_fingerprints = false;
  options.selection = forcing(rules);
  return options;
}

// Through shared memory ranks read each other's buffers, so a count that differs must be
// caught before anyone reads: every rank fails naming both sides, in both modes, and the
// communicator stays usable.
TEST(Mismatch, SharedMemoryAllReduceChecksEveryRanksCountBeforeReadingAnyBuffer) {
  for (const char* single_copy : {"1", "0"}) {
    const braid::testing::ScopedEnv policy("BRAID_SHM_SINGLE_COPY", single_copy);
    const Communicator::Options options = unchecked_forcing("allreduce:0-inf:shared_memory");
    std::atomic<int> size_mismatches{0};
    run_ranks(
        3,
        [&](std::shared_ptr<Communicator> comm) -> asio::awaitable<void> {
          std::vector<float> data(comm->rank() == 2 ? 40001 : 40000, 1.0f);
          try {
            co_await comm->all_reduce(Buffer(data), ReduceOp::sum);
            ADD_FAILURE() << "rank " << comm->rank() << " completed a mismatched all-reduce";
          } catch (const Error& e) {
            EXPECT_EQ(e.code(), make_error_code(Errc::size_mismatch)) << e.what();
            EXPECT_THAT(e.what(), HasSubstr("rank 0 calls all_reduce(count 40000, f32, sum)"));
            EXPECT_THAT(e.what(), HasSubstr("rank 2 calls all_reduce(count 40001, f32, sum)"));
            ++size_mismatches;
          }
          std::vector<float> ones(40000, 1.0f);
          co_await comm->all_reduce(Buffer(ones), ReduceOp::sum);
          EXPECT_EQ(ones, std::vector<float>(40000, 3.0f));
        },
        options);
    EXPECT_EQ(size_mismatches.load(), 3) << "single copy " << single_copy;
  }
}

// An all-gather of `count` floats from this rank where the ranks' counts differ: it must
// fail with size_mismatch, its message naming each of `calls`. Counts the failures.
asio::awaitable<void> expect_all_gather_mismatch(Communicator& comm, std::size_t count,
                                                 std::vector<std::string> calls,
                                                 std::atomic<int>& mismatches) {
  std::vector<float> block(count, 1.0f);
  std::vector<float> gathered(3 * block.size());
  try {
    co_await comm.all_gather(Buffer(block), Buffer(gathered));
    ADD_FAILURE() << "rank " << comm.rank() << " gathered mismatched blocks";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), make_error_code(Errc::size_mismatch)) << e.what();
    for (const std::string& call : calls) EXPECT_THAT(e.what(), HasSubstr(call));
    ++mismatches;
  }
}

TEST(Mismatch, SingleCopyCollectivesCheckEveryRanksCallBeforeReadingAnyBuffer) {
  const braid::testing::ScopedEnv policy("BRAID_SHM_SINGLE_COPY", "1");
  const Communicator::Options options =
      unchecked_forcing("allgather:0-inf:shared_memory;broadcast:0-inf:shared_memory");
  std::atomic<int> mismatches{0};
  run_ranks(
      3,
      [&](std::shared_ptr<Communicator> comm) -> asio::awaitable<void> {
        // Rank 1 brings a smaller block: reading it as a full one would run off its end.
        // (Outputs of 96 KiB: past the inline slots, whose check the next test covers.)
        std::vector<std::string> both{"rank 0 calls all_gather(count 8192, f32)",
                                      "rank 1 calls all_gather(count 8000, f32)"};
        co_await expect_all_gather_mismatch(*comm, comm->rank() == 1 ? 8000 : 8192,
                                            std::move(both), mismatches);
        // Roots that differ are caught the same way. (128 KiB: past the inline slots, where
        // a root does not wait for the others; the next test covers those.)
        std::vector<float> data(32768, static_cast<float>(comm->rank()));
        try {
          co_await comm->broadcast(Buffer(data), comm->rank() == 2 ? 1 : 0);
          ADD_FAILURE() << "rank " << comm->rank() << " broadcast from a disputed root";
        } catch (const Error& e) {
          EXPECT_THAT(e.what(), HasSubstr("rank 2 calls broadcast(count 32768, f32, root 1)"));
          ++mismatches;
        }
      },
      options);
  EXPECT_EQ(mismatches.load(), 6);
}

// all_to_all_v's counts are each rank's own, so no fingerprint covers them: each receiver's
// counts are checked against every sender's (single copy: each receiver checks its own and
// the ranks agree on the verdict in one more wait; through the inline slots, where every
// rank's counts are posted with its input, every rank checks every pair), so every rank
// fails naming the pair and the communicator stays usable.
TEST(Mismatch, AllToAllVChecksEverySendersCountAgainstItsReceiver) {
  const braid::testing::ScopedEnv policy("BRAID_SHM_SINGLE_COPY", "1");
  std::atomic<int> mismatches{0};
  run_ranks(
      3,
      [&](std::shared_ptr<Communicator> comm) -> asio::awaitable<void> {
        const int me = comm->rank();
        // n elements to every rank, except that rank 1 expects n - n/3 from rank 0: 72 KB
        // inputs (single copy), then 720 B ones (the inline slots).
        for (const std::size_t n : {std::size_t{6000}, std::size_t{60}}) {
          const std::vector<std::size_t> send_counts(3, n);
          std::vector<std::size_t> recv_counts(3, n);
          if (me == 1) recv_counts[0] = n - n / 3;
          std::vector<float> send(3 * n, 1.0f);
          std::vector<float> received(
              std::accumulate(recv_counts.begin(), recv_counts.end(), std::size_t{0}));
          try {
            co_await comm->all_to_all_v(Buffer(send), send_counts, Buffer(received), recv_counts);
            ADD_FAILURE() << "rank " << me << " completed an all_to_all_v with disputed counts";
          } catch (const Error& e) {
            EXPECT_EQ(e.code(), make_error_code(Errc::size_mismatch)) << e.what();
            EXPECT_THAT(e.what(), HasSubstr(fmt::format(
                                      "rank 0 sends {} elements to rank 1, which expects {}", n,
                                      n - n / 3)));
            ++mismatches;
          }
          const std::vector<std::size_t> even(3, n);
          std::vector<float> back(3 * n, -1.0f);
          co_await comm->all_to_all_v(Buffer(send), even, Buffer(back), even);
          EXPECT_EQ(back, send);
        }
      },
      Communicator::Options{.timeout = std::chrono::seconds(10)});
  EXPECT_EQ(mismatches.load(), 6);
}

// A small broadcast, gather, reduce or scatter moves the root's data one way through the
// inline slots: the sending end returns without waiting (as with OpenMPI's eager sends),
// and the receiving end compares the calls it receives from with its own. So a mismatch
// fails where the data would arrive, naming both calls, and nowhere else; the arena stays
// in step, and the next collective runs on every rank.
TEST(Mismatch, SmallRootedCollectivesFailWhereTheDataArrivesAndLeaveTheArenaInStep) {
  const braid::testing::ScopedEnv policy("BRAID_SHM_SINGLE_COPY", "1");
  std::array<std::atomic<int>, 3> failures{};
  const auto started = std::chrono::steady_clock::now();
  run_ranks(
      3,
      [&](std::shared_ptr<Communicator> comm) -> asio::awaitable<void> {
        const int me = comm->rank();
        auto expect_failure = [&](const Error& e, std::string_view ours, std::string_view theirs) {
          EXPECT_EQ(e.code(), make_error_code(Errc::size_mismatch)) << e.what();
          EXPECT_THAT(e.what(), HasSubstr(std::string(ours)));
          EXPECT_THAT(e.what(), HasSubstr(std::string(theirs)));
          ++failures[static_cast<std::size_t>(me)];
        };
        // Rank 2 expects 16 floats from root 0, which sends 20: only rank 2 fails.
        std::vector<float> data(me == 2 ? 16 : 20, static_cast<float>(me));
        try {
          co_await comm->broadcast(Buffer(data), 0);
          EXPECT_NE(me, 2) << "rank 2 received a broadcast of the wrong count";
          EXPECT_EQ(data, std::vector<float>(20, 0.0f));
        } catch (const Error& e) {
          expect_failure(e, "rank 2 calls broadcast(count 16, f32, root 0)",
                         "rank 0 calls broadcast(count 20, f32, root 0)");
        }
        // Rank 1 gathers 3 floats where the others gather 4: the root fails; the senders
        // have returned.
        std::vector<float> block(me == 1 ? 3 : 4, 1.0f), gathered(me == 0 ? 12 : 0);
        try {
          co_await comm->gather(Buffer(block), Buffer(gathered), 0);
          EXPECT_NE(me, 0) << "the root gathered blocks of the wrong count";
        } catch (const Error& e) {
          expect_failure(e, "rank 0 calls gather(count 4, f32, root 0)",
                         "rank 1 calls gather(count 3, f32, root 0)");
        }
        // Rank 2's count is past the inline limit (64 KiB), so it waits for every rank's
        // call and finds the difference; ranks 0 and 1 agree with each other.
        std::vector<float> large(me == 2 ? 20000 : 20, 1.0f);
        try {
          co_await comm->broadcast(Buffer(large), 0);
          EXPECT_NE(me, 2) << "rank 2 received a broadcast of the wrong count";
        } catch (const Error& e) {
          expect_failure(e, "rank 2 calls broadcast(count 20000, f32, root 0)",
                         "calls broadcast(count 20, f32, root 0)");
        }
        for (const std::size_t count : {std::size_t{8}, std::size_t{40000}}) {
          std::vector<float> ones(count, 1.0f);
          co_await comm->all_reduce(Buffer(ones), ReduceOp::sum);
          EXPECT_EQ(ones, std::vector<float>(count, 3.0f));
          std::vector<float> from_root(count, me == 1 ? 7.0f : 0.0f);
          co_await comm->broadcast(Buffer(from_root), 1);
          EXPECT_EQ(from_root, std::vector<float>(count, 7.0f));
        }
      },
      Communicator::Options{.timeout = std::chrono::seconds(10), .check_fingerprints = false});
  EXPECT_EQ(failures[0].load(), 1);  // the gather's root
  EXPECT_EQ(failures[1].load(), 0);
  EXPECT_EQ(failures[2].load(), 2);  // both broadcasts
  EXPECT_LT(std::chrono::steady_clock::now() - started, std::chrono::seconds(5))
      << "a rank waited for the timeout instead of failing at once";
}

// Counts on either side of the inline limit put ranks on different shared-memory paths
// (an all-reduce of 4096 floats takes the inline slots, 4097 the records; an all-gather's
// output of 3 x 5461 floats fits a slot, 3 x 5462 does not): each path leaves its
// fingerprint where the other looks and ends a mismatch with a release, so every rank
// fails at once naming both calls, and the arena stays in step for the next operation.
TEST(Mismatch, CountsAcrossTheInlineLimitFailOnEveryRankAndLeaveTheArenaInStep) {
  const braid::testing::ScopedEnv policy("BRAID_SHM_SINGLE_COPY", "1");
  std::atomic<int> mismatches{0};
  const auto started = std::chrono::steady_clock::now();
  run_ranks(
      3,
      [&](std::shared_ptr<Communicator> comm) -> asio::awaitable<void> {
        std::vector<float> data(comm->rank() == 1 ? 4097 : 4096, 1.0f);
        try {
          co_await comm->all_reduce(Buffer(data), ReduceOp::sum);
          ADD_FAILURE() << "rank " << comm->rank() << " completed a mismatched all-reduce";
        } catch (const Error& e) {
          EXPECT_EQ(e.code(), make_error_code(Errc::size_mismatch)) << e.what();
          EXPECT_THAT(e.what(), HasSubstr("all_reduce(count 4096, f32, sum)"));
          EXPECT_THAT(e.what(), HasSubstr("all_reduce(count 4097, f32, sum)"));
          ++mismatches;
        }
        std::vector<std::string> larger{"rank 2 calls all_gather(count 5462, f32)"};
        co_await expect_all_gather_mismatch(*comm, comm->rank() == 2 ? 5462 : 5461,
                                            std::move(larger), mismatches);
        for (const std::size_t count : {std::size_t{8}, std::size_t{40000}}) {
          std::vector<float> ones(count, 1.0f);
          co_await comm->all_reduce(Buffer(ones), ReduceOp::sum);
          EXPECT_EQ(ones, std::vector<float>(count, 3.0f));
        }
      },
      Communicator::Options{.timeout = std::chrono::seconds(10), .check_fingerprints = false});
  EXPECT_EQ(mismatches.load(), 6);
  EXPECT_LT(std::chrono::steady_clock::now() - started, std::chrono::seconds(5))
      << "a rank waited for the timeout instead of failing at once";
}

// A desync caught by the fingerprint exchange fails before the algorithm runs, on ranks
// whose call had taken a turn in the shared-memory order at the call: that turn is given
// up, so the shared-memory operations after it still run.
TEST(Mismatch, ADesyncCaughtByFingerprintsGivesUpItsSharedMemoryTurn) {
  std::atomic<int> desyncs{0};
  run_ranks(
      3,
      [&](std::shared_ptr<Communicator> comm) -> asio::awaitable<void> {
        std::vector<float> data(16, 1.0f);
        try {
          // Ranks 0 and 1 take an arena turn (a small all-reduce); rank 2 broadcasts.
          if (comm->rank() == 2) {
            co_await comm->broadcast(Buffer(data), 0);
          } else {
            co_await comm->all_reduce(Buffer(data), ReduceOp::sum);
          }
          ADD_FAILURE() << "rank " << comm->rank() << " missed the desync";
        } catch (const Error& e) {
          EXPECT_EQ(e.code(), Errc::desync) << e.what();
          ++desyncs;
        }
        std::vector<float> ones(8, 1.0f);
        co_await comm->all_reduce(Buffer(ones), ReduceOp::sum);
        EXPECT_EQ(ones, std::vector<float>(8, 3.0f));
        co_await comm->barrier();
      },
      Communicator::Options{.timeout = std::chrono::seconds(10), .check_fingerprints = true});
  EXPECT_EQ(desyncs.load(), 3);
}

TEST(Mismatch, WithFingerprintsADesyncFailsOnEveryRankNamingBothSides) {
  Communicator::Options options;
  options.timeout = std::chrono::seconds(10);
  options.check_fingerprints = true;
  auto failures = run_ranks_collecting(
      3,
      [&](std::shared_ptr<Communicator> comm) -> asio::awaitable<void> {
        std::vector<float> data(16, 1.0f);
        // Rank 2 broadcasts where the others all-reduce; same byte sizes, so only the
        // fingerprints can tell.
        if (comm->rank() == 2) {
          co_await comm->broadcast(Buffer(data), 0);
        } else {
          co_await comm->all_reduce(Buffer(data), ReduceOp::sum);
        }
      },
      options);
  for (std::size_t r = 0; r < failures.size(); ++r) {
    ASSERT_TRUE(failures[r]) << "rank " << r << " did not notice the desync";
    try {
      std::rethrow_exception(failures[r]);
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), Errc::desync) << e.what();
      EXPECT_THAT(e.what(), HasSubstr("all_reduce(count 16, f32, sum)"));
      EXPECT_THAT(e.what(), HasSubstr("broadcast(count 16, f32, root 0)"));
    }
  }
}

}  // namespace
}  // namespace braid::collectives
