// braid::torch::FullyShardedDataParallel, ranks as threads: under FULL_SHARD, SHARD_GRAD_OP
// and NO_SHARD, on 2 and 3 ranks (3 makes the padding real), with SGD and Adam, training
// ends with the parameters braid's DDP ends with from the same start and data; between
// steps no unit stays gathered (the sharded strategies), and each rank holds 1/P of each
// unit; misuse is refused naming the unit.
#include <string>
#include <tuple>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <braid/torch/distributed_data_parallel.hpp>
#include <braid/torch/fully_sharded_data_parallel.hpp>

#include "../support/expect_error.hpp"
#include "tp_support.hpp"

namespace fully_sharded_data_parallel_test {
namespace {

using braid::collectives::Communicator;
using braid::testing::expect_close;
using braid::testing::run_tp_ranks;
using braid::testing::seeded;
using braid::torch::ShardingStrategy;
using ::torch::Tensor;

// Three blocks (the units) and a head the root unit keeps: 5 -> 7 -> 7 -> 6 -> 2.
struct NetImpl : ::torch::nn::Module {
  NetImpl() {
    blocks.push_back(register_module("b0", ::torch::nn::Linear(5, 7)));
    blocks.push_back(register_module("b1", ::torch::nn::Linear(7, 7)));
    blocks.push_back(register_module("b2", ::torch::nn::Linear(7, 6)));
    head = register_module("head", ::torch::nn::Linear(6, 2));
    ::torch::NoGradGuard no_grad;
    int seed = 1;
    for (auto& p : parameters()) p.copy_(seeded(p.sizes().vec(), seed++) * 0.4);
  }
  // Through `fsdp` when given, else plainly.
  Tensor forward(Tensor x, braid::torch::FullyShardedDataParallel* fsdp = nullptr) {
    for (auto& block : blocks) {
      x = fsdp ? fsdp->run(*block, [&] { return ::torch::tanh(block->forward(x)); })
               : ::torch::tanh(block->forward(x));
    }
    return head->forward(x);
  }
  std::vector<::torch::nn::Linear> blocks;
  ::torch::nn::Linear head{nullptr};
};
TORCH_MODULE(Net);

std::unique_ptr<::torch::optim::Optimizer> optimizer(bool adam, std::vector<Tensor> p) {
  if (adam) return std::make_unique<::torch::optim::Adam>(p, ::torch::optim::AdamOptions(1e-2));
  return std::make_unique<::torch::optim::SGD>(p, ::torch::optim::SGDOptions(0.1).momentum(0.9));
}

class Strategies : public ::testing::TestWithParam<std::tuple<ShardingStrategy, int, bool>> {};

TEST_P(Strategies, EndWithTheParametersOfDataParallel) {
  const auto [strategy, ranks, adam] = GetParam();
  run_tp_ranks(ranks, [&](int rank, std::shared_ptr<Communicator> comm) {
    Net reference, sharded;
    braid::torch::DistributedDataParallel ddp(reference, comm);
    auto reference_optimizer = optimizer(adam, reference->parameters());
    braid::torch::FullyShardedDataParallel fsdp(comm, {.strategy = strategy});
    for (auto& block : sharded->blocks) fsdp.shard(*block);
    fsdp.shard(*sharded);
    auto sharded_optimizer = optimizer(adam, fsdp.parameters());
    for (int step = 0; step < 4; ++step) {
      const Tensor x = seeded({3, 5}, 100 * step + rank);
      const Tensor y = seeded({3, 2}, 100 * step + rank + 50);
      reference_optimizer->zero_grad();
      ::torch::mse_loss(ddp.forward(x), y).backward();
      reference_optimizer->step();
      sharded_optimizer->zero_grad();
      const Tensor out = fsdp.run(*sharded, [&] { return sharded->forward(x, &fsdp); });
      ::torch::mse_loss(out, y).backward();
      sharded_optimizer->step();
      if (strategy != ShardingStrategy::no_shard) {
        EXPECT_EQ(fsdp.gathered_bytes(), 0) << "a unit stayed gathered after step " << step;
      }
    }
    // The whole parameters, gathered once more through a forward without grad.
    {
      ::torch::NoGradGuard no_grad;
      const Tensor x = seeded({3, 5}, 999);
      const Tensor expected = reference->forward(x);
      const Tensor got = fsdp.run(*sharded, [&] { return sharded->forward(x, &fsdp); });
      expect_close(got, expected, fmt::format("rank {} output after training", rank), 1e-5);
    }
    const auto sizes = fsdp.unit_sizes();
    ASSERT_EQ(sizes.size(), 4u);
    for (std::size_t u = 0; u < sizes.size(); ++u) {
      const std::int64_t per_rank = (sizes[u] + ranks - 1) / ranks;
      EXPECT_EQ(fsdp.shard_size(u),
                strategy == ShardingStrategy::no_shard ? per_rank * ranks : per_rank);
    }
  });
}

std::string case_name(const ::testing::TestParamInfo<Strategies::ParamType>& info) {
  static const std::vector<std::string> names{"full_shard", "shard_grad_op", "no_shard"};
  return fmt::format("{}_ranks{}_{}", names[static_cast<std::size_t>(std::get<0>(info.param))],
                     std::get<1>(info.param), std::get<2>(info.param) ? "adam" : "sgd");
}

INSTANTIATE_TEST_SUITE_P(All, Strategies,
                         ::testing::Combine(::testing::Values(ShardingStrategy::full_shard,
                                                              ShardingStrategy::shard_grad_op,
                                                              ShardingStrategy::no_shard),
                                            ::testing::Values(2, 3), ::testing::Bool()),
                         case_name);

TEST(FullyShardedDataParallel, RefusesMisuseNamingTheUnit) {
  run_tp_ranks(2, [&](int, std::shared_ptr<Communicator> comm) {
    Net net;
    braid::torch::FullyShardedDataParallel fsdp(comm);
    fsdp.shard(*net->blocks[0]);
    braid::testing::expect_invalid_argument([&] { fsdp.shard(*net->blocks[0]); },
                                            "has no parameters that an earlier unit did not take");
    braid::testing::expect_invalid_argument(
        [&] { fsdp.run(*net->blocks[1], [&] { return Tensor(); }); }, "which is not a unit");
  });
}

}  // namespace
}  // namespace fully_sharded_data_parallel_test
