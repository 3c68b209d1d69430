// The Communicator's errors, on worlds of threads-as-ranks (tests/support/rank_threads.hpp):
// bad arguments refused at the call, a bad setting refused when it is made, and calls that
// differ across ranks (counts, roots, kinds) failing where the difference would be read,
// naming both calls, with the communicator usable afterwards.
#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <limits>
#include <numeric>
#include <string>
#include <string_view>
#include <vector>

#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <braid/collectives/communicator.hpp>
#include <braid/core/error.hpp>

#include "../support/expect_error.hpp"
#include "../support/rank_threads.hpp"
#include "../support/scoped_env.hpp"
#include "communicator_helpers.hpp"

namespace braid::collectives {
namespace {

using braid::testing::run_ranks;
using braid::testing::run_ranks_collecting;
using testing::expect_environment_error_on_every_rank;
using testing::forcing;
using ::testing::HasSubstr;

TEST(SharedMemory, AMalformedDoorbellSettingIsAnEnvironmentErrorNamingTheKnob) {
  const braid::testing::ScopedEnv doorbell("BRAID_SHM_DOORBELL", "sometimes");
  expect_environment_error_on_every_rank(2, "BRAID_SHM_DOORBELL");
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

// A partner that never makes the call and is still running: the wait runs out at the
// deadline, and the error says what usually causes that and how to find out which.
TEST(Mismatch, AWaitThatRunsOutSaysRanksMustMakeTheSameCallsAndHowToCheck) {
  Communicator::Options options;
  options.timeout = std::chrono::milliseconds(300);
  options.check_fingerprints = false;
  auto failures = run_ranks_collecting(
      2,
      [&](std::shared_ptr<Communicator> comm) -> asio::awaitable<void> {
        if (comm->rank() == 1) {  // skips the all-reduce, and outlives rank 0's deadline
          asio::steady_timer busy(co_await asio::this_coro::executor, std::chrono::seconds(1));
          co_await busy.async_wait(asio::use_awaitable);
          co_return;
        }
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

// A partner that skips the call and ends its program: its peer fails at once, not at its
// deadline, naming it and how many operations it did issue.
TEST(Mismatch, APartnerThatEndsWithoutTheCallFailsItsPeersAtOnceNamingIt) {
  Communicator::Options options;
  options.timeout = std::chrono::seconds(30);
  auto started = std::chrono::steady_clock::now();
  auto failures = run_ranks_collecting(
      2,
      [&](std::shared_ptr<Communicator> comm) -> asio::awaitable<void> {
        std::vector<float> data(1000, 1.0f);
        co_await comm->all_reduce(Buffer(data), ReduceOp::sum);
        if (comm->rank() == 1) co_return;  // one all-reduce fewer
        co_await comm->all_reduce(Buffer(data), ReduceOp::sum);
      },
      options);
  EXPECT_LT(std::chrono::steady_clock::now() - started, std::chrono::seconds(5));
  EXPECT_FALSE(failures[1]);
  ASSERT_TRUE(failures[0]) << "rank 0's second all-reduce completed without its partner";
  try {
    std::rethrow_exception(failures[0]);
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), make_error_code(Errc::peer_failed)) << e.what();
    EXPECT_THAT(e.what(), HasSubstr("rank 1 ended its program (left the job) after issuing 1 "
                                    "operation(s) on this communicator; this is operation 2"));
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
        co_await expect_all_gather_mismatch(*comm, comm->rank() == 1 ? 8000 : 8192, std::move(both),
                                            mismatches);
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
            EXPECT_THAT(e.what(),
                        HasSubstr(fmt::format(
                            "rank 0 sends {} elements to rank 1, which expects {}", n, n - n / 3)));
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
      // A rank that sees the desync first leaves through it, and its announcement quotes
      // it: a rank still exchanging fingerprints with it may hear of the desync that way.
      EXPECT_TRUE(e.code() == Errc::desync || e.code() == Errc::peer_failed) << e.what();
      EXPECT_THAT(e.what(), HasSubstr("all_reduce(count 16, f32, sum)"));
      EXPECT_THAT(e.what(), HasSubstr("broadcast(count 16, f32, root 0)"));
    }
  }
}

}  // namespace
}  // namespace braid::collectives
