// What the checkpoint tests share: a scratch directory per test, and rank r's state after
// a step, with values that say whose and which step they are.
#pragma once

#include <filesystem>
#include <string>
#include <unistd.h>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <braid/torch/checkpoint/disk_checkpoints.hpp>

namespace braid::torch {

namespace fs = std::filesystem;

// A directory of its own per test, removed after it.
class ScratchDirectory {
 public:
  ScratchDirectory()
      : path_(fs::temp_directory_path() /
              fmt::format("braid-checkpoints-{}-{}", ::getpid(),
                          ::testing::UnitTest::GetInstance()->current_test_info()->name())) {
    fs::remove_all(path_);
  }
  ~ScratchDirectory() { fs::remove_all(path_); }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

// Rank r's state after `step` steps: values that say whose and which step they are.
inline TrainingState state_of(int rank, std::int64_t step) {
  TrainingState state{.step = step};
  state.tensors["weight"] = ::torch::arange(12, ::torch::kFloat32).reshape({3, 4}) * rank + step;
  state.tensors["count"] = ::torch::full({2}, step * 10 + rank, ::torch::kInt64);
  state.blobs["data"] = fmt::format("rank {} at step {}", rank, step);
  return state;
}

inline void expect_state(const TrainingState& got, int rank, std::int64_t step) {
  const TrainingState want = state_of(rank, step);
  EXPECT_EQ(got.step, step);
  ASSERT_EQ(got.tensors.size(), want.tensors.size());
  for (const auto& [name, tensor] : want.tensors) {
    ASSERT_TRUE(got.tensors.contains(name)) << name;
    EXPECT_EQ(got.tensors.at(name).scalar_type(), tensor.scalar_type()) << name;
    EXPECT_TRUE(::torch::equal(got.tensors.at(name), tensor)) << name;
  }
  EXPECT_EQ(got.blobs, want.blobs);
}

}  // namespace braid::torch
