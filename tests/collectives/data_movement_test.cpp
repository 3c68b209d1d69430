// The collectives that move data, against serial references on worlds of threads-as-ranks
// (tests/support/rank_threads.hpp): reduce_scatter, all_gather, broadcast, reduce, gather,
// scatter and all_to_all for every root and several dtypes, out of place and in place, by
// messages and by single copy; the variable-count forms; and send/recv between pairs.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <string>
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
using testing::TypedVector;

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
    options.selection = testing::forcing(
        "reducescatter:0-inf:shared_memory;allgather:0-inf:shared_memory;"
        "broadcast:0-inf:shared_memory;reduce:0-inf:shared_memory;gather:0-inf:shared_memory;"
        "scatter:0-inf:shared_memory;alltoall:0-inf:shared_memory");
  }
  run_ranks(
      world,
      [&](std::shared_ptr<Communicator> comm) -> asio::awaitable<void> {
        testing::Mismatch m;
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

// Ranks on pretend nodes (tests/support/rank_threads.hpp): with as many ranks on every
// node, reduce-scatter and all-gather go hierarchical (rails across nodes, exchanges
// within); on uneven nodes they stay on the ring. Either way every op, dtype, size and
// placement in the output matches the serial reference, in place and out of place; and
// broadcasts of 1 MiB and more go down the ring from every root.
struct NodeLayout {
  const char* name;
  std::vector<int> node_of_rank;
  Algorithm expected;
};

class HierarchicalMovement : public ::testing::TestWithParam<NodeLayout> {};

TEST_P(HierarchicalMovement, ReduceScatterAndAllGatherMatchTheSerialReference) {
  const NodeLayout& layout = GetParam();
  const int world = static_cast<int>(layout.node_of_rank.size());
  const auto P = static_cast<std::size_t>(world);
  run_ranks(
      world,
      [&](std::shared_ptr<Communicator> comm) -> asio::awaitable<void> {
        for (CollectiveKind kind : {CollectiveKind::reduce_scatter, CollectiveKind::all_gather}) {
          for (std::size_t bytes : {std::size_t{8}, std::size_t{64} << 20}) {
            EXPECT_EQ(comm->algorithm_for(kind, bytes), layout.expected)
                << to_string(kind) << " of " << bytes << " bytes";
          }
        }
        testing::Mismatch m;
        const int me = comm->rank();
        for (DType dtype : {DType::f32, DType::i64, DType::bf16}) {
          for (ReduceOp op :
               {ReduceOp::sum, ReduceOp::avg, ReduceOp::max, ReduceOp::min, ReduceOp::prod}) {
            if (op == ReduceOp::avg && dtype == DType::i64) continue;
            for (std::size_t n :
                 {std::size_t{0}, std::size_t{1}, std::size_t{1031}, std::size_t{70001}}) {
              if (n > 2000 && op != ReduceOp::sum && op != ReduceOp::avg) continue;
              const std::string where =
                  fmt::format("{} {} n {} rank {}", to_string(dtype), to_string(op), n, me);
              TypedVector in(dtype, n * P), out(dtype, n);
              for (std::size_t i = 0; i < n * P; ++i)
                in.set(i, testing::value_for(me, i, dtype, op));
              co_await comm->reduce_scatter(in.buffer(), out.buffer(), op);
              co_await comm->reduce_scatter(in.buffer(), op);  // in place: into block me
              for (std::size_t i = 0; i < n; ++i) {
                const std::size_t at = static_cast<std::size_t>(me) * n + i;
                const double want = testing::reference(world, at, dtype, op);
                m.check(out, i, want, [&] { return "reduce_scatter " + where; });
                m.check(in, at, want, [&] { return "reduce_scatter in place " + where; });
              }
            }
          }
          for (std::size_t n : {std::size_t{0}, std::size_t{5}, std::size_t{70001}}) {
            const std::string where = fmt::format("{} n {} rank {}", to_string(dtype), n, me);
            TypedVector in(dtype, n), out(dtype, n * P), data(dtype, n * P);
            for (std::size_t i = 0; i < n; ++i) {
              in.set(i, std::fmod(tagged(me, i), 128.0));
              data.set(static_cast<std::size_t>(me) * n + i, std::fmod(tagged(me, i), 128.0));
            }
            co_await comm->all_gather(in.buffer(), out.buffer());
            co_await comm->all_gather(data.buffer());
            for (std::size_t r = 0; r < P; ++r) {
              for (std::size_t i = 0; i < n; ++i) {
                const double want = std::fmod(tagged(static_cast<int>(r), i), 128.0);
                m.check(out, r * n + i, want, [&] { return "all_gather " + where; });
                m.check(data, r * n + i, want, [&] { return "all_gather in place " + where; });
              }
            }
          }
        }
        // all_gather_v: blocks of every size, empty ones included.
        std::vector<std::size_t> counts;
        for (std::size_t r = 0; r < P; ++r) counts.push_back(r % 3 == 1 ? 0 : 1000 * r + 7);
        std::vector<std::int32_t> mine(counts[static_cast<std::size_t>(me)]);
        std::iota(mine.begin(), mine.end(), me * 100000);
        std::vector<std::int32_t> all(std::accumulate(counts.begin(), counts.end(), std::size_t{0}),
                                      -1);
        co_await comm->all_gather_v(Buffer(mine), Buffer(all), counts);
        std::vector<std::int32_t> expected;
        for (std::size_t r = 0; r < P; ++r) {
          for (std::size_t i = 0; i < counts[r]; ++i)
            expected.push_back(static_cast<std::int32_t>(r * 100000 + i));
        }
        EXPECT_EQ(all, expected) << "all_gather_v on rank " << me;
        // Broadcasts from every root: the tree below 1 MiB, the chain above.
        EXPECT_EQ(comm->algorithm_for(CollectiveKind::broadcast, 1 << 20), Algorithm::ring);
        for (std::size_t n : {std::size_t{1000}, std::size_t{300001}}) {
          for (int root = 0; root < world; ++root) {
            TypedVector data(DType::f32, n);
            for (std::size_t i = 0; i < n; ++i) data.set(i, me == root ? tagged(root, i) : -1);
            co_await comm->broadcast(data.buffer(), root);
            for (std::size_t i = 0; i < n; ++i) {
              m.check(data, i, tagged(root, i),
                      [&] { return fmt::format("broadcast of {} from {} on {}", n, root, me); });
            }
          }
        }
        EXPECT_EQ(m.what, "");
      },
      {}, layout.node_of_rank);
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, HierarchicalMovement,
    ::testing::Values(NodeLayout{"two_by_two", {0, 0, 1, 1}, Algorithm::hierarchical},
                      NodeLayout{"round_robin", {0, 1, 0, 1}, Algorithm::hierarchical},
                      NodeLayout{"three_by_two", {0, 0, 1, 1, 2, 2}, Algorithm::hierarchical},
                      NodeLayout{"two_by_three", {0, 0, 0, 1, 1, 1}, Algorithm::hierarchical},
                      NodeLayout{"uneven", {0, 0, 1}, Algorithm::ring}),
    [](const auto& info) { return std::string(info.param.name); });

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

TEST(PointToPoint, NumberedMessagesMatchByNumberWhateverOrderEitherSideCallsIn) {
  run_ranks(2, [&](std::shared_ptr<Communicator> comm) -> asio::awaitable<void> {
    const int peer = 1 - comm->rank();
    // Rank 0 sends 0, 1, 2 in order; rank 1 posts 2, 0, 1 before any arrives, and each
    // takes its own message. The other direction sends 1 before 0.
    std::vector<std::vector<float>> out, in(3, std::vector<float>(3, -1.0f));
    for (int n = 0; n < 3; ++n) out.emplace_back(3, static_cast<float>(10 * comm->rank() + n));
    if (comm->rank() == 0) {
      for (int n = 0; n < 3; ++n) co_await comm->send_numbered(Buffer(out[n]), peer, n);
      EXPECT_EQ(co_await comm->recv_numbered(Buffer(in[0]), peer, 0), 3u);
      EXPECT_EQ(co_await comm->recv_numbered(Buffer(in[1]), peer, 1), 3u);
      EXPECT_EQ(in[0][0], 10.0f);
      EXPECT_EQ(in[1][2], 11.0f);
    } else {
      std::vector<Future<std::size_t>> posted;
      for (const int n : {2, 0, 1}) {
        posted.push_back(comm->launch(comm->recv_numbered(Buffer(in[n]), peer, n)));
      }
      co_await comm->send_numbered(Buffer(out[1]), peer, 1);
      co_await comm->send_numbered(Buffer(out[0]), peer, 0);
      for (auto& done : posted) {
        while (!done.ready()) co_await asio::post(comm->runtime().executor(), asio::use_awaitable);
        EXPECT_EQ(done.get(), 3u);
      }
      for (int n = 0; n < 3; ++n) EXPECT_EQ(in[n], std::vector<float>(3, static_cast<float>(n)));
    }
  });
}

}  // namespace
}  // namespace braid::collectives
