// Staging (src/collectives/staging.hpp): the chunk plan, the element-wise pipeline's
// ordering on a host copy stream (a slot is refilled only after it was emptied), the
// whole-buffer path's aliasing, failure draining, and the UCX communicator running every
// staged path end to end with a host copy engine standing in for the GPU's. Buffers are
// labelled CUDA memory but live on the host, so the staged code paths run without a GPU.
#include "collectives/staging.hpp"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <mutex>
#include <numeric>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <braid/collectives/communicator.hpp>
#include <braid/core/error.hpp>
#include <braid/core/host_stream.hpp>

#include "../support/rank_threads.hpp"
#include "collectives/staging_engine_override.hpp"

namespace braid::collectives {
namespace {

using detail::ElementwiseStaging;
using detail::HostCopyEngine;
using detail::StagingPlan;
using detail::StagingPool;

// Small chunks, so that test-sized buffers take many trips through the slots. Read once
// by the library, so set before any staging runs.
const bool kSmallChunks = [] { return ::setenv("BRAID_STAGING_CHUNK_KIB", "4", 1) == 0; }();

Buffer as_device(std::vector<float>& v) {
  return Buffer(v.data(), v.size(), DType::f32, MemoryKind::cuda, 0);
}

TEST(StagingPlan, ChunksCoverTheBytesInWholeElementsAndTakeTheSlotsInTurn) {
  const StagingPlan plan(1000, 8, 300, 3);  // 296-byte chunks: 37 whole f64
  ASSERT_EQ(plan.chunks(), 4u);
  EXPECT_EQ(plan.slot_bytes(), 296u);
  std::size_t covered = 0;
  for (std::size_t k = 0; k < plan.chunks(); ++k) {
    const auto c = plan.chunk(k);
    EXPECT_EQ(c.offset, covered);
    EXPECT_EQ(c.offset % 8, 0u);
    EXPECT_EQ(c.slot, k % 3);
    covered += c.bytes;
  }
  EXPECT_EQ(covered, 1000u);
  EXPECT_EQ(plan.chunk(3).bytes, 1000u - 3 * 296);
}

TEST(StagingPlan, EdgeSizesGiveNoChunksOrOneElementChunksOrOneSmallSlot) {
  EXPECT_EQ(StagingPlan(0, 4, 4096, 3).chunks(), 0u);
  const StagingPlan tiny_chunks(12, 4, 1, 3);  // a chunk is never less than an element
  EXPECT_EQ(tiny_chunks.chunks(), 3u);
  EXPECT_EQ(tiny_chunks.chunk(2).bytes, 4u);
  const StagingPlan small(40, 4, 4096, 3);  // a slot is no larger than the transfer
  EXPECT_EQ(small.chunks(), 1u);
  EXPECT_EQ(small.slot_bytes(), 40u);
}

// What the copy engine did, in the order its stream ran it.
struct CopyLog {
  struct Copy {
    const std::byte* dst;
    const std::byte* src;
    std::size_t bytes;
  };
  std::mutex mutex;
  std::vector<Copy> copies;
  HostCopyEngine::CopyObserver observer() {
    return [this](void* dst, const void* src, std::size_t bytes) {
      std::lock_guard lock(mutex);
      copies.push_back({static_cast<std::byte*>(dst), static_cast<const std::byte*>(src), bytes});
    };
  }
  std::size_t size() {
    std::lock_guard lock(mutex);
    return copies.size();
  }
};

bool inside(const std::byte* p, const std::vector<float>& v) {
  const auto* begin = reinterpret_cast<const std::byte*>(v.data());
  return p >= begin && p < begin + v.size() * sizeof(float);
}

// Runs a pipeline on a runtime of its own and returns when it has finished.
void run_on_runtime(asio::awaitable<void> work) {
  Runtime runtime;
  runtime.spawn(std::move(work)).get();
}

TEST(ElementwiseStaging, RefillsASlotOnlyAfterItsLastChunkWasCopiedOutAndKeepsTheResults) {
  CopyLog log;
  HostCopyEngine engine(log.observer());
  StagingPool pool(engine);
  std::vector<float> input(10000);
  std::iota(input.begin(), input.end(), 0.0F);
  std::vector<float> output(input.size(), -1.0F);
  std::vector<std::size_t> chunk_sizes;
  detail::ChunkRunner doubling = [&](Buffer chunk) -> asio::awaitable<void> {
    for (float& x : chunk.as<float>()) x *= 2;
    chunk_sizes.push_back(chunk.count());
    co_return;
  };
  const ElementwiseStaging staging{
      .input = as_device(input), .output = as_device(output), .chunk_bytes = 4096};
  run_on_runtime(detail::run_elementwise_staged(engine, pool, staging, doubling,
                                                deadline_after(std::chrono::seconds(20))));
  for (std::size_t i = 0; i < input.size(); ++i) ASSERT_EQ(output[i], 2.0F * input[i]) << i;
  const std::size_t chunks = chunk_sizes.size();
  ASSERT_EQ(chunks, (input.size() * 4 + 4095) / 4096);
  ASSERT_EQ(log.copies.size(), 2 * chunks);
  // Pair each copy with its chunk: copies in read the input, copies out write the output.
  std::vector<std::size_t> in_at(chunks), out_at(chunks);
  for (std::size_t i = 0; i < log.copies.size(); ++i) {
    const auto& c = log.copies[i];
    if (inside(c.src, input)) {
      in_at[static_cast<std::size_t>(c.src - reinterpret_cast<const std::byte*>(input.data())) /
            4096] = i;
    } else {
      ASSERT_TRUE(inside(c.dst, output));
      out_at[static_cast<std::size_t>(c.dst - reinterpret_cast<std::byte*>(output.data())) / 4096] =
          i;
    }
  }
  for (std::size_t k = 0; k < chunks; ++k) {
    EXPECT_LT(in_at[k], out_at[k]) << "chunk " << k;
    if (k >= detail::kStagingSlots) {
      EXPECT_GT(in_at[k], out_at[k - detail::kStagingSlots])
          << "chunk " << k << " overwrote its slot before chunk " << k - detail::kStagingSlots
          << " was copied out";
    }
  }
  // Prefetch: the first slots are filled before the first chunk is copied out.
  EXPECT_LT(in_at[detail::kStagingSlots - 1], out_at[0]);
}

TEST(ElementwiseStaging, SkipsTheCopiesASideDoesNotNeed) {
  CopyLog log;
  HostCopyEngine engine(log.observer());
  StagingPool pool(engine);
  std::vector<float> data(3000, 5.0F);
  // A broadcast receiver: nothing copied in, the result copied out.
  detail::ChunkRunner fill = [](Buffer chunk) -> asio::awaitable<void> {
    for (float& x : chunk.as<float>()) x = 7.0F;
    co_return;
  };
  run_on_runtime(detail::run_elementwise_staged(
      engine, pool,
      {.input = as_device(data), .output = as_device(data), .copy_in = false, .chunk_bytes = 4096},
      fill, deadline_after(std::chrono::seconds(20))));
  EXPECT_THAT(data, ::testing::Each(7.0F));
  for (const auto& c : log.copies) EXPECT_FALSE(inside(c.src, data));
  // A reduce's non-root: copied in, nothing copied back.
  const std::size_t before = log.size();
  run_on_runtime(detail::run_elementwise_staged(
      engine, pool,
      {.input = as_device(data), .output = as_device(data), .copy_out = false, .chunk_bytes = 4096},
      fill, deadline_after(std::chrono::seconds(20))));
  EXPECT_THAT(data, ::testing::Each(7.0F));
  EXPECT_EQ(log.size() - before, 3u);  // three chunks in, none out
}

TEST(ElementwiseStaging, AFailingChunkLeavesNoCopyRunningWhenTheErrorArrives) {
  CopyLog log;
  HostCopyEngine engine(log.observer());
  StagingPool pool(engine);
  std::vector<float> input(20000, 1.0F);
  std::vector<float> output(input.size(), 0.0F);
  int chunk = 0;
  detail::ChunkRunner failing = [&](Buffer) -> asio::awaitable<void> {
    if (++chunk == 3) throw Error(Errc::peer_failed, "the network went away");
    co_return;
  };
  try {
    run_on_runtime(detail::run_elementwise_staged(
        engine, pool, {.input = as_device(input), .output = as_device(output), .chunk_bytes = 4096},
        failing, deadline_after(std::chrono::seconds(20))));
    FAIL() << "the chunk's error did not reach the caller";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), make_error_code(Errc::peer_failed));
  }
  const std::size_t settled = log.size();
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(log.size(), settled) << "copies kept running after the error was reported";
  EXPECT_TRUE(engine.stream().query());
}

TEST(WholeStaging, HostViewsAliasLikeTheCallersBuffersAndOnlyProducedBytesComeBack) {
  HostCopyEngine engine;
  StagingPool pool(engine);
  // In-place all-gather: the input is block 1 of the output.
  std::vector<float> output(12, 0.0F);
  for (std::size_t i = 4; i < 8; ++i) output[i] = static_cast<float>(i);
  const Buffer device_output = as_device(output);
  const Buffer device_input = device_output.slice(4, 4);
  detail::WholeRunner check_alias = [](Buffer in, Buffer out) -> asio::awaitable<std::size_t> {
    EXPECT_EQ(in.data(), out.slice(4, 4).data());
    EXPECT_EQ(in.as<float>()[0], 4.0F);  // copied in
    for (std::size_t i = 0; i < 4; ++i) out.as<float>()[i] = -1.0F;
    co_return out.size_bytes();
  };
  run_on_runtime(detail::run_whole_staged(engine, pool, device_input, device_output, check_alias,
                                          deadline_after(std::chrono::seconds(20))));
  EXPECT_EQ(output[0], -1.0F);
  EXPECT_EQ(output[5], 5.0F);
  // A receive of 3 elements into a buffer of 8: the tail stays as it was.
  std::vector<float> received(8, 9.0F);
  detail::WholeRunner receive_three = [](Buffer, Buffer out) -> asio::awaitable<std::size_t> {
    for (float& x : out.as<float>()) x = 1.0F;
    co_return 3 * sizeof(float);
  };
  run_on_runtime(detail::run_whole_staged(engine, pool, Buffer(nullptr, 0, DType::f32),
                                          as_device(received), receive_three,
                                          deadline_after(std::chrono::seconds(20))));
  EXPECT_THAT(received, ::testing::ElementsAre(1, 1, 1, 9, 9, 9, 9, 9));
}

// ---- the communicator's staged paths, end to end over UCX

// Before its first call: `comm` stages through host memory (staging_engine_override.hpp).
void stage_on_host(Communicator& comm) {
  detail::StagingEngineOverride::install(comm, [](int) -> std::unique_ptr<detail::CopyEngine> {
    return std::make_unique<HostCopyEngine>();
  });
}

TEST(StagedCommunicator, EveryCollectiveOnCudaLabelledBuffersMatchesTheReference) {
  ASSERT_TRUE(kSmallChunks);
  for (int world : {2, 3}) {
    braid::testing::run_ranks(
        world, [world](std::shared_ptr<Communicator> comm) -> asio::awaitable<void> {
          stage_on_host(*comm);
          const int r = comm->rank();
          const auto P = static_cast<std::size_t>(world);
          for (std::size_t count :
               {std::size_t{0}, std::size_t{1}, std::size_t{1031}, std::size_t{30011}}) {
            std::vector<float> data(count);
            for (std::size_t i = 0; i < count; ++i)
              data[i] = static_cast<float>(r + 1 + static_cast<int>(i % 5));
            std::vector<float> sum(count, -1.0F);
            co_await comm->all_reduce(as_device(data), as_device(sum), ReduceOp::sum);
            for (std::size_t i = 0; i < count; ++i) {
              const float expected =
                  static_cast<float>(world * (world + 1) / 2 + world * static_cast<int>(i % 5));
              if (sum[i] != expected) {
                ADD_FAILURE() << "all_reduce count " << count << " element " << i << ": " << sum[i];
                break;
              }
            }
            // broadcast from the last rank, in place.
            std::vector<float> broadcast(count, static_cast<float>(r));
            co_await comm->broadcast(as_device(broadcast), world - 1);
            EXPECT_THAT(broadcast, ::testing::Each(static_cast<float>(world - 1)));
            // reduce to rank 0: non-roots' outputs are not touched.
            std::vector<float> reduced(count, -3.0F);
            co_await comm->reduce(as_device(data), r == 0 ? as_device(reduced) : Buffer{},
                                  ReduceOp::max, 0);
            for (std::size_t i = 0; i < count && r == 0; ++i) {
              EXPECT_EQ(reduced[i], static_cast<float>(world + static_cast<int>(i % 5)));
            }
            if (r != 0) {
              EXPECT_THAT(reduced, ::testing::Each(-3.0F));
            }
          }
          // all_gather in place and reduce_scatter out of place, staged whole.
          std::vector<float> gathered(4 * P, 0.0F);
          for (std::size_t i = 0; i < 4; ++i)
            gathered[static_cast<std::size_t>(r) * 4 + i] = static_cast<float>(r);
          co_await comm->all_gather(as_device(gathered));
          for (std::size_t i = 0; i < gathered.size(); ++i)
            EXPECT_EQ(gathered[i], static_cast<float>(i / 4));
          std::vector<float> blocks(3 * P, 1.0F);
          std::vector<float> mine(3, 0.0F);
          co_await comm->reduce_scatter(as_device(blocks), as_device(mine), ReduceOp::sum);
          EXPECT_THAT(mine, ::testing::Each(static_cast<float>(world)));
          std::vector<float> exchange(2 * P);
          for (std::size_t i = 0; i < exchange.size(); ++i)
            exchange[i] = static_cast<float>(r * 100 + static_cast<int>(i / 2));
          std::vector<float> exchanged(exchange.size());
          co_await comm->all_to_all(as_device(exchange), as_device(exchanged));
          for (std::size_t i = 0; i < exchanged.size(); ++i) {
            EXPECT_EQ(exchanged[i], static_cast<float>(static_cast<int>(i / 2) * 100 + r));
          }
        });
  }
}

// A buffer that names its producer stream (Buffer::on_stream) is staged after the work
// enqueued there before the call: values that stream writes later than the call are
// the ones reduced, for the chunked and the whole-buffer paths alike.
TEST(StagedCommunicator, ABufferOrderedOnAStreamIsCopiedAfterThatStreamsEarlierWork) {
  braid::testing::run_ranks(2, [](std::shared_ptr<Communicator> comm) -> asio::awaitable<void> {
    stage_on_host(*comm);
    HostStream producer("producer");
    const float mine = static_cast<float>(comm->rank() + 1);
    std::vector<float> data(3000, 0.0F);
    std::vector<float> gathered(2 * data.size(), 0.0F);
    const auto write_late = [&producer, &data, mine] {
      producer.enqueue([&data, mine] {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
        std::fill(data.begin(), data.end(), mine);
      });
    };
    write_late();
    co_await comm->all_reduce(as_device(data).on_stream(&producer), ReduceOp::sum);
    EXPECT_THAT(data, ::testing::Each(3.0F));
    write_late();
    co_await comm->all_gather(as_device(data).on_stream(&producer),
                              as_device(gathered).on_stream(&producer));
    const auto half = static_cast<std::ptrdiff_t>(data.size());
    EXPECT_TRUE(
        std::all_of(gathered.begin(), gathered.begin() + half, [](float x) { return x == 1.0F; }));
    EXPECT_TRUE(
        std::all_of(gathered.begin() + half, gathered.end(), [](float x) { return x == 2.0F; }));
  });
}

TEST(StagedCommunicator, SendAndRecvStageAndAShortMessageLeavesTheRestOfTheBufferAlone) {
  braid::testing::run_ranks(2, [](std::shared_ptr<Communicator> comm) -> asio::awaitable<void> {
    stage_on_host(*comm);
    if (comm->rank() == 0) {
      std::vector<float> message(5000, 2.5F);
      co_await comm->send(as_device(message), 1);
    } else {
      std::vector<float> inbox(6000, -1.0F);
      const std::size_t got = co_await comm->recv(as_device(inbox), 0);
      EXPECT_EQ(got, 5000u);
      EXPECT_EQ(inbox[4999], 2.5F);
      EXPECT_EQ(inbox[5000], -1.0F);
    }
  });
}

TEST(StagedCommunicator, RanksThatDisagreeOnWhereTheBuffersAreFailAsADesyncWithFingerprints) {
  Communicator::Options options;
  options.check_fingerprints = true;
  options.timeout = std::chrono::seconds(10);
  const auto failures = braid::testing::run_ranks_collecting(
      2,
      [](std::shared_ptr<Communicator> comm) -> asio::awaitable<void> {
        stage_on_host(*comm);
        std::vector<float> values(1000, 1.0F);
        // Rank 0 passes CUDA memory (staged), rank 1 host memory, same count and dtype.
        co_await comm->all_reduce(comm->rank() == 0 ? as_device(values) : Buffer(values),
                                  ReduceOp::sum);
      },
      options);
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(failures[static_cast<std::size_t>(r)]) << "rank " << r << " did not fail";
    try {
      std::rethrow_exception(failures[static_cast<std::size_t>(r)]);
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), make_error_code(Errc::desync)) << e.what();
      EXPECT_THAT(e.what(), ::testing::HasSubstr("CUDA memory staged through the host"));
    }
  }
}

TEST(StagedCommunicator, BuffersInDifferentPlacesAreRejectedAtTheCall) {
  braid::testing::run_ranks(1, [](std::shared_ptr<Communicator> comm) -> asio::awaitable<void> {
    stage_on_host(*comm);
    std::vector<float> host(4), device(4);
    try {
      co_await comm->all_reduce(Buffer(host), as_device(device), ReduceOp::sum);
      ADD_FAILURE() << "host input with a CUDA output was accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), make_error_code(Errc::invalid_argument));
      EXPECT_THAT(e.what(), ::testing::HasSubstr("both must be in the same place"));
    }
  });
}

}  // namespace
}  // namespace braid::collectives
