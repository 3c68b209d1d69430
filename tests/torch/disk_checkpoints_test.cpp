// DiskCheckpoints: a training state comes back exactly as it was saved; the ranks resume
// from the newest step every one of them holds whole, passing over a step one rank lacks or
// holds torn or damaged (and naming that file); an empty directory is a fresh start; an
// optimizer and the CPU generator go round through their bytes.
#include <filesystem>
#include <fstream>
#include <set>
#include <string>

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <braid/torch/checkpoint/disk_checkpoints.hpp>

#include "../support/expect_error.hpp"
#include "../support/rank_threads.hpp"
#include "checkpoint_test_helpers.hpp"

namespace braid::torch {
namespace {

namespace fs = std::filesystem;
using braid::testing::expect_all_passed;
using braid::testing::run_blocking_ranks;

TEST(DiskCheckpoints, AStateComesBackExactlyAsItWasSaved) {
  ScratchDirectory dir;
  expect_all_passed(run_blocking_ranks(2, [&](int rank, auto comm) {
    {
      DiskCheckpoints checkpoints(dir.path(), comm);
      EXPECT_FALSE(checkpoints.restore().has_value()) << "an empty directory is a fresh start";
      for (std::int64_t step : {5, 10, 15}) checkpoints.save_async(state_of(rank, step));
      checkpoints.wait();
      // Each rank keeps its newest two.
      EXPECT_FALSE(fs::exists(checkpoints.file_of(5)));
      EXPECT_TRUE(fs::exists(checkpoints.file_of(10)));
    }
    DiskCheckpoints again(dir.path(), comm);
    auto state = again.restore();
    ASSERT_TRUE(state.has_value());
    expect_state(*state, rank, 15);
  }));
}

// What the snapshot holds is the state when save_async was called, not after.
TEST(DiskCheckpoints, ASaveHoldsTheStateAsItWasWhenItWasCalled) {
  ScratchDirectory dir;
  expect_all_passed(run_blocking_ranks(1, [&](int rank, auto comm) {
    DiskCheckpoints checkpoints(dir.path(), comm);
    TrainingState state = state_of(rank, 3);
    checkpoints.save_async(state);
    state.tensors["weight"].add_(100);  // the next step's update
    checkpoints.wait();
    auto back = checkpoints.restore();
    ASSERT_TRUE(back.has_value());
    expect_state(*back, rank, 3);
  }));
}

// Rank 1 never wrote step 20 (it failed first): every rank resumes from step 10.
TEST(DiskCheckpoints, TheRanksResumeFromTheNewestStepEveryRankHolds) {
  ScratchDirectory dir;
  expect_all_passed(run_blocking_ranks(2, [&](int rank, auto comm) {
    {
      DiskCheckpoints checkpoints(dir.path(), comm);
      checkpoints.save_async(state_of(rank, 10));
      if (rank == 0) checkpoints.save_async(state_of(rank, 20));
      checkpoints.wait();
    }
    DiskCheckpoints again(dir.path(), comm);
    auto state = again.restore();
    ASSERT_TRUE(state.has_value());
    expect_state(*state, rank, 10);
  }));
}

// A file cut short or with a flipped byte is refused by name; the step before is used.
TEST(DiskCheckpoints, ATornOrDamagedFileIsRefusedAndTheStepBeforeIsUsed) {
  for (const bool truncate : {true, false}) {
    SCOPED_TRACE(truncate ? "truncated" : "a byte flipped");
    ScratchDirectory dir;
    expect_all_passed(run_blocking_ranks(2, [&](int rank, auto comm) {
      {
        DiskCheckpoints checkpoints(dir.path(), comm);
        checkpoints.save_async(state_of(rank, 10));
        checkpoints.save_async(state_of(rank, 20));
        checkpoints.wait();
        if (rank == 1) {
          const fs::path file = checkpoints.file_of(20);
          if (truncate) {
            fs::resize_file(file, fs::file_size(file) / 2);
          } else {
            std::fstream bytes(file, std::ios::in | std::ios::out | std::ios::binary);
            bytes.seekp(40);
            bytes.put('\x7f');
          }
        }
      }
      comm->launch(comm->barrier()).get();  // rank 1's damage done before anyone reads
      DiskCheckpoints again(dir.path(), comm);
      auto state = again.restore();
      ASSERT_TRUE(state.has_value());
      expect_state(*state, rank, 10);
    }));
  }
}

// A write cut off before its rename leaves only a partial file, which is not a checkpoint
// and goes at the next restore.
TEST(DiskCheckpoints, APartialWriteIsNotACheckpoint) {
  ScratchDirectory dir;
  expect_all_passed(run_blocking_ranks(1, [&](int rank, auto comm) {
    DiskCheckpoints checkpoints(dir.path(), comm);
    checkpoints.save_async(state_of(rank, 4));
    checkpoints.wait();
    const fs::path partial = checkpoints.file_of(8).string() + ".partial.12345";
    fs::create_directories(partial.parent_path());
    std::ofstream(partial) << "BRAIDCK1 and then the machine lost power";
    auto state = checkpoints.restore();
    ASSERT_TRUE(state.has_value());
    expect_state(*state, rank, 4);
    EXPECT_FALSE(fs::exists(partial)) << "a torn file is removed, not left to pile up";
  }));
}

// A tensor every rank holds alike is written once over the ranks: each rank's file holds
// its half, and a restore gathers it whole.
TEST(DiskCheckpoints, ReplicatedTensorsAreWrittenOnceOverTheRanks) {
  ScratchDirectory dir;
  expect_all_passed(run_blocking_ranks(2, [&](int rank, auto comm) {
    TrainingState state = state_of(rank, 6);
    state.tensors["model"] = ::torch::arange(3001, ::torch::kFloat32).reshape({3001, 1});
    state.replicated = {"model"};
    {
      DiskCheckpoints checkpoints(dir.path(), comm);
      checkpoints.save_async(state);
      checkpoints.wait();
      EXPECT_LT(fs::file_size(checkpoints.file_of(6)), 3001U * 4 / 2 + 1024)
          << "half of the model's 12004 bytes, and the rest of the state";
    }
    DiskCheckpoints again(dir.path(), comm);
    auto back = again.restore();
    ASSERT_TRUE(back.has_value());
    EXPECT_TRUE(::torch::equal(back->tensors.at("model"), state.tensors.at("model")));
    EXPECT_TRUE(::torch::equal(back->tensors.at("weight"), state.tensors.at("weight")));
    EXPECT_EQ(back->blobs, state.blobs);
    EXPECT_TRUE(back->replicated.empty());
  }));
}

// A job that shrinks (braid-run --nnodes MIN:MAX) or grows takes up the newest step a job
// of another size wrote, put together whole from every one of its files; a step of its own
// size that is older does not win over it.
TEST(DiskCheckpoints, AJobOfAnotherSizeResumesFromTheStepEveryFileOfTheOldSizeHolds) {
  ScratchDirectory dir;
  const at::Tensor model = ::torch::arange(3001, ::torch::kFloat32).reshape({3001, 1});
  auto replicated_state = [&](std::int64_t step) {
    TrainingState state{.step = step};
    state.tensors["model"] = model + static_cast<double>(step);
    state.blobs["data_ranks"] = "3";
    state.replicated = {"model"};
    return state;
  };
  expect_all_passed(run_blocking_ranks(1, [&](int, auto comm) {
    DiskCheckpoints alone(dir.path(), comm);
    alone.save_async(replicated_state(4));  // older, of the size that resumes
    alone.wait();
  }));
  expect_all_passed(run_blocking_ranks(3, [&](int, auto comm) {
    DiskCheckpoints checkpoints(dir.path(), comm);
    checkpoints.save_async(replicated_state(9));
    checkpoints.wait();
  }));
  for (int ranks : {1, 2}) {
    expect_all_passed(run_blocking_ranks(ranks, [&](int, auto comm) {
      DiskCheckpoints again(dir.path(), comm);
      auto back = again.restore();
      ASSERT_TRUE(back.has_value());
      EXPECT_EQ(back->step, 9);
      EXPECT_TRUE(::torch::equal(back->tensors.at("model"), model + 9.0));
      EXPECT_EQ(back->blobs, (std::map<std::string, std::string>{{"data_ranks", "3"}}));
    }));
  }
}

// A rank's own tensors (ZeRO's or FSDP's shards) have no owner in a job of another size:
// refused by name, not guessed at.
TEST(DiskCheckpoints, ShardsOfAJobOfAnotherSizeAreRefusedByName) {
  ScratchDirectory dir;
  expect_all_passed(run_blocking_ranks(2, [&](int rank, auto comm) {
    DiskCheckpoints checkpoints(dir.path(), comm);
    checkpoints.save_async(state_of(rank, 7));
    checkpoints.wait();
  }));
  expect_all_passed(run_blocking_ranks(1, [&](int, auto comm) {
    DiskCheckpoints again(dir.path(), comm);
    braid::testing::expect_invalid_argument([&] { again.restore(); },
                                            "holds rank 0's own 'count' (a shard)");
  }));
}

TEST(DiskCheckpoints, KeepingFewerThanTwoIsRefused) {
  ScratchDirectory dir;
  expect_all_passed(run_blocking_ranks(1, [&](int, auto comm) {
    EXPECT_THROW(DiskCheckpoints(dir.path(), comm, {.keep = 1}), Error);
  }));
}

// An optimizer and the generator, through a saved state: the next step and the next
// random numbers are the ones they would have been. Adam and SGD (with momentum) are kept
// as tensors; RMSprop, which save_optimizer keeps as its archive, goes round too.
template <class Optimizer, class Options>
void expect_round_trip(Options options) {
  ::torch::manual_seed(7);
  auto weight = ::torch::randn({4, 4}, ::torch::requires_grad());
  Optimizer optimizer({weight}, options);
  auto step = [](Optimizer& o, at::Tensor& w) {
    o.zero_grad();
    (w * w).sum().backward();
    o.step();
  };
  step(optimizer, weight);
  TrainingState saved;
  save_optimizer(optimizer, saved, "optimizer");
  // The state holds the optimizer's own tensors; save_async copies them, as this does.
  for (auto& [name, tensor] : saved.tensors) tensor = tensor.clone();
  saved.blobs["cpu_generator"] = cpu_generator_bytes();
  const at::Tensor weight_then = weight.detach().clone();
  step(optimizer, weight);
  const at::Tensor random_after = ::torch::rand({3});

  auto twin = weight_then.clone().requires_grad_(true);
  Optimizer twin_optimizer({twin}, options);
  load_optimizer(twin_optimizer, saved, "optimizer");
  load_cpu_generator_bytes(saved.blobs.at("cpu_generator"));
  step(twin_optimizer, twin);
  EXPECT_TRUE(::torch::equal(twin.detach(), weight.detach()));
  EXPECT_TRUE(::torch::equal(::torch::rand({3}), random_after));
}

TEST(DiskCheckpoints, AnOptimizerAndTheGeneratorGoRoundThroughASavedState) {
  {
    SCOPED_TRACE("Adam");
    expect_round_trip<::torch::optim::Adam>(::torch::optim::AdamOptions(0.01));
  }
  {
    SCOPED_TRACE("SGD with momentum");
    expect_round_trip<::torch::optim::SGD>(::torch::optim::SGDOptions(0.1).momentum(0.9));
  }
  {
    SCOPED_TRACE("RMSprop, as its archive");
    expect_round_trip<::torch::optim::RMSprop>(::torch::optim::RMSpropOptions(0.01));
  }
}

// Adam's moments are tensors of the state, named by group and place.
TEST(DiskCheckpoints, AdamsStateIsKeptAsTensors) {
  auto weight = ::torch::ones({2, 3}, ::torch::requires_grad());
  ::torch::optim::Adam adam({weight}, ::torch::optim::AdamOptions(0.5));
  weight.sum().backward();
  adam.step();
  TrainingState state;
  save_optimizer(adam, state, "opt");
  EXPECT_TRUE(state.tensors.contains("opt.0.0.exp_avg"));
  EXPECT_TRUE(state.tensors.contains("opt.0.0.exp_avg_sq"));
  EXPECT_EQ(state.tensors.at("opt.0.0.step").item<std::int64_t>(), 1);
  EXPECT_EQ(state.blobs.at("opt.0.lr"), fmt::format("{:a}", 0.5));
  EXPECT_FALSE(state.blobs.contains("opt"));
}

}  // namespace
}  // namespace braid::torch
