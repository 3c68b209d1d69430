// DistributedDataParallel with the shares a dp::BatchBalancer gives (uneven batch sizes,
// the reducer weighting each rank's gradient by its share): the gradients every rank holds
// after backward are exactly those one process computes for the mean loss over the whole
// global batch.
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <braid/dp/batch_balancer.hpp>
#include <braid/torch/distributed_data_parallel.hpp>

#include "tp_support.hpp"

namespace balanced_ddp_test {
namespace {

using braid::collectives::Communicator;
using braid::testing::expect_close;
using braid::testing::run_tp_ranks;
using braid::testing::seeded;
using ::torch::Tensor;

::torch::nn::Linear model() {
  ::torch::nn::Linear layer(4, 1);
  ::torch::NoGradGuard no_grad;
  layer->weight.copy_(seeded({1, 4}, 1));
  layer->bias.copy_(seeded({1}, 2));
  return layer;
}

TEST(BalancedDataParallel, GradientsAreThoseOfTheWholeGlobalBatch) {
  constexpr std::int64_t kGlobal = 30;
  const Tensor x = seeded({kGlobal, 4}, 3);
  const Tensor y = seeded({kGlobal, 1}, 4);
  auto whole = model();
  ::torch::mse_loss(whole->forward(x), y).backward();
  // A 2:1 speed ratio's sizes: 20 and 10 samples.
  const auto sizes = braid::dp::BatchBalancer::sizes_for({2, 1}, kGlobal, 0.1);
  run_tp_ranks(2, [&](int rank, std::shared_ptr<Communicator> comm) {
    auto layer = model();
    braid::torch::DistributedDataParallel ddp(layer, comm);
    const std::int64_t first = rank == 0 ? 0 : sizes[0];
    const std::int64_t count = sizes[static_cast<std::size_t>(rank)];
    ddp.reducer().set_batch_share(static_cast<double>(count) / kGlobal);
    // Each rank's loss is the mean over its own samples.
    ::torch::mse_loss(ddp.forward(x.narrow(0, first, count)), y.narrow(0, first, count)).backward();
    expect_close(layer->weight.grad(), whole->weight.grad(),
                 fmt::format("rank {} weight gradient", rank), 1e-6);
    expect_close(layer->bias.grad(), whole->bias.grad(), fmt::format("rank {} bias gradient", rank),
                 1e-6);
  });
}

}  // namespace
}  // namespace balanced_ddp_test
