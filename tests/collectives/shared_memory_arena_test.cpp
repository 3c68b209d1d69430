// When a shared-memory all-reduce reads peers' memory directly (SingleCopy in
// shared_memory_arena.hpp): the rule every rank applies alike, from what the members
// agreed when they mapped the arena and the call's size. Where the answer is `measured`,
// rank 0's timings choose per operation and its record tells the others (ArenaTurn::post;
// path_timings_test.cpp, and collectives_process_test.cpp for every rank following it).
#include "collectives/shared_memory_arena.hpp"

#include <cstddef>

#include <gtest/gtest.h>

namespace braid::collectives::detail {
namespace {

using Reads = SharedMemoryArena::AllReduceReads;
using Direct = SharedMemoryArena::AllReduceDirect;
constexpr std::size_t kMeasuredFrom = SharedMemoryArena::kMeasuredFrom;

TEST(SharedMemoryArenaSingleCopy, ByDefaultAllReduceMeasuresBothWaysFrom64KiB) {
  SharedMemoryArena arena(2, SingleCopy::measured);
  arena.set_single_copy(/*all_can=*/true, Direct::measured);
  EXPECT_TRUE(arena.single_copy()) << "the other collectives read peers at every size";
  EXPECT_EQ(kMeasuredFrom, 64 * 1024);
  EXPECT_EQ(arena.single_copy_all_reduce(32 * 1024), Reads::segment);
  EXPECT_EQ(arena.single_copy_all_reduce(kMeasuredFrom - 1), Reads::segment);
  EXPECT_EQ(arena.single_copy_all_reduce(kMeasuredFrom), Reads::measured);
  EXPECT_EQ(arena.single_copy_all_reduce(std::size_t{64} << 20), Reads::measured);
}

TEST(SharedMemoryArenaSingleCopy, ForcedSingleCopyReadsPeersAtEverySize) {
  SharedMemoryArena arena(4, SingleCopy::whenever_allowed);
  arena.set_single_copy(/*all_can=*/true, Direct::always);
  EXPECT_EQ(arena.single_copy_all_reduce(32 * 1024), Reads::peers);
  EXPECT_EQ(arena.single_copy_all_reduce(std::size_t{64} << 20), Reads::peers);
}

TEST(SharedMemoryArenaSingleCopy, NoSingleCopyAtAllWhereSomeMemberCannotReadPeers) {
  SharedMemoryArena arena(4, SingleCopy::measured);
  arena.set_single_copy(/*all_can=*/false, Direct::always);
  EXPECT_FALSE(arena.single_copy());
  EXPECT_EQ(arena.single_copy_all_reduce(128 * 1024), Reads::segment);
  EXPECT_EQ(arena.single_copy_all_reduce(std::size_t{64} << 20), Reads::segment);
}

}  // namespace
}  // namespace braid::collectives::detail
