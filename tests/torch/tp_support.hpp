// What the tensor-parallel tests share: ranks as threads running blocking bodies, tensors
// drawn from their own seeded generators (libtorch's default one is per process, and the
// ranks are threads of one process), and closeness checks that say which tensor differs.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <braid/collectives/communicator.hpp>

#include "../support/rank_threads.hpp"

namespace braid::testing {

// Runs `body` on `size` thread ranks with one intra-op thread each, on pretend nodes where
// `node_of_rank` says; every rank must pass.
inline void run_tp_ranks(int size, const BlockingRankBody& body,
                         std::vector<int> node_of_rank = {}) {
  const std::vector<std::string> errors = run_blocking_ranks(
      size,
      [&](int rank, std::shared_ptr<collectives::Communicator> comm) {
        ::torch::set_num_threads(1);
        body(rank, std::move(comm));
      },
      std::move(node_of_rank));
  for (std::size_t r = 0; r < errors.size(); ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
}

// The same tensor on every rank that draws it with the same seed.
inline ::torch::Tensor seeded(std::vector<std::int64_t> shape, std::uint64_t seed) {
  at::Generator generator = at::detail::createCPUGenerator(seed);
  return ::torch::empty(shape).normal_(0, 1, generator);
}

// Rank `rank`'s slice of `tensor` along `dim`, for `ranks` ranks.
inline ::torch::Tensor slice_of(const ::torch::Tensor& tensor, std::int64_t dim, int rank,
                                int ranks) {
  const std::int64_t width = tensor.size(dim) / ranks;
  return tensor.narrow(dim, width * rank, width);
}

inline void expect_close(const ::torch::Tensor& actual, const ::torch::Tensor& expected,
                         const std::string& what, double tolerance = 1e-5) {
  ASSERT_TRUE(actual.defined()) << what << " is undefined";
  ASSERT_EQ(actual.sizes(), expected.sizes()) << what;
  EXPECT_TRUE(::torch::allclose(actual, expected, tolerance, tolerance))
      << what << ": largest difference " << (actual - expected).abs().max().item<double>();
}

}  // namespace braid::testing
