// Communicator::allocate_shared: memory every member on a node maps, and the collectives
// that reach peers' buffers through it. Worlds of threads-as-ranks
// (tests/support/rank_threads.hpp): every rank still maps the segment itself, as a process would.
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <sys/resource.h>
#include <thread>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <braid/collectives/communicator.hpp>
#include <braid/core/error.hpp>
#include <braid/trace/recorder.hpp>

#include "../support/rank_threads.hpp"
#include "../support/reduce_spans.hpp"
#include "../support/scoped_env.hpp"
#include "all_reduce_check.hpp"
#include "typed_values.hpp"

namespace braid::collectives {
namespace {

using braid::testing::run_ranks;
using ::testing::HasSubstr;
using testing::Mismatch;
using testing::TypedVector;

Communicator::Options shared_memory_only() {
  Communicator::Options options;
  options.timeout = std::chrono::seconds(20);
  options.selection = std::make_shared<const SelectionTable>(
      SelectionTable::with_overrides("allreduce:0-inf:shared_memory"));
  return options;
}

// The names of the collective phases recorded while `body` ran on every rank.
std::set<std::string> phases_recorded(int world, const braid::testing::RankBody& body,
                                      Communicator::Options options,
                                      std::vector<int> node_of_rank = {}) {
  // Every op's steps, however small the op.
  const braid::testing::ScopedEnv every_step("BRAID_TRACE_STEPS_KIB", "0");
  const braid::testing::ScopedEnv every_op("BRAID_TRACE_SAMPLE_KIB", "0");
  trace::clear();
  trace::set_enabled(true);
  run_ranks(world, body, std::move(options), std::move(node_of_rank));
  trace::set_enabled(false);
  std::set<std::string> names;
  for (const trace::Record& record : trace::snapshot().records) names.insert(record.name);
  return names;
}

// Whether `address` lies in a mapping of a file under /dev/shm (a POSIX shared-memory
// segment), read from /proc/self/maps.
bool in_a_shared_segment(const void* address) {
  const auto at = reinterpret_cast<std::uintptr_t>(address);
  std::ifstream maps("/proc/self/maps");
  for (std::string line; std::getline(maps, line);) {
    std::uintptr_t begin = 0, end = 0;
    char dash = 0;
    std::istringstream fields(line);
    fields >> std::hex >> begin >> dash >> end;
    if (at >= begin && at < end) return line.find("/dev/shm/") != std::string::npos;
  }
  return false;
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
              // Above the inline slots' 64 KiB, with a count no world divides.
              const std::size_t count = 40009;
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

// What the ranks' single-copy reductions did over a run: how many reductions there were,
// how many deferred to free ranks, the bytes the deferring ones reduced, and all bytes.
struct ReductionShares {
  int reductions = 0;
  int deferred = 0;
  std::uint64_t deferred_bytes = 0;
  std::uint64_t bytes = 0;
};

ReductionShares reduction_shares(int world, const braid::testing::RankBody& body) {
  const braid::testing::ScopedEnv every_step("BRAID_TRACE_STEPS_KIB", "0");
  trace::clear();
  trace::set_enabled(true);
  run_ranks(world, body, shared_memory_only());
  trace::set_enabled(false);
  ReductionShares shares;
  for (const braid::testing::ReduceSpan& span : braid::testing::reduce_spans(trace::snapshot())) {
    ++shares.reductions;
    shares.bytes += span.bytes;
    if (span.deferred) {
      ++shares.deferred;
      shares.deferred_bytes += span.bytes;
    }
  }
  return shares;
}

constexpr std::size_t kSharedCount = 300007;  // f32: ~1.1 MiB, several pieces per block

// Rank `computing` (or every rank, with -1) says it computes, then all-reduces kSharedCount
// floats, out of place and in place, checked against the reference: in memory from
// allocate_shared, or in private memory (reached by cross-memory attach).
braid::testing::RankBody reduce_while_computing(int computing, bool shared = true) {
  return [computing, shared](std::shared_ptr<Communicator> comm) -> asio::awaitable<void> {
    // Not a co_await inside ?: (GCC 12 resumes such frames wrongly: docs/layers/core.md,
    // "Coroutine pitfalls under GCC 12").
    std::shared_ptr<std::byte[]> memory = std::make_shared<std::byte[]>(4 << 20);
    if (shared) memory = co_await comm->allocate_shared(4 << 20);
    comm->set_computing(computing < 0 || comm->rank() == computing);
    EXPECT_EQ(co_await reduce_and_check(*comm, DType::f32, ReduceOp::avg, kSharedCount,
                                        memory.get(), memory.get() + (2 << 20)),
              "");
    comm->set_computing(false);
  };
}

TEST(ComputingHint, ARankThatComputesLeavesItsShareOfTheReductionToTheFreeRanks) {
  for (const int world : {2, 3}) {
    const ReductionShares shares = reduction_shares(world, reduce_while_computing(1));
    // Two all-reduces, each reduced on every rank's runtime ...
    EXPECT_EQ(shares.reductions, 2 * world) << world << " ranks";
    // ... where rank 1 waited every time and reduced nothing ...
    EXPECT_EQ(shares.deferred, 2) << world << " ranks";
    EXPECT_EQ(shares.deferred_bytes, 0u) << world << " ranks";
    // ... and the free ranks reduced every byte of both, once.
    EXPECT_EQ(shares.bytes, 2 * kSharedCount * sizeof(float)) << world << " ranks";
  }
}

// The same through cross-memory attach (BRAID_SHM_SINGLE_COPY=1: private buffers are
// read and written in place, a system call per piece), which ranks as threads of one
// process always may.
TEST(ComputingHint, ThroughCrossMemoryAttachTooTheFreeRanksReduceEveryByte) {
  const braid::testing::ScopedEnv single_copy("BRAID_SHM_SINGLE_COPY", "1");
  const ReductionShares shares = reduction_shares(2, reduce_while_computing(1, /*shared=*/false));
  EXPECT_EQ(shares.reductions, 4);
  EXPECT_EQ(shares.deferred, 2);
  EXPECT_EQ(shares.deferred_bytes, 0u);
  EXPECT_EQ(shares.bytes, 2 * kSharedCount * sizeof(float));
}

TEST(ComputingHint, WhenEveryRankComputesNoneDefersAndEveryByteIsReducedOnce) {
  const ReductionShares shares = reduction_shares(3, reduce_while_computing(-1));
  EXPECT_EQ(shares.reductions, 6);
  EXPECT_EQ(shares.deferred, 0);
  EXPECT_EQ(shares.bytes, 2 * kSharedCount * sizeof(float));
}

// Hints that flip while reductions run never leave a piece unreduced or every rank
// waiting for another: each all-reduce completes, right, within the deadline.
TEST(ComputingHint, HintsFlippingUnderRunningReductionsNeitherHangNorChangeTheSums) {
  run_ranks(
      3,
      [](std::shared_ptr<Communicator> comm) -> asio::awaitable<void> {
        std::shared_ptr<std::byte[]> memory = co_await comm->allocate_shared(4 << 20);
        std::atomic<bool> done{false};
        std::thread flipper([&, rank = comm->rank()] {
          for (unsigned i = 0; !done.load(); ++i) {
            comm->set_computing(((i >> rank) & 1) != 0);
            std::this_thread::sleep_for(std::chrono::microseconds(20 + 30 * rank));
          }
        });
        // Stops and joins the flipper however the rounds end (a timeout throws).
        struct Stop {
          std::atomic<bool>& done;
          std::thread& flipper;
          ~Stop() {
            done = true;
            flipper.join();
          }
        } stop{done, flipper};
        std::string wrong;
        for (int round = 0; round < 20 && wrong.empty(); ++round) {
          wrong = co_await reduce_and_check(*comm, DType::f32, ReduceOp::sum, kSharedCount,
                                            memory.get(), memory.get() + (2 << 20));
        }
        EXPECT_EQ(wrong, "");
      },
      shared_memory_only());
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

// Lowers this process's file-size limit, which tmpfs enforces on a segment's reservation
// as a full /dev/shm would be (EFBIG instead of ENOSPC), for as long as it lives; SIGXFSZ
// is ignored meanwhile, so the reservation fails with the error instead of the signal.
class SmallFileLimit {
 public:
  SmallFileLimit() : handler_(std::signal(SIGXFSZ, SIG_IGN)) { getrlimit(RLIMIT_FSIZE, &saved_); }
  ~SmallFileLimit() {
    lift();
    std::signal(SIGXFSZ, handler_);
  }
  // Threads-as-ranks share the limit: apply it when only the rank that makes the segment
  // is about to create a file.
  void apply() {
    const rlimit small{.rlim_cur = 64 << 10, .rlim_max = saved_.rlim_max};
    EXPECT_EQ(setrlimit(RLIMIT_FSIZE, &small), 0);
  }
  void lift() { setrlimit(RLIMIT_FSIZE, &saved_); }

 private:
  rlimit saved_{};
  void (*handler_)(int);
};

// A segment that cannot be reserved is an error rank 0 reports, not a SIGBUS at first
// touch: every rank gets private memory, which the collectives still use.
TEST(AllocateShared, ASegmentThatCannotBeReservedGivesEveryRankPrivateMemory) {
  SmallFileLimit limit;
  run_ranks(
      2,
      [&](std::shared_ptr<Communicator> comm) -> asio::awaitable<void> {
        std::shared_ptr<std::byte[]> shared = co_await comm->allocate_shared(1 << 20);
        EXPECT_TRUE(shared != nullptr && in_a_shared_segment(shared.get()));
        co_await comm->barrier();  // the arena is mapped: no rank creates a file but rank 0 below
        if (comm->rank() == 0) limit.apply();
        std::shared_ptr<std::byte[]> memory = co_await comm->allocate_shared(1 << 20);
        co_await comm->barrier();
        if (comm->rank() == 0) limit.lift();
        EXPECT_NE(memory, nullptr);
        if (memory == nullptr) co_return;
        EXPECT_FALSE(in_a_shared_segment(memory.get()));
        EXPECT_EQ(reinterpret_cast<std::uintptr_t>(memory.get()) % 4096, 0u);
        EXPECT_TRUE(all_zero(memory.get(), 1 << 20));
        EXPECT_EQ(co_await reduce_and_check(*comm, DType::f32, ReduceOp::sum, 50000, memory.get(),
                                            memory.get() + (512 << 10)),
                  "");
      },
      shared_memory_only());
}

// The segment shared-memory collectives work in (made at a communicator's first one), when
// rank 0 cannot make it: every rank's collective fails at once with rank 0's reason,
// instead of the others waiting out their deadline for its name. The next one tries again,
// on every rank alike: it fails the same way while the cause lasts, and works once it is
// gone.
TEST(SharedMemoryArena, ASegmentRankZeroCannotMakeFailsEveryRankAtOnceAndIsTriedAgain) {
  SmallFileLimit limit;
  std::atomic<int> failures{0};
  std::chrono::steady_clock::duration failing{};
  Communicator::Options options = shared_memory_only();
  options.selection = std::make_shared<const SelectionTable>(
      SelectionTable::with_overrides("allreduce:0-inf:shared_memory;barrier:0-inf:dissemination"));
  run_ranks(
      3,
      [&](std::shared_ptr<Communicator> comm) -> asio::awaitable<void> {
        // Barriers by message: every rank is set up (UCX made its own segments) before rank 0
        // lowers the limit, and none starts before it has.
        co_await comm->barrier();
        if (comm->rank() == 0) limit.apply();
        co_await comm->barrier();
        const auto started = std::chrono::steady_clock::now();
        std::vector<float> data(1000, 1.0f);
        for (int attempt = 0; attempt < 2; ++attempt) {
          try {
            co_await comm->all_reduce(Buffer(data), ReduceOp::sum);
            ADD_FAILURE() << "rank " << comm->rank() << " reduced without the segment";
          } catch (const Error& error) {
            const std::string what = error.what();
            if (comm->rank() == 0) {
              EXPECT_THAT(what, HasSubstr("cannot reserve shared-memory segment"));
            } else {
              EXPECT_THAT(what,
                          HasSubstr("rank 0 could not make the node's shared-memory segment"));
              EXPECT_THAT(what, HasSubstr("(peer rank 0"));
            }
            EXPECT_EQ(error.code(), std::error_code(EFBIG, std::generic_category())) << what;
            failures.fetch_add(1);
          }
        }
        co_await comm->barrier();
        if (comm->rank() == 0) {
          failing = std::chrono::steady_clock::now() - started;
          limit.lift();
        }
        co_await comm->barrier();
        co_await comm->all_reduce(Buffer(data), ReduceOp::sum);
        EXPECT_EQ(data[0], 3.0f);
      },
      options);
  EXPECT_EQ(failures.load(), 6);
  EXPECT_LT(failing, std::chrono::seconds(10)) << "a rank waited out its 20 s deadline";
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
