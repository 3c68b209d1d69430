// braid::torch::SyncBatchNorm, ranks as threads: the statistics, outputs and gradients of
// one BatchNorm over the whole batch, split over ranks however unevenly; training under
// DDP that matches one process; evaluation that communicates nothing; clear errors.
#include <mutex>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <braid/core/error.hpp>
#include <braid/torch/data_parallel/distributed_data_parallel.hpp>
#include <braid/torch/data_parallel/sync_batch_norm.hpp>

#include "../support/expect_error.hpp"
#include "../support/rank_threads.hpp"

namespace sync_batch_norm_test {
namespace {

using braid::collectives::Communicator;
using braid::torch::SyncBatchNorm;
using braid::torch::SyncBatchNormOptions;

std::vector<std::string> run_ranks(int size, const braid::testing::BlockingRankBody& body) {
  return braid::testing::run_blocking_ranks(size,
                                            [&](int rank, std::shared_ptr<Communicator> comm) {
                                              ::torch::set_num_threads(1);
                                              body(rank, std::move(comm));
                                            });
}

using braid::testing::expect_all_passed;

// libtorch's generator is one per process: draws happen under one lock, before the ranks.
std::mutex rng_mutex;
::torch::Tensor draw(std::vector<std::int64_t> shape, int seed) {
  std::lock_guard lock(rng_mutex);
  ::torch::manual_seed(seed);
  return ::torch::randn(shape) * 3 + 5;  // a mean well away from 0
}

TEST(SyncBatchNorm, MatchesOneBatchNormOverTheWholeBatchSplitUnevenly) {
  constexpr int kChannels = 4;
  const std::vector<std::int64_t> rows{3, 5};
  std::vector<::torch::Tensor> inputs, weights;  // per rank: input and the loss's weights
  for (int r = 0; r < 2; ++r) {
    inputs.push_back(draw({rows[r], kChannels, 3}, 10 + r));
    weights.push_back(draw({rows[r], kChannels, 3}, 20 + r));
  }
  const ::torch::Tensor gamma = draw({kChannels}, 30);
  const ::torch::Tensor beta = draw({kChannels}, 31);

  // One process, the whole batch; the loss is the sum of the ranks' losses.
  ::torch::nn::BatchNorm1d reference(kChannels);
  {
    ::torch::NoGradGuard no_grad;
    reference->weight.copy_(gamma);
    reference->bias.copy_(beta);
  }
  const ::torch::Tensor whole = ::torch::cat(inputs).requires_grad_(true);
  const ::torch::Tensor expected = reference->forward(whole);
  (expected * ::torch::cat(weights)).sum().backward();

  std::vector<::torch::Tensor> outputs(2), input_grads(2), gamma_grads(2), beta_grads(2);
  std::vector<::torch::Tensor> running_means(2), running_vars(2);
  expect_all_passed(run_ranks(2, [&](int rank, std::shared_ptr<Communicator> comm) {
    const auto r = static_cast<std::size_t>(rank);
    SyncBatchNorm norm(comm, SyncBatchNormOptions(kChannels));
    {
      ::torch::NoGradGuard no_grad;
      norm->weight.copy_(gamma);
      norm->bias.copy_(beta);
    }
    const ::torch::Tensor x = inputs[r].clone().requires_grad_(true);
    const ::torch::Tensor y = norm->forward(x);
    (y * weights[r]).sum().backward();
    outputs[r] = y.detach();
    input_grads[r] = x.grad();
    gamma_grads[r] = norm->weight.grad();
    beta_grads[r] = norm->bias.grad();
    running_means[r] = norm->running_mean.clone();
    running_vars[r] = norm->running_var.clone();
  }));
  const ::torch::Tensor expected_grad = whole.grad();
  std::int64_t at = 0;
  for (std::size_t r = 0; r < 2; ++r) {
    EXPECT_TRUE(::torch::allclose(outputs[r], expected.detach().narrow(0, at, rows[r]), 1e-5, 1e-5))
        << "rank " << r << " output";
    EXPECT_TRUE(::torch::allclose(input_grads[r], expected_grad.narrow(0, at, rows[r]), 1e-4, 1e-5))
        << "rank " << r << " input gradient";
    EXPECT_TRUE(::torch::allclose(running_means[r], reference->running_mean, 1e-5, 1e-6));
    EXPECT_TRUE(::torch::allclose(running_vars[r], reference->running_var, 1e-5, 1e-6));
    at += rows[r];
  }
  // Each rank's affine gradients are its share: their sum is the whole batch's.
  EXPECT_TRUE(::torch::allclose(gamma_grads[0] + gamma_grads[1], reference->weight.grad(), 1e-4));
  EXPECT_TRUE(::torch::allclose(beta_grads[0] + beta_grads[1], reference->bias.grad(), 1e-4));
}

// Without affine parameters, on (N, C, H, W) images split over three ranks (one with a
// single image): the input gradient is still the whole batch's.
TEST(SyncBatchNorm, WithoutAffineParametersImagesOnThreeRanksMatchOneBatchNorm) {
  constexpr int kChannels = 3;
  const std::vector<std::int64_t> rows{2, 1, 4};
  std::vector<::torch::Tensor> inputs, weights;
  for (int r = 0; r < 3; ++r) {
    inputs.push_back(draw({rows[r], kChannels, 2, 3}, 40 + r));
    weights.push_back(draw({rows[r], kChannels, 2, 3}, 50 + r));
  }
  ::torch::nn::BatchNorm2d reference(::torch::nn::BatchNorm2dOptions(kChannels).affine(false));
  const ::torch::Tensor whole = ::torch::cat(inputs).requires_grad_(true);
  const ::torch::Tensor expected = reference->forward(whole);
  (expected * ::torch::cat(weights)).sum().backward();

  std::vector<::torch::Tensor> outputs(3), input_grads(3);
  expect_all_passed(run_ranks(3, [&](int rank, std::shared_ptr<Communicator> comm) {
    const auto r = static_cast<std::size_t>(rank);
    SyncBatchNormOptions options(kChannels);
    options.affine = false;
    SyncBatchNorm norm(comm, options);
    EXPECT_EQ(norm->parameters().size(), 0U);
    const ::torch::Tensor x = inputs[r].clone().requires_grad_(true);
    const ::torch::Tensor y = norm->forward(x);
    (y * weights[r]).sum().backward();
    outputs[r] = y.detach();
    input_grads[r] = x.grad();
  }));
  std::int64_t at = 0;
  for (std::size_t r = 0; r < 3; ++r) {
    EXPECT_TRUE(::torch::allclose(outputs[r], expected.detach().narrow(0, at, rows[r]), 1e-5, 1e-5))
        << "rank " << r << " output";
    EXPECT_TRUE(::torch::allclose(input_grads[r], whole.grad().narrow(0, at, rows[r]), 1e-4, 1e-5))
        << "rank " << r << " input gradient";
    at += rows[r];
  }
}

// Half-precision inputs: the per-channel factors stay in f32, as PyTorch's kernels keep
// them. In f16, a constant channel's 1/sqrt(eps) squared (1e5) overflowed to infinity and
// its input gradient came out NaN (found in review).
TEST(SyncBatchNorm, AHalfPrecisionConstantChannelGetsFiniteGradients) {
  const ::torch::Tensor input = draw({4, 2}, 60).to(::torch::kHalf);
  const ::torch::Tensor loss_weights = draw({4, 2}, 61);
  expect_all_passed(run_ranks(2, [&](int, std::shared_ptr<Communicator> comm) {
    SyncBatchNorm norm(comm, SyncBatchNormOptions(2));
    norm->to(::torch::kHalf);
    ::torch::Tensor x = input.clone();
    x.select(1, 1).fill_(0);  // a dead channel, as after a ReLU
    x.requires_grad_(true);
    const ::torch::Tensor y = norm->forward(x);
    EXPECT_EQ(y.scalar_type(), ::torch::kHalf);
    (y.to(::torch::kFloat) * loss_weights).sum().backward();
    EXPECT_TRUE(x.grad().isfinite().all().item<bool>()) << x.grad();
    EXPECT_TRUE(norm->weight.grad().isfinite().all().item<bool>()) << norm->weight.grad();
  }));
}

struct WithNormImpl : ::torch::nn::Module {
  explicit WithNormImpl(std::shared_ptr<Communicator> comm) {
    fc1 = register_module("fc1", ::torch::nn::Linear(8, 16));
    norm = register_module("norm", SyncBatchNorm(std::move(comm), SyncBatchNormOptions(16)));
    fc2 = register_module("fc2", ::torch::nn::Linear(16, 1));
  }
  ::torch::Tensor forward(const ::torch::Tensor& x) {
    return fc2->forward(::torch::relu(norm->forward(fc1->forward(x))));
  }
  ::torch::nn::Linear fc1{nullptr};
  SyncBatchNorm norm{nullptr};
  ::torch::nn::Linear fc2{nullptr};
};
TORCH_MODULE(WithNorm);

struct ReferenceImpl : ::torch::nn::Module {
  ReferenceImpl() {
    fc1 = register_module("fc1", ::torch::nn::Linear(8, 16));
    norm = register_module("norm", ::torch::nn::BatchNorm1d(16));
    fc2 = register_module("fc2", ::torch::nn::Linear(16, 1));
  }
  ::torch::Tensor forward(const ::torch::Tensor& x) {
    return fc2->forward(::torch::relu(norm->forward(fc1->forward(x))));
  }
  ::torch::nn::Linear fc1{nullptr};
  ::torch::nn::BatchNorm1d norm{nullptr};
  ::torch::nn::Linear fc2{nullptr};
};
TORCH_MODULE(Reference);

// Under DDP (gradients averaged, buffers from rank 0), two ranks with four rows each train
// as one process does on the eight rows with an ordinary BatchNorm: with one bucket, and
// with a bucket per parameter, whose all-reduces launch while the norm's backward
// all-reduces its statistics' gradients.
void trains_under_ddp_as_one_process(const braid::torch::DistributedDataParallelOptions& options) {
  constexpr int kSteps = 3;
  Reference reference;
  std::vector<::torch::Tensor> initial;
  for (const auto& p : reference->parameters()) initial.push_back(p.detach().clone());
  auto batch = [](int rank, int step) {
    return std::pair{draw({4, 8}, 100 * step + rank), draw({4, 1}, 100 * step + rank + 50)};
  };
  ::torch::optim::SGD ref_opt(reference->parameters(), 0.1);
  for (int step = 0; step < kSteps; ++step) {
    auto [x0, y0] = batch(0, step);
    auto [x1, y1] = batch(1, step);
    ref_opt.zero_grad();
    ::torch::mse_loss(reference->forward(::torch::cat({x0, x1})), ::torch::cat({y0, y1}))
        .backward();
    ref_opt.step();
  }
  std::vector<::torch::Tensor> trained;
  ::torch::Tensor running_mean;
  expect_all_passed(run_ranks(2, [&](int rank, std::shared_ptr<Communicator> comm) {
    WithNorm net(comm);
    {
      ::torch::NoGradGuard no_grad;
      const auto params = net->parameters();
      for (std::size_t i = 0; i < params.size(); ++i) params[i].copy_(initial[i]);
    }
    braid::torch::DistributedDataParallel ddp(net, comm, options);
    ::torch::optim::SGD opt(net->parameters(), 0.1);
    for (int step = 0; step < kSteps; ++step) {
      auto [x, y] = batch(rank, step);
      opt.zero_grad();
      ::torch::mse_loss(ddp.forward(x), y).backward();
      opt.step();
    }
    if (rank == 0) {
      for (const auto& p : net->parameters()) trained.push_back(p.detach().clone());
      running_mean = net->norm->running_mean.clone();
    }
  }));
  const auto expected = reference->parameters();
  ASSERT_EQ(trained.size(), expected.size());
  for (std::size_t i = 0; i < trained.size(); ++i) {
    EXPECT_TRUE(::torch::allclose(trained[i], expected[i], 1e-4, 1e-5)) << "parameter " << i;
  }
  EXPECT_TRUE(::torch::allclose(running_mean, reference->norm->running_mean, 1e-4, 1e-5));
}

TEST(SyncBatchNorm, TrainsUnderDdpAsOneProcessOnTheWholeBatch) {
  trains_under_ddp_as_one_process({});
}

TEST(SyncBatchNorm, TrainsUnderDdpAsOneProcessWithABucketPerParameter) {
  braid::torch::DistributedDataParallelOptions options;
  options.limits = {.first_bucket_bytes = 1, .bucket_cap_bytes = 1};
  options.rebuild_buckets = false;
  for (int run = 0; run < 3; ++run) trains_under_ddp_as_one_process(options);
}

TEST(SyncBatchNorm, UnevenInputsAreRefusedOnEveryRankWithASyncBatchNormInTheModel) {
  expect_all_passed(run_ranks(2, [&](int, std::shared_ptr<Communicator> comm) {
    WithNorm net(comm);
    braid::torch::DistributedDataParallel ddp(net, comm);
    try {
      ddp.allow_uneven_inputs();
      ADD_FAILURE() << "uneven inputs allowed with a SyncBatchNorm";
    } catch (const braid::Error& e) {
      EXPECT_NE(std::string(e.what()).find("SyncBatchNorm"), std::string::npos) << e.what();
    }
  }));
}

TEST(SyncBatchNorm, EvaluationUsesTheRunningStatisticsAndCommunicatesNothing) {
  expect_all_passed(run_ranks(2, [&](int rank, std::shared_ptr<Communicator> comm) {
    SyncBatchNorm norm(comm, SyncBatchNormOptions(3));
    norm->forward(draw({4, 3}, rank));  // training: both ranks
    norm->eval();
    if (rank == 1) return;  // rank 0 alone: a collective here would never finish
    const ::torch::Tensor x = draw({2, 3}, 7);
    const ::torch::Tensor expected = (x - norm->running_mean) / (norm->running_var + 1e-5).sqrt();
    EXPECT_TRUE(::torch::allclose(norm->forward(x), expected, 1e-5, 1e-6));
  }));
}

// Without running statistics, evaluation normalises with this rank's batch alone, as
// PyTorch's SyncBatchNorm does: no collective, so one rank may evaluate by itself.
TEST(SyncBatchNorm, EvaluationWithoutRunningStatisticsUsesThisRanksBatchAlone) {
  expect_all_passed(run_ranks(2, [&](int rank, std::shared_ptr<Communicator> comm) {
    SyncBatchNormOptions options(3);
    options.track_running_stats = false;
    SyncBatchNorm norm(comm, options);
    norm->eval();
    if (rank == 1) return;
    const ::torch::Tensor x = draw({6, 3}, 11);
    const ::torch::Tensor mean = x.mean(0);
    const ::torch::Tensor var = x.var(0, /*unbiased=*/false);
    EXPECT_TRUE(::torch::allclose(norm->forward(x), (x - mean) / (var + 1e-5).sqrt(), 1e-4, 1e-5));
  }));
}

// A batch far from zero with no running mean to centre on: the variance comes out of a
// difference that cancels, and must never go below zero (a NaN output).
TEST(SyncBatchNorm, AConstantBatchFarFromZeroNormalisesToFiniteValues) {
  expect_all_passed(run_ranks(2, [&](int, std::shared_ptr<Communicator> comm) {
    SyncBatchNormOptions options(2);
    options.track_running_stats = false;
    SyncBatchNorm norm(comm, options);
    const ::torch::Tensor out = norm->forward(::torch::full({5, 2}, 1234567.89f));
    EXPECT_TRUE(::torch::isfinite(out).all().item<bool>()) << out;
    EXPECT_TRUE(::torch::allclose(out, ::torch::zeros({5, 2}), 0, 1e-2)) << out;
  }));
}

// In training the other ranks are already in the statistics' all-reduce: a rank whose
// input does not fit fails them all at once, and they name it.
TEST(SyncBatchNorm, AnInputThatDoesNotFitOnOneRankFailsEveryRankNamingIt) {
  const auto errors = run_ranks(2, [&](int rank, std::shared_ptr<Communicator> comm) {
    SyncBatchNorm norm(comm, SyncBatchNormOptions(3));
    norm->forward(rank == 1 ? ::torch::zeros({4, 5}) : draw({4, 3}, 0));
  });
  ASSERT_EQ(errors.size(), 2u);
  EXPECT_NE(errors[0].find("rank 1 gave its SyncBatchNorm an input that is not (N, 3"),
            std::string::npos)
      << errors[0];
  EXPECT_NE(errors[1].find("[4, 5] is not (N, 3"), std::string::npos) << errors[1];
}

// momentum = nullopt (PyTorch's momentum=None): the running mean is the average of every
// batch's whole-batch mean so far.
TEST(SyncBatchNorm, WithoutAMomentumTheRunningStatisticsAverageEveryBatch) {
  expect_all_passed(run_ranks(2, [&](int rank, std::shared_ptr<Communicator> comm) {
    SyncBatchNormOptions options(3);
    options.momentum = std::nullopt;
    SyncBatchNorm norm(comm, options);
    ::torch::Tensor sum_of_means = ::torch::zeros({3});
    for (int step = 0; step < 3; ++step) {
      const ::torch::Tensor mine = draw({4, 3}, 10 * step + rank);
      const ::torch::Tensor theirs = draw({4, 3}, 10 * step + 1 - rank);
      sum_of_means += ::torch::cat({mine, theirs}).mean(0);
      norm->forward(mine);
    }
    EXPECT_TRUE(::torch::allclose(norm->running_mean, sum_of_means / 3, 1e-4, 1e-5))
        << norm->running_mean << sum_of_means / 3;
    EXPECT_EQ(norm->num_batches_tracked.item<int64_t>(), 3);
  }));
}

TEST(SyncBatchNorm, RefusesInputsWithTheWrongChannelsAndBadOptions) {
  expect_all_passed(run_ranks(1, [&](int, std::shared_ptr<Communicator> comm) {
    SyncBatchNorm norm(comm, SyncBatchNormOptions(3));
    try {
      norm->forward(::torch::zeros({4, 5}));
      ADD_FAILURE() << "5 channels into a 3-channel norm";
    } catch (const braid::Error& e) {
      EXPECT_NE(std::string(e.what()).find("SyncBatchNorm"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("[4, 5] is not (N, 3"), std::string::npos) << e.what();
    }
    SyncBatchNormOptions bad(3);
    bad.momentum = 2;
    EXPECT_THROW(SyncBatchNorm(comm, bad), braid::Error);
  }));
}

// Its backward is not itself differentiable: a backward with create_graph says so on
// every rank instead of giving a wrong second derivative.
TEST(SyncBatchNorm, ABackwardWithCreateGraphIsRefused) {
  expect_all_passed(run_ranks(2, [&](int rank, std::shared_ptr<Communicator> comm) {
    SyncBatchNorm norm(comm, SyncBatchNormOptions(2));
    const ::torch::Tensor x = draw({3, 2}, 70 + rank).requires_grad_(true);
    const ::torch::Tensor loss = norm->forward(x).pow(2).sum();
    try {
      loss.backward({}, /*retain_graph=*/true, /*create_graph=*/true);
      ADD_FAILURE() << "double backward went through";
    } catch (const std::exception& e) {
      EXPECT_NE(std::string(e.what()).find("no double backward"), std::string::npos) << e.what();
    }
  }));
}

}  // namespace
}  // namespace sync_batch_norm_test
