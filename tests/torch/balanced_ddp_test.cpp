// DistributedDataParallel with the shares a dp::BatchBalancer gives (uneven batch sizes,
// the reducer weighting each rank's gradient by its share): the gradients every rank holds
// after backward are exactly those one process computes for the mean loss over the whole
// global batch. And in a dp::CadenceBalancer's windows (each rank accumulating its own number
// of micro-batches under no_sync(), then synchronising once): every rank ends with the
// parameters one process reaches stepping on each window's samples together.
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <braid/dp/batch_balancer.hpp>
#include <braid/dp/cadence_balancer.hpp>
#include <braid/torch/data_parallel/distributed_data_parallel.hpp>

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

TEST(CadenceDataParallel, EveryRankEndsWithTheParametersOfOneProcessOnEachWindow) {
  constexpr std::int64_t kMicroBatch = 5;
  constexpr int kWindows = 12;
  // Rank 1 computes a micro-batch in twice rank 0's time: after calibration rank 0 computes
  // two micro-batches per window to rank 1's one.
  braid::dp::CadenceOptions options;
  options.measure.calibration_steps = 2;
  options.measure.interval = 2;
  auto seconds_per_micro_batch = [](int rank) { return rank == 1 ? 2e-3 : 1e-3; };
  // Every window's counts, as rank 0 saw them, for the one-process twin.
  std::vector<std::vector<int>> window_counts(kWindows);
  std::vector<Tensor> final_weights(2);
  run_tp_ranks(2, [&](int rank, std::shared_ptr<Communicator> comm) {
    auto layer = model();
    braid::torch::DistributedDataParallel ddp(layer, comm);
    ::torch::optim::SGD optimizer(layer->parameters(), ::torch::optim::SGDOptions(0.1));
    braid::dp::CadenceBalancer cadence(comm, kMicroBatch, options);
    for (int w = 0; w < kWindows; ++w) {
      const auto& counts = cadence.counts();
      if (rank == 0) window_counts[static_cast<std::size_t>(w)] = counts;
      // The window's samples, rank 0's micro-batches first.
      const Tensor x = seeded({cadence.window_samples(), 4}, 100 + w);
      const Tensor y = seeded({cadence.window_samples(), 1}, 200 + w);
      const int mine = cadence.micro_batches();
      std::int64_t first = rank == 0 ? 0 : counts[0] * kMicroBatch;
      ddp.reducer().set_batch_share(cadence.share());
      optimizer.zero_grad();
      for (int i = 0; i < mine; ++i, first += kMicroBatch) {
        auto micro_batch_loss = [&] {
          return ::torch::mse_loss(ddp.forward(x.narrow(0, first, kMicroBatch)),
                                   y.narrow(0, first, kMicroBatch)) /
                 mine;
        };
        if (i + 1 < mine) {
          auto local = ddp.no_sync();
          micro_batch_loss().backward();
        } else {
          micro_batch_loss().backward();
        }
      }
      optimizer.step();
      // The window lasts as long as its slowest rank's compute and a cheap synchronisation.
      const double longest =
          std::max(counts[0] * seconds_per_micro_batch(0), counts[1] * seconds_per_micro_batch(1));
      cadence.record_window(mine * seconds_per_micro_batch(rank), longest + 1e-4);
    }
    EXPECT_EQ(cadence.counts(), (std::vector<int>{2, 1})) << "rank " << rank;
    final_weights[static_cast<std::size_t>(rank)] =
        ::torch::cat({layer->weight.detach().flatten(), layer->bias.detach()});
  });
  auto twin = model();
  ::torch::optim::SGD optimizer(twin->parameters(), ::torch::optim::SGDOptions(0.1));
  for (int w = 0; w < kWindows; ++w) {
    const auto& counts = window_counts[static_cast<std::size_t>(w)];
    const std::int64_t samples = kMicroBatch * (counts[0] + counts[1]);
    optimizer.zero_grad();
    ::torch::mse_loss(twin->forward(seeded({samples, 4}, 100 + w)), seeded({samples, 1}, 200 + w))
        .backward();
    optimizer.step();
  }
  const Tensor expected = ::torch::cat({twin->weight.detach().flatten(), twin->bias.detach()});
  expect_close(final_weights[0], expected, "rank 0's parameters", 1e-5);
  expect_close(final_weights[1], expected, "rank 1's parameters", 1e-5);
  EXPECT_TRUE(::torch::equal(final_weights[0], final_weights[1])) << "the ranks' parameters differ";
}

}  // namespace
}  // namespace balanced_ddp_test
