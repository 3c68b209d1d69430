// When a shared-memory all-reduce reads peers' memory directly (SingleCopy in
// shared_memory_arena.hpp): the rule every rank applies alike, from what the members
// agreed when they mapped the arena and the call's size. Where the answer is
// peers_if_huge, the ranks' records decide per operation (ArenaTurn::post): every rank's
// buffers must be on huge pages (collectives_process_test.cpp,
// ACrowdedNodeReadsPeersDirectlyOnlyOnceEveryBufferIsOnHugePages).
#include "collectives/shared_memory_arena.hpp"

#include <cstddef>

#include <gtest/gtest.h>

#include "collectives/huge_page_advice.hpp"

namespace braid::collectives::detail {
namespace {

using Reads = SharedMemoryArena::AllReduceReads;
constexpr std::size_t kHugeFrom = HugePageAdvice::kSmallestBytes;

using Direct = SharedMemoryArena::AllReduceDirect;

TEST(SharedMemoryArenaSingleCopy, AnUncrowdedNodeReadsPeersFromHugePageSizes) {
  SharedMemoryArena arena(2, SingleCopy::unless_crowded);
  arena.set_single_copy(/*all_can=*/true, Direct::from_huge_sizes);
  EXPECT_TRUE(arena.single_copy()) << "the other collectives read peers at every size";
  EXPECT_EQ(arena.single_copy_all_reduce(128 * 1024), Reads::segment);
  EXPECT_EQ(arena.single_copy_all_reduce(kHugeFrom - 1), Reads::segment);
  EXPECT_EQ(arena.single_copy_all_reduce(kHugeFrom), Reads::peers);
  EXPECT_EQ(arena.single_copy_all_reduce(64 * kHugeFrom), Reads::peers);
}

TEST(SharedMemoryArenaSingleCopy, ACrowdedNodeReadsPeersOnlyOnceBuffersAreOnHugePages) {
  SharedMemoryArena arena(4, SingleCopy::unless_crowded);
  arena.set_single_copy(/*all_can=*/true, Direct::if_huge);
  EXPECT_TRUE(arena.single_copy()) << "the other collectives read peers at every size";
  EXPECT_EQ(arena.single_copy_all_reduce(128 * 1024), Reads::segment);
  EXPECT_EQ(arena.single_copy_all_reduce(kHugeFrom - 1), Reads::segment);
  EXPECT_EQ(arena.single_copy_all_reduce(kHugeFrom), Reads::peers_if_huge);
  EXPECT_EQ(arena.single_copy_all_reduce(64 * kHugeFrom), Reads::peers_if_huge);
}

TEST(SharedMemoryArenaSingleCopy, ForcedSingleCopyReadsPeersAtEverySize) {
  SharedMemoryArena arena(4, SingleCopy::whenever_allowed);
  arena.set_single_copy(/*all_can=*/true, Direct::always);
  EXPECT_EQ(arena.single_copy_all_reduce(128 * 1024), Reads::peers);
  EXPECT_EQ(arena.single_copy_all_reduce(64 * kHugeFrom), Reads::peers);
}

TEST(SharedMemoryArenaSingleCopy, NoSingleCopyAtAllWhereSomeMemberCannotReadPeers) {
  SharedMemoryArena arena(4, SingleCopy::unless_crowded);
  arena.set_single_copy(/*all_can=*/false, Direct::always);
  EXPECT_FALSE(arena.single_copy());
  EXPECT_EQ(arena.single_copy_all_reduce(128 * 1024), Reads::segment);
  EXPECT_EQ(arena.single_copy_all_reduce(64 * kHugeFrom), Reads::segment);
}

}  // namespace
}  // namespace braid::collectives::detail
