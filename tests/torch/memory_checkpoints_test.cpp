// MemoryCheckpoints: a state copied into memfds a launcher holds comes back, exactly, to
// the next process given them; a copy its process was still writing when it died, or one
// damaged since, is refused by name and the step before is used; the ranks resume from the
// newest step all of them hold, in memory or on disk, memory first, and copies of later
// steps are then forgotten; malformed fds are named.
#include <cstdlib>
#include <string>
#include <sys/mman.h>
#include <unistd.h>
#include <utility>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <braid/core/error.hpp>
#include <braid/torch/checkpoint/memory_checkpoints.hpp>
#include <braid/torch/checkpoint/restore_newest.hpp>

#include "../support/expect_error.hpp"
#include "../support/rank_threads.hpp"
#include "checkpoint_test_helpers.hpp"

namespace braid::torch {
namespace {

using braid::testing::expect_all_passed;
using braid::testing::run_blocking_ranks;

// Two memfds per rank (four with a partner's copies), held here as braid-run holds them
// across a rank's starts.
class LauncherSlots {
 public:
  explicit LauncherSlots(int ranks, int per_rank = 2) {
    for (int r = 0; r < ranks; ++r) {
      auto& fds = fds_.emplace_back(static_cast<std::size_t>(per_rank));
      for (int& fd : fds) fd = ::memfd_create("test-slot", MFD_CLOEXEC);
    }
  }
  ~LauncherSlots() {
    for (const auto& pair : fds_) {
      for (int fd : pair) ::close(fd);
    }
  }
  MemoryCheckpointOptions of(int rank) const {
    return {.slot_fds = fds_[static_cast<std::size_t>(rank)]};
  }
  // The checkpoint's length in rank r's slot k (the header's field 32 bytes in).
  std::uint64_t length(int rank, int slot) const {
    std::uint64_t bytes = 0;
    EXPECT_EQ(::pread(fds_[static_cast<std::size_t>(rank)][static_cast<std::size_t>(slot)], &bytes,
                      8, 32),
              8);
    return bytes;
  }
  // Writes `bytes` at `offset` of rank r's slot k, as a process dying or memory going bad
  // would leave it.
  void scribble(int rank, int slot, off_t offset, const std::string& bytes) const {
    ASSERT_EQ(::pwrite(fds_[static_cast<std::size_t>(rank)][static_cast<std::size_t>(slot)],
                       bytes.data(), bytes.size(), offset),
              static_cast<ssize_t>(bytes.size()));
  }

 private:
  std::vector<std::vector<int>> fds_;
};

TEST(MemoryCheckpoints, AStateComesBackToTheNextProcessGivenTheSlots) {
  LauncherSlots slots(2);
  expect_all_passed(run_blocking_ranks(2, [&](int rank, auto comm) {
    {
      MemoryCheckpoints memory(comm, slots.of(rank));
      EXPECT_TRUE(memory.outlives_the_process());
      EXPECT_FALSE(memory.restore().has_value()) << "empty slots are a fresh start";
      for (std::int64_t step : {1, 2, 3}) memory.save_async(state_of(rank, step));
      memory.wait();
      EXPECT_GT(memory.bytes(), 0U);
    }
    MemoryCheckpoints again(comm, slots.of(rank));  // the restarted process
    const auto held = again.readable();
    ASSERT_EQ(held.size(), 2U) << "two slots: the newest two steps";
    EXPECT_EQ(held.begin()->first, 3);
    auto state = again.restore();
    ASSERT_TRUE(state.has_value());
    expect_state(*state, rank, 3);
  }));
}

// The copy reads the tensors in the background: what it holds is the state when
// save_async was called, as long as the update waits for wait().
TEST(MemoryCheckpoints, ACopyHoldsTheStateAsItWasWhenTheUpdateWaitsForIt) {
  LauncherSlots slots(1);
  expect_all_passed(run_blocking_ranks(1, [&](int rank, auto comm) {
    MemoryCheckpoints memory(comm, slots.of(rank));
    TrainingState state = state_of(rank, 5);
    memory.save_async(state);
    memory.wait();
    state.tensors["weight"].add_(100);  // the next step's update
    auto back = memory.restore();
    ASSERT_TRUE(back.has_value());
    expect_state(*back, rank, 5);
  }));
}

// Rank 1's process died while copying step 2 (its slot still says "being written"), or
// its copy of step 2 was damaged since: both ranks resume from step 1, which rank 1's
// other slot still holds.
TEST(MemoryCheckpoints, ACopyCutOffOrDamagedIsRefusedAndTheStepBeforeIsUsed) {
  for (const bool cut_off : {true, false}) {
    SCOPED_TRACE(cut_off ? "cut off" : "damaged");
    LauncherSlots slots(2);
    expect_all_passed(run_blocking_ranks(2, [&](int rank, auto comm) {
      {
        MemoryCheckpoints memory(comm, slots.of(rank));
        memory.save_async(state_of(rank, 1));  // slot 0
        memory.save_async(state_of(rank, 2));  // slot 1
        memory.wait();
      }
      if (rank == 1) {
        // The header's condition word (8 bytes in) back to 1, "being written"; or a
        // byte of the last blob's text flipped (before the checkpoint's 8 closing bytes),
        // which only the slot's sum can tell.
        if (cut_off) {
          slots.scribble(1, 1, 8, std::string("\x01\x00\x00\x00", 4));
        } else {
          slots.scribble(1, 1, static_cast<off_t>(64 + slots.length(1, 1) - 8 - 3), "#");
        }
      }
      comm->launch(comm->barrier()).get();
      MemoryCheckpoints again(comm, slots.of(rank));
      auto state = again.restore();
      ASSERT_TRUE(state.has_value());
      expect_state(*state, rank, 1);
    }));
  }
}

// Rank 0 got a step further than rank 1 before the failure: both resume from step 2, and
// rank 0's copy of step 3 (the abandoned timeline's) is forgotten.
TEST(MemoryCheckpoints, TheRanksResumeFromTheNewestCommonStepAndForgetLaterOnes) {
  LauncherSlots slots(2);
  expect_all_passed(run_blocking_ranks(2, [&](int rank, auto comm) {
    {
      MemoryCheckpoints memory(comm, slots.of(rank));
      memory.save_async(state_of(rank, 1));
      memory.save_async(state_of(rank, 2));
      if (rank == 0) memory.save_async(state_of(rank, 3));
      memory.wait();
    }
    MemoryCheckpoints again(comm, slots.of(rank));
    auto state = again.restore();
    ASSERT_TRUE(state.has_value());
    expect_state(*state, rank, 2);
    EXPECT_EQ(again.readable().begin()->first, 2) << "step 3 is another timeline's";
  }));
}

// Memory and disk together: the newest step every rank holds in memory or every rank holds
// on disk, from memory where both hold it.
TEST(MemoryCheckpoints, RestoreNewestTakesTheNewestStepAcrossMemoryAndDisk) {
  ScratchDirectory dir;
  LauncherSlots slots(2);
  expect_all_passed(run_blocking_ranks(2, [&](int rank, auto comm) {
    DiskCheckpoints disk(dir.path(), comm);
    MemoryCheckpoints memory(comm, slots.of(rank));
    disk.save_async(state_of(rank, 10));
    memory.save_async(state_of(rank, 10));
    memory.save_async(state_of(rank, 12));
    disk.wait();
    memory.wait();
    auto restored = restore_newest(*comm, &memory, &disk);
    ASSERT_TRUE(restored.has_value());
    expect_state(restored->state, rank, 12);
    EXPECT_EQ(restored->source, "memory");

    // Rank 1's copies gone (its node lost, say): step 10 on every rank, from disk on every
    // rank (one source for all); rank 0's copy of step 12 is then another timeline's.
    comm->launch(comm->barrier()).get();
    LauncherSlots fresh(1);
    MemoryCheckpoints lost(comm, fresh.of(0));
    auto from_disk = restore_newest(*comm, rank == 1 ? &lost : &memory, &disk);
    ASSERT_TRUE(from_disk.has_value());
    expect_state(from_disk->state, rank, 10);
    EXPECT_EQ(from_disk->source, dir.path().string());
    if (rank == 0) {
      EXPECT_EQ(memory.readable().begin()->first, 10);
    }
  }));
}

// Across nodes each rank also keeps its partner's copies (partner_distance 1: rank 0 and
// rank 1 each other's). Rank 1's node lost whole, its slots fresh and empty: both ranks
// resume from memory all the same, rank 1 from the copy rank 0 held for it, exactly.
TEST(MemoryCheckpoints, ARankWhoseSlotsAreLostGetsItsCopyBackFromItsPartner) {
  LauncherSlots slots(2, 4);
  expect_all_passed(run_blocking_ranks(2, [&](int rank, auto comm) {
    {
      MemoryCheckpointOptions options = slots.of(rank);
      options.partner_distance = 1;
      MemoryCheckpoints memory(comm, options);
      EXPECT_EQ(memory.partner(), 1 - rank);
      EXPECT_EQ(memory.holds_for(), 1 - rank);
      for (std::int64_t step : {1, 2, 3}) memory.save_async(state_of(rank, step));
      memory.wait();
      EXPECT_EQ(memory.partner_steps(), (std::vector<std::int64_t>{3, 2}));
    }
    comm->launch(comm->barrier()).get();
    LauncherSlots replaced(1, 4);
    MemoryCheckpointOptions options = rank == 1 ? replaced.of(0) : slots.of(0);
    options.partner_distance = 1;
    MemoryCheckpoints again(comm, options);
    auto restored = restore_newest(*comm, &again, nullptr);
    ASSERT_TRUE(restored.has_value());
    expect_state(restored->state, rank, 3);
    EXPECT_EQ(restored->source, "memory");
  }));
}

// A partner needs four slots: one given two is an error naming both counts.
TEST(MemoryCheckpoints, APartnerWithoutFourSlotsIsRefused) {
  LauncherSlots slots(2);
  expect_all_passed(run_blocking_ranks(2, [&](int rank, auto comm) {
    MemoryCheckpointOptions options = slots.of(rank);
    options.partner_distance = 1;
    try {
      MemoryCheckpoints memory(comm, options);
      ADD_FAILURE() << "a partner with two slots was taken";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("a partner (distance 1) needs four slot fds, not 2"),
                std::string::npos)
          << e.what();
    }
  }));
}

// A tensor every rank holds alike is split among them: each copies its share, and the
// restore gathers it whole; a tensor of 7 elements over 3 ranks leaves the last a share of 1,
// one of 1 element leaves two ranks none. The copy of each rank is a third of the whole.
TEST(MemoryCheckpoints, ReplicatedTensorsAreSplitAmongTheRanksAndGatheredWhole) {
  LauncherSlots slots(3);
  expect_all_passed(run_blocking_ranks(3, [&](int rank, auto comm) {
    auto shared_state = [&](std::int64_t step) {
      TrainingState state = state_of(rank, step);  // "weight" and "count" differ by rank
      state.tensors["model"] = ::torch::arange(3000, ::torch::kFloat32).reshape({30, 100}) + step;
      state.tensors["seven"] = ::torch::arange(7, ::torch::kInt64) * step;
      state.tensors["one"] = ::torch::full({1}, 0.5 * static_cast<double>(step), ::torch::kFloat64);
      state.replicated = {"model", "seven", "one"};
      return state;
    };
    {
      MemoryCheckpoints memory(comm, slots.of(rank));
      memory.save_async(shared_state(4));
      memory.wait();
      EXPECT_LT(memory.bytes(), 3000U * 4 / 2) << "a third of the model's 12000 bytes, and headers";
    }
    MemoryCheckpoints again(comm, slots.of(rank));
    auto state = again.restore();
    ASSERT_TRUE(state.has_value());
    const TrainingState want = shared_state(4);
    EXPECT_TRUE(state->replicated.empty());
    for (const auto& [name, tensor] : want.tensors) {
      ASSERT_TRUE(state->tensors.contains(name)) << name;
      EXPECT_TRUE(::torch::equal(state->tensors.at(name), tensor)) << name;
    }
    EXPECT_EQ(state->blobs, want.blobs) << "no share's shape left behind";
  }));
}

TEST(MemoryCheckpoints, FdsThatAreNotOpenAreNamed) {
  expect_all_passed(run_blocking_ranks(1, [&](int, auto comm) {
    try {
      MemoryCheckpoints memory(comm, {.slot_fds = {9999, 9998}});
      ADD_FAILURE() << "closed fds were taken";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), Errc::invalid_environment);
      EXPECT_NE(std::string(e.what()).find("fd 9999"), std::string::npos) << e.what();
    }
    ::setenv("BRAID_SNAPSHOT_FDS", "7", 1);
    try {
      MemoryCheckpoints memory(comm);
      ADD_FAILURE() << "BRAID_SNAPSHOT_FDS=7 was taken";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("BRAID_SNAPSHOT_FDS='7'"), std::string::npos)
          << e.what();
    }
    ::unsetenv("BRAID_SNAPSHOT_FDS");
    MemoryCheckpoints own(comm);  // neither: memfds of its own
    EXPECT_FALSE(own.outlives_the_process());
  }));
}

}  // namespace
}  // namespace braid::torch
