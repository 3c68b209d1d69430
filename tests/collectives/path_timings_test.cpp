// PathTimings: which of two ways an operation takes, from how long each took lately
// (path_timings.hpp).
#include "collectives/path_timings.hpp"

#include <chrono>
#include <cstddef>

#include <gtest/gtest.h>

namespace braid::collectives::detail {
namespace {

using Path = PathTimings::Path;
using std::chrono::microseconds;
constexpr std::size_t kBytes = std::size_t{1} << 20;

// Runs `calls` calls of `bytes`, the first way taking `first` and the second `second`;
// returns how many took the second.
int run(PathTimings& timings, int calls, microseconds first, microseconds second,
        std::size_t bytes = kBytes) {
  int took_second = 0;
  for (int i = 0; i < calls; ++i) {
    const Path path = timings.choose(bytes);
    took_second += path == Path::second ? 1 : 0;
    timings.record(bytes, path, path == Path::second ? second : first);
  }
  return took_second;
}

TEST(PathTimings, TriesBothWaysAlternatelyBeforeChoosing) {
  PathTimings timings;
  for (std::uint32_t i = 0; i < PathTimings::kFirstSamples; ++i) {
    EXPECT_EQ(timings.choose(kBytes), Path::first);
    timings.record(kBytes, Path::first, microseconds(100));
    EXPECT_EQ(timings.choose(kBytes), Path::second);
    timings.record(kBytes, Path::second, microseconds(50));
  }
  EXPECT_DOUBLE_EQ(timings.average_ns(kBytes, Path::second), 50'000.0);
}

TEST(PathTimings, TakesTheFasterWayAndTheSlowerOnlyNowAndThen) {
  PathTimings timings;
  run(timings, 2 * PathTimings::kFirstSamples, microseconds(90), microseconds(60));
  const int calls = 20 * PathTimings::kExploreEvery;
  const int second = run(timings, calls, microseconds(90), microseconds(60));
  EXPECT_EQ(second, calls - calls / static_cast<int>(PathTimings::kExploreEvery));
}

TEST(PathTimings, FollowsAChangeOfPhaseWithinAFewExplorations) {
  PathTimings timings;
  run(timings, 2 * PathTimings::kFirstSamples + 64, microseconds(60), microseconds(90));
  // Now the first way slows threefold and the second stays: a few explorations of the
  // second show it, and from then on it is taken.
  run(timings, 8 * PathTimings::kExploreEvery, microseconds(180), microseconds(90));
  const int calls = 4 * PathTimings::kExploreEvery;
  EXPECT_EQ(run(timings, calls, microseconds(180), microseconds(90)),
            calls - calls / static_cast<int>(PathTimings::kExploreEvery));
}

TEST(PathTimings, AWaysFirstCallAndASingleOutlierDoNotCondemnIt) {
  PathTimings timings;
  // First calls pay for first touches: a second way whose first call took 100x longer.
  timings.record(kBytes, Path::first, microseconds(60));
  timings.record(kBytes, Path::second, microseconds(9000));
  for (std::uint32_t i = 1; i < PathTimings::kFirstSamples; ++i) {
    timings.record(kBytes, Path::first, microseconds(90));
    timings.record(kBytes, Path::second, microseconds(60));
  }
  EXPECT_EQ(timings.choose(kBytes), Path::second);
  // One call 50x slower than usual moves the average by at most kOutlier times it / kWeight.
  timings.record(kBytes, Path::second, microseconds(3000));
  EXPECT_LE(timings.average_ns(kBytes, Path::second),
            60'000.0 * (1.0 + (PathTimings::kOutlier - 1.0) / PathTimings::kWeight));
}

TEST(PathTimings, EachPowerOfTwoOfBytesIsTimedOnItsOwn) {
  PathTimings timings;
  run(timings, 40, microseconds(60), microseconds(90), kBytes);
  run(timings, 40, microseconds(900), microseconds(300), 16 * kBytes);
  EXPECT_EQ(timings.choose(kBytes + 1), Path::first);
  EXPECT_EQ(timings.choose(16 * kBytes + 5), Path::second);
  EXPECT_EQ(timings.average_ns(4 * kBytes, Path::first), 0.0) << "never timed";
}

}  // namespace
}  // namespace braid::collectives::detail
