// braid::torch::SyncBatchNorm: batch normalisation whose statistics are those of the whole
// batch across a communicator's ranks (PyTorch's torch.nn.SyncBatchNorm), for data-parallel
// training where each rank's share of the batch is too small for good statistics.
//
//   braid::torch::SyncBatchNorm norm(comm, braid::torch::SyncBatchNormOptions(64));
//   auto y = norm(x);   // x: (N, C) or (N, C, *); every rank calls it, in the same order
//
// Training (or without running statistics): each rank sums its (x - K) and (x - K)^2 per
// channel, in double, with its element count, and one all-reduce of 2C + 3 numbers makes
// the whole batch's mean and (biased) variance. K is the running mean, the same on every
// rank: sums around it do not cancel catastrophically once it is near the batch mean, as
// raw sums of squares would. Backward is PyTorch's SyncBatchNorm's: each rank sums dy and
// dy * (x - mean) per channel, one all-reduce of those 2C numbers gives the whole batch's,
// and the input gradient is that of the sum of every rank's loss; the affine parameters'
// gradients are this rank's share, which DDP then averages like any other. Ranks may hold
// different numbers of samples; the counts are part of the sums.
//
// Evaluation communicates nothing: it uses the running statistics, or without them this
// rank's batch alone (as PyTorch's does). Running statistics are updated with the whole
// batch's mean and unbiased variance, identically on every rank; the sums assume the
// running mean is the same on every rank, which DDP's broadcast_buffers (the default)
// keeps so.
//
// The statistics go over a communicator split once from `comm` and shared by every
// SyncBatchNorm made from it (constructing one is a collective the first time): a
// collective called by backward on the communicator DDP's buckets use could be numbered
// differently on different ranks. Not with DDP's join() (uneven inputs): a joined rank
// has no forward to shadow these with, and allow_uneven_inputs() refuses such a model.
//
// Costs per forward in training: the input converted to double and centred, while the
// statistics are summed (freed before the output is made); one all-reduce of (2C + 3)
// doubles (the two beyond the sums and the count say whether some rank's input did not
// fit, so that every rank fails together, naming it). Autograd keeps the input and three
// C-vectors, as PyTorch's kernel does. Backward: one pass making x - mean, one all-reduce
// of 2C doubles. No double backward (nor has PyTorch's).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>

#include <torch/nn/cloneable.h>
#include <torch/nn/pimpl.h>
#include <torch/types.h>

#include <braid/collectives/communicator.hpp>

namespace braid::torch {

struct SyncBatchNormOptions {
  explicit SyncBatchNormOptions(std::int64_t num_features) : num_features(num_features) {}
  std::int64_t num_features;
  double eps = 1e-5;
  // Weight of the new batch in the running statistics; nullopt: their cumulative average
  // over every batch so far (1 / batches tracked), as PyTorch's momentum=None.
  std::optional<double> momentum = 0.1;
  bool affine = true;  // a learnt scale and shift per channel
  bool track_running_stats = true;
};

class SyncBatchNormImpl : public ::torch::nn::Cloneable<SyncBatchNormImpl> {
 public:
  // Throws Error(invalid_argument) for num_features < 1, eps <= 0, momentum outside [0, 1].
  // A collective the first time one is made from `comm` (see above).
  SyncBatchNormImpl(std::shared_ptr<collectives::Communicator> comm, SyncBatchNormOptions options);

  // A collective in training mode: every rank calls it with the same channel count.
  // Throws Error(invalid_argument) for an input that is not (N, C[, ...]) with C channels.
  ::torch::Tensor forward(const ::torch::Tensor& input);
  void reset() override;

  ::torch::Tensor weight, bias;               // affine: ones and zeros to begin with
  ::torch::Tensor running_mean, running_var;  // track_running_stats
  ::torch::Tensor num_batches_tracked;

  const SyncBatchNormOptions& options() const noexcept { return options_; }

 private:
  std::shared_ptr<collectives::Communicator> comm_;
  SyncBatchNormOptions options_;
};
// What TORCH_MODULE(SyncBatchNorm) would declare, spelled out: inside braid::torch that
// macro's unqualified torch:: names this namespace.
class SyncBatchNorm : public ::torch::nn::ModuleHolder<SyncBatchNormImpl> {
 public:
  using ::torch::nn::ModuleHolder<SyncBatchNormImpl>::ModuleHolder;
  using ::torch::nn::ModuleHolder<SyncBatchNormImpl>::get;
};

// The sum over the communicator's ranks of each rank's `tensor`, as a differentiable
// operation (PyTorch's torch.distributed.nn.functional.all_reduce): its backward is the
// sum over ranks of the gradients arriving at the result. A collective, in forward and in
// backward. CPU tensors.
::torch::Tensor all_reduce_sum(std::shared_ptr<collectives::Communicator> comm,
                               const ::torch::Tensor& tensor);

}  // namespace braid::torch
