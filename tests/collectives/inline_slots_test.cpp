// Small collectives through the shared-memory inline slots, back to back on worlds of
// threads-as-ranks (tests/support/rank_threads.hpp) with ranks lagging at random: every
// round's data arrives exact, and a count that differs fails everywhere it must.
#include <atomic>
#include <chrono>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <braid/collectives/communicator.hpp>
#include <braid/core/error.hpp>

#include "../support/rank_threads.hpp"

namespace braid::collectives {
namespace {

using braid::testing::run_ranks;
using ::testing::HasSubstr;

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

}  // namespace
}  // namespace braid::collectives
