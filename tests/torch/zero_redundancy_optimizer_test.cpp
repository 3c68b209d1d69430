// braid::torch::ZeroRedundancyOptimizer, ranks as threads: on 2 and 3 ranks (3 makes the
// padding real), DDP with the sharded optimizer ends with the parameters DDP with the whole
// optimizer ends with, for SGD (momentum, weight decay) and Adam; each rank keeps the
// optimizer state of its slice alone; parameters without a gradient keep their values;
// ranks whose models differ fail together.
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <braid/torch/data_parallel/distributed_data_parallel.hpp>
#include <braid/torch/data_parallel/zero_redundancy_optimizer.hpp>

#include "../support/expect_error.hpp"
#include "tp_support.hpp"

namespace zero_redundancy_optimizer_test {
namespace {

using braid::collectives::Communicator;
using braid::testing::expect_close;
using braid::testing::run_tp_ranks;
using braid::testing::seeded;
using ::torch::Tensor;

// 5 -> 7 -> 2: 58 parameters, which 3 ranks split with 2 elements of padding.
::torch::nn::Sequential model() {
  ::torch::nn::Sequential net(::torch::nn::Linear(5, 7), ::torch::nn::Tanh(),
                              ::torch::nn::Linear(7, 2));
  ::torch::NoGradGuard no_grad;
  int seed = 1;
  for (auto& p : net->parameters()) p.copy_(seeded(p.sizes().vec(), seed++) * 0.3);
  return net;
}

using Factory = braid::torch::ZeroRedundancyOptimizer::OptimizerFactory;

struct Case {
  const char* name;
  Factory make;
};

Factory adam() {
  return [](std::vector<Tensor> p) {
    return std::make_unique<::torch::optim::Adam>(p, ::torch::optim::AdamOptions(1e-2));
  };
}
Factory sgd() {
  return [](std::vector<Tensor> p) {
    return std::make_unique<::torch::optim::SGD>(
        p, ::torch::optim::SGDOptions(0.1).momentum(0.9).weight_decay(1e-2));
  };
}

class ShardedOptimizer : public ::testing::TestWithParam<std::tuple<int, bool>> {};

TEST_P(ShardedOptimizer, EndsWithTheParametersOfTheWholeOptimizer) {
  const auto [ranks, use_adam] = GetParam();
  const Factory make = use_adam ? adam() : sgd();
  run_tp_ranks(ranks, [&](int rank, std::shared_ptr<Communicator> comm) {
    auto whole_model = model();
    auto sharded_model = model();
    braid::torch::DistributedDataParallel whole_ddp(whole_model, comm);
    braid::torch::DistributedDataParallel sharded_ddp(sharded_model, comm);
    auto whole = make(whole_model->parameters());
    braid::torch::ZeroRedundancyOptimizer sharded(sharded_model->parameters(), comm, make);
    for (int step = 0; step < 5; ++step) {
      const Tensor x = seeded({4, 5}, 100 * step + rank);
      const Tensor y = seeded({4, 2}, 100 * step + rank + 50);
      whole->zero_grad();
      ::torch::mse_loss(whole_ddp.forward(x), y).backward();
      whole->step();
      sharded.zero_grad();
      ::torch::mse_loss(sharded_ddp.forward(x), y).backward();
      sharded.step();
    }
    const auto a = whole_model->parameters();
    const auto b = sharded_model->parameters();
    for (std::size_t i = 0; i < a.size(); ++i) {
      expect_close(b[i], a[i], fmt::format("rank {} parameter {}", rank, i), 1e-6);
    }
    // The optimizer's state covers this rank's slice alone.
    EXPECT_EQ(sharded.slice_size(), (58 + ranks - 1) / ranks);
    for (const auto& state : sharded.optimizer().state()) {
      for (const auto& tensor : [&] {
             if (auto* s = dynamic_cast<::torch::optim::AdamParamState*>(state.second.get())) {
               return std::vector<Tensor>{s->exp_avg(), s->exp_avg_sq()};
             }
             auto* s = dynamic_cast<::torch::optim::SGDParamState*>(state.second.get());
             return std::vector<Tensor>{s->momentum_buffer()};
           }()) {
        EXPECT_EQ(tensor.numel(), sharded.slice_size());
      }
    }
    // Between steps the slice is empty and has no gradient: what stays is the state, as
    // the ZeRO formula counts; the inner optimizer's own zero_grad() is harmless.
    sharded.optimizer().zero_grad();
    for (const auto& group : sharded.optimizer().param_groups()) {
      for (const auto& slice : group.params()) {
        EXPECT_EQ(slice.numel(), 0);
        EXPECT_FALSE(slice.grad().defined());
      }
    }
  });
}

INSTANTIATE_TEST_SUITE_P(RanksAndOptimizers, ShardedOptimizer,
                         ::testing::Combine(::testing::Values(2, 3), ::testing::Bool()),
                         [](const auto& info) {
                           return fmt::format("ranks{}_{}", std::get<0>(info.param),
                                              std::get<1>(info.param) ? "adam" : "sgd");
                         });

TEST(ZeroRedundancyOptimizer, ParametersWithoutAGradientKeepTheirValues) {
  run_tp_ranks(2, [&](int, std::shared_ptr<Communicator> comm) {
    ::torch::nn::Linear used(4, 3), unused(3, 5);
    std::vector<Tensor> parameters = used->parameters();
    for (const auto& p : unused->parameters()) parameters.push_back(p);
    {
      ::torch::NoGradGuard no_grad;  // every rank starts from the same values
      int seed = 7;
      for (auto& p : parameters) p.copy_(seeded(p.sizes().vec(), seed++));
    }
    const Tensor before = unused->weight.detach().clone();
    braid::torch::ZeroRedundancyOptimizer optimizer(parameters, comm, adam());
    for (int step = 0; step < 3; ++step) {
      optimizer.zero_grad();
      used->forward(seeded({2, 4}, step)).sum().backward();
      optimizer.step();
    }
    expect_close(unused->weight, before, "the unused layer's weight");
  });
}

TEST(ZeroRedundancyOptimizer, RanksWhoseModelsDifferFailTogether) {
  run_tp_ranks(2, [&](int rank, std::shared_ptr<Communicator> comm) {
    ::torch::nn::Linear layer(3, rank == 0 ? 2 : 4);
    braid::testing::expect_invalid_argument(
        [&] { braid::torch::ZeroRedundancyOptimizer(layer->parameters(), comm, sgd()); },
        "the ranks' models differ");
  });
}

}  // namespace
}  // namespace zero_redundancy_optimizer_test
