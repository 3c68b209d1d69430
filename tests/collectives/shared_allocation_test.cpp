// Communicator::allocate_shared: memory every member on a node maps, and the collectives
// that reach peers' buffers through it. Worlds of threads-as-ranks (thread_ranks.hpp):
// every rank still maps the segment itself, as a process would.
#include <cstdint>
#include <cstring>
#include <set>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <braid/collectives/communicator.hpp>
#include <braid/core/error.hpp>
#include <braid/trace/recorder.hpp>

#include "../support/scoped_env.hpp"
#include "all_reduce_check.hpp"
#include "thread_ranks.hpp"
#include "typed_values.hpp"

namespace braid::collectives {
namespace {

using ::testing::HasSubstr;
using testing::Mismatch;
using testing::run_ranks;
using testing::TypedVector;

Communicator::Options shared_memory_only() {
  Communicator::Options options;
  options.timeout = std::chrono::seconds(20);
  options.selection = std::make_shared<const SelectionTable>(
      SelectionTable::with_overrides("allreduce:0-inf:shared_memory"));
  return options;
}

// The names of the collective phases recorded while `body` ran on every rank.
std::set<std::string> phases_recorded(int world, const testing::RankBody& body,
                                      Communicator::Options options,
                                      std::vector<int> node_of_rank = {}) {
  trace::clear();
  trace::set_enabled(true);
  run_ranks(world, body, std::move(options), std::move(node_of_rank));
  trace::set_enabled(false);
  std::set<std::string> names;
  for (const trace::Record& record : trace::snapshot().records) names.insert(record.name);
  return names;
}

bool all_zero(const std::byte* data, std::size_t bytes) {
  for (std::size_t i = 0; i < bytes; ++i) {
    if (data[i] != std::byte{0}) return false;
  }
  return true;
}

// all_reduce of `count` elements from `input` into `output`, then in place on `input`,
// checked against the serial reference. Returns the first wrong element, or "".
asio::awaitable<std::string> reduce_and_check(Communicator& comm, DType dtype, ReduceOp op,
                                              std::size_t count, std::byte* input,
                                              std::byte* output) {
  TypedVector in(dtype, count, input);
  TypedVector out(dtype, count, output);
  Mismatch mismatch;
  co_await check_all_reduce(comm, in, out, op, "allocate_shared", mismatch);
  co_return mismatch.what;
}

TEST(AllocateShared, GivesEveryRankZeroedPageAlignedMemoryOfItsOwn) {
  run_ranks(3, [](std::shared_ptr<Communicator> comm) -> asio::awaitable<void> {
    const std::size_t bytes = 10000;
    std::shared_ptr<std::byte[]> memory = co_await comm->allocate_shared(bytes);
    EXPECT_NE(memory, nullptr);
    if (memory == nullptr) co_return;
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(memory.get()) % 4096, 0u);
    EXPECT_TRUE(all_zero(memory.get(), bytes));
    // Each rank's region is its own: writing all of it disturbs no one else's.
    std::memset(memory.get(), comm->rank() + 1, bytes);
    co_await comm->barrier();
    std::size_t mine = 0;
    while (mine < bytes && memory[mine] == std::byte(comm->rank() + 1)) ++mine;
    EXPECT_EQ(mine, bytes) << "rank " << comm->rank() << ": a byte of its region was changed";
  });
}

// With cross-memory attach switched off, the only way a rank can read peers' buffers is
// through its own mapping of them: the single-copy phase ("shared_memory.reduce") shows it
// ran, where otherwise every chunk would go through the segment ("shared_memory.chunk").
TEST(AllocateShared, AllReduceReachesPeersThroughTheMappingAndMatchesTheReference) {
  const braid::testing::ScopedEnv no_cross_memory("BRAID_SHM_SINGLE_COPY", "0");
  for (const int world : {2, 3, 4}) {
    const std::set<std::string> phases = phases_recorded(
        world,
        [](std::shared_ptr<Communicator> comm) -> asio::awaitable<void> {
          std::shared_ptr<std::byte[]> memory = co_await comm->allocate_shared(4 << 20);
          // Buffers at an odd offset into the region, and a second one after the first.
          std::byte* const input = memory.get() + 64;
          std::byte* const output = memory.get() + (2 << 20);
          std::string wrong;
          for (const DType dtype : {DType::f32, DType::f64, DType::bf16, DType::i32}) {
            for (const ReduceOp op : {ReduceOp::sum, ReduceOp::avg, ReduceOp::max}) {
              // Above the inline slots' 16 KiB, with a count no world divides.
              const std::size_t count = 20011;
              if (wrong.empty())
                wrong = co_await reduce_and_check(*comm, dtype, op, count, input, output);
            }
          }
          // Several fold pieces per rank's block.
          if (wrong.empty()) {
            wrong =
                co_await reduce_and_check(*comm, DType::f32, ReduceOp::sum, 400009, input, output);
          }
          EXPECT_EQ(wrong, "");
        },
        shared_memory_only());
    EXPECT_TRUE(phases.contains("shared_memory.reduce")) << world << " ranks";
    EXPECT_FALSE(phases.contains("shared_memory.chunk")) << world << " ranks";
  }
}

TEST(AllocateShared, ABufferOutsideTheAllocationOnAnyRankTakesTheUsualPath) {
  const braid::testing::ScopedEnv no_cross_memory("BRAID_SHM_SINGLE_COPY", "0");
  const std::set<std::string> phases = phases_recorded(
      2,
      [](std::shared_ptr<Communicator> comm) -> asio::awaitable<void> {
        std::shared_ptr<std::byte[]> memory = co_await comm->allocate_shared(1 << 20);
        std::vector<std::byte> private_memory(1 << 20);
        std::byte* const data = comm->rank() == 1 ? private_memory.data() : memory.get();
        EXPECT_EQ(co_await reduce_and_check(*comm, DType::f32, ReduceOp::sum, 50000, data,
                                            data + (512 << 10)),
                  "");
      },
      shared_memory_only());
  EXPECT_TRUE(phases.contains("shared_memory.chunk"));
  EXPECT_FALSE(phases.contains("shared_memory.reduce"));
}

TEST(AllocateShared, RanksAskingForDifferentSizesFailAlikeAndTheCommunicatorGoesOn) {
  std::atomic<int> failures{0};
  run_ranks(3, [&](std::shared_ptr<Communicator> comm) -> asio::awaitable<void> {
    try {
      (void)co_await comm->allocate_shared(comm->rank() == 2 ? 8192 : 4096);
      ADD_FAILURE() << "rank " << comm->rank() << " allocated despite the mismatch";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), make_error_code(Errc::size_mismatch)) << e.what();
      EXPECT_THAT(e.what(), HasSubstr("rank 0 asks for 4096 bytes but rank 2 for 8192"));
      EXPECT_THAT(e.what(), HasSubstr("allocate_shared"));
      ++failures;
    }
    std::shared_ptr<std::byte[]> memory = co_await comm->allocate_shared(4096);
    EXPECT_NE(memory, nullptr);
    std::vector<float> ones(10, 1.0f);
    co_await comm->all_reduce(Buffer(ones), ReduceOp::sum);
    EXPECT_EQ(ones, std::vector<float>(10, 3.0f));
  });
  EXPECT_EQ(failures.load(), 3);
}

TEST(AllocateShared, MembersOnSeveralNodesGetPrivateMemoryThatCollectivesStillUse) {
  const std::set<std::string> phases = phases_recorded(
      2,
      [](std::shared_ptr<Communicator> comm) -> asio::awaitable<void> {
        std::shared_ptr<std::byte[]> memory = co_await comm->allocate_shared(1 << 20);
        EXPECT_NE(memory, nullptr);
        if (memory == nullptr) co_return;
        EXPECT_EQ(reinterpret_cast<std::uintptr_t>(memory.get()) % 4096, 0u);
        EXPECT_TRUE(all_zero(memory.get(), 1 << 20));
        EXPECT_EQ(co_await reduce_and_check(*comm, DType::f32, ReduceOp::avg, 50000, memory.get(),
                                            memory.get() + (512 << 10)),
                  "");
      },
      {}, {0, 1});
  for (const std::string& name : phases)
    EXPECT_THAT(name, ::testing::Not(HasSubstr("shared_memory")));
}

TEST(AllocateShared, MemoryOutlivesItsCommunicator) {
  std::vector<std::shared_ptr<std::byte[]>> kept(2);
  run_ranks(2, [&](std::shared_ptr<Communicator> comm) -> asio::awaitable<void> {
    kept[static_cast<std::size_t>(comm->rank())] = co_await comm->allocate_shared(4096);
  });
  // Every rank's communicator, world and runtime are gone; the memory is still theirs.
  for (auto& memory : kept) {
    ASSERT_NE(memory, nullptr);
    std::memset(memory.get(), 7, 4096);
    EXPECT_EQ(memory[4095], std::byte{7});
    memory.reset();
  }
}

}  // namespace
}  // namespace braid::collectives
