// Which small collectives a trace records (sampling.hpp): a uniform, rank-independent
// one-in-n choice below a size, and every call above it.
#include <set>

#include <gtest/gtest.h>

#include <braid/core/error.hpp>
#include <braid/trace/sampling.hpp>

#include "../support/scoped_env.hpp"

namespace braid::trace {
namespace {

TEST(SmallOpSampling, CallsAtOrAboveTheSizeAreAllRecordedAndStandForThemselves) {
  const SmallOpSampling sampling(16 << 10, 64);
  for (std::uint64_t sequence = 0; sequence < 1000; ++sequence) {
    EXPECT_EQ(sampling.weight(16 << 10, sequence), 1u);
    EXPECT_EQ(sampling.weight(1 << 20, sequence), 1u);
  }
}

TEST(SmallOpSampling, SmallCallsAreRecordedAboutOneInNAndEachStandsForN) {
  const SmallOpSampling sampling(16 << 10, 64);
  constexpr int kCalls = 64 * 4000;
  int recorded = 0;
  for (std::uint64_t sequence = 0; sequence < kCalls; ++sequence) {
    const std::uint32_t weight = sampling.weight(8, sequence);
    ASSERT_TRUE(weight == 0 || weight == 64) << weight;
    recorded += weight == 64;
  }
  // 4000 expected; a binomial's standard deviation is ~63, so ±300 is ~5 sigma.
  EXPECT_NEAR(recorded, 4000, 300);
}

TEST(SmallOpSampling, TheChoiceDependsOnlyOnTheSequenceSoEveryRankRecordsTheSameCalls) {
  // Two "ranks" with their own instances, as every member of a communicator has.
  const SmallOpSampling rank0(16 << 10, 8);
  const SmallOpSampling rank1(16 << 10, 8);
  for (std::uint64_t sequence = 0; sequence < 4096; ++sequence) {
    EXPECT_EQ(rank0.weight(8, sequence, 3), rank1.weight(8, sequence, 3));
    // A rank whose call is another small size still agrees.
    EXPECT_EQ(rank0.weight(8, sequence, 3), rank1.weight(4096, sequence, 3));
  }
}

TEST(SmallOpSampling, APeriodicPatternOfCallsIsSampledInEveryPhase) {
  // Calls alternate between two kinds; "every 8th call" would only ever see one of them.
  const SmallOpSampling sampling(16 << 10, 8);
  int recorded[2] = {0, 0};
  for (std::uint64_t sequence = 0; sequence < 8 * 2000; ++sequence) {
    recorded[sequence % 2] += sampling.weight(8, sequence) != 0;
  }
  EXPECT_NEAR(recorded[0], 1000, 150);
  EXPECT_NEAR(recorded[1], 1000, 150);
}

TEST(SmallOpSampling, CommunicatorsRunningInStepChooseDifferentCalls) {
  const SmallOpSampling sampling(16 << 10, 8);
  std::set<std::uint64_t> first;
  std::set<std::uint64_t> second;
  for (std::uint64_t sequence = 0; sequence < 4096; ++sequence) {
    if (sampling.weight(8, sequence, 1) != 0) first.insert(sequence);
    if (sampling.weight(8, sequence, 2) != 0) second.insert(sequence);
  }
  EXPECT_NE(first, second);
}

TEST(SmallOpSampling, ACommunicatorsFirstCallsAreAllRecordedSoShortRunsCountExactly) {
  SmallOpSampling sampling(16 << 10, 64);
  sampling.record_whole_until(100 + 64);  // a communicator whose first sequence is 100
  for (std::uint64_t sequence = 100; sequence < 164; ++sequence) {
    EXPECT_EQ(sampling.weight(8, sequence), 1u);
  }
  int sampled = 0;
  for (std::uint64_t sequence = 164; sequence < 164 + 64 * 100; ++sequence) {
    const std::uint32_t weight = sampling.weight(8, sequence);
    ASSERT_NE(weight, 1u);
    sampled += weight == 64;
  }
  EXPECT_GT(sampled, 50);
  EXPECT_LT(sampled, 150);
}

TEST(SmallOpSampling, EveryOneOrNoSizeRecordsEveryCall) {
  for (const SmallOpSampling sampling :
       {SmallOpSampling(), SmallOpSampling(16 << 10, 1), SmallOpSampling(0, 64)}) {
    for (std::uint64_t sequence = 0; sequence < 1000; ++sequence) {
      EXPECT_EQ(sampling.weight(8, sequence), 1u);
    }
  }
}

TEST(SmallOpSampling, TheEnvironmentSetsBothAndMalformedValuesNameTheVariable) {
  {
    const testing::ScopedEnv kib("BRAID_TRACE_SAMPLE_KIB", "4");
    const testing::ScopedEnv every("BRAID_TRACE_SAMPLE_EVERY", "16");
    const SmallOpSampling sampling = SmallOpSampling::from_environment();
    EXPECT_EQ(sampling.below_bytes(), 4u << 10);
    EXPECT_EQ(sampling.every(), 16u);
  }
  const SmallOpSampling defaults = SmallOpSampling::from_environment();
  EXPECT_EQ(defaults.below_bytes(), 16u << 10);
  EXPECT_EQ(defaults.every(), 64u);
  for (const auto& [name, value] :
       {std::pair{"BRAID_TRACE_SAMPLE_EVERY", "0"}, std::pair{"BRAID_TRACE_SAMPLE_EVERY", "often"},
        std::pair{"BRAID_TRACE_SAMPLE_KIB", "-1"}}) {
    const testing::ScopedEnv bad(name, value);
    try {
      SmallOpSampling::from_environment();
      ADD_FAILURE() << name << "=" << value << " was accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), Errc::invalid_environment);
      EXPECT_NE(std::string(e.what()).find(name), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace braid::trace
