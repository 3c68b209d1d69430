// What the Communicator records in a trace, on worlds of threads-as-ranks
// (tests/support/rank_threads.hpp): its calls' spans under (communicator id, sequence
// number), their steps above BRAID_TRACE_STEPS_KIB, and the sampling of small calls.
#include <algorithm>
#include <array>
#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <string_view>
#include <vector>

#include <gtest/gtest.h>

#include <braid/collectives/communicator.hpp>
#include <braid/trace/recorder.hpp>

#include "../support/rank_threads.hpp"
#include "../support/scoped_env.hpp"
#include "communicator_helpers.hpp"

namespace braid::collectives {
namespace {

using braid::testing::run_ranks;
using testing::expect_environment_error_on_every_rank;
using testing::forcing;

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

TEST(Tracing, ANegativeStepThresholdIsAnEnvironmentErrorNamingTheKnob) {
  const braid::testing::ScopedEnv threshold("BRAID_TRACE_STEPS_KIB", "-1");
  expect_environment_error_on_every_rank(1, "BRAID_TRACE_STEPS_KIB=-1");
}

}  // namespace
}  // namespace braid::collectives
