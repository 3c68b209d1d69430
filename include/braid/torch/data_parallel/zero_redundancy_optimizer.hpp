// braid::torch::ZeroRedundancyOptimizer: optimizer-state sharding (ZeRO stage 1, PyTorch's
// torch.distributed.optim.ZeroRedundancyOptimizer) for data-parallel training. Every rank
// holds the whole model and, after DistributedDataParallel's backward, the whole averaged
// gradient; each steps only its 1/P slice of the parameters, so Adam's two moments (two
// copies of the model, the largest part of a training rank's memory after the activations)
// are spread over the ranks; the updated slices are then all-gathered into every rank's
// parameters.
//
//   braid::torch::DistributedDataParallel ddp(model, comm);
//   braid::torch::ZeroRedundancyOptimizer optimizer(model->parameters(), comm,
//       [](std::vector<torch::Tensor> shard) {
//         return std::make_unique<torch::optim::Adam>(shard, torch::optim::AdamOptions(1e-3));
//       });
//   for (...) { optimizer.zero_grad(); loss(ddp.forward(x)).backward(); optimizer.step(); }
//
// The slice. The parameters, flattened in their order into one index space of N elements
// padded to a multiple of P, are cut into P equal slices: rank r steps elements
// [r N/P, (r+1) N/P), whatever parameters they fall in (PyTorch's partitions whole
// parameters, which balances badly when one parameter dominates). The optimizer is the
// user's, built by `make` over one tensor, this rank's slice: elementwise optimizers (SGD
// with momentum and weight decay, Adam, AdamW, RMSprop, Adagrad) then step exactly as they
// would on the whole model. Optimizers that look across elements (LBFGS) do not.
//
// Costs per step: copies of this rank's slice of the parameters and of the gradients into
// the slice and its .grad, the optimizer on N/P elements, one all-gather of N elements (the
// ring moves (P-1)/P x N per rank), and a copy of every parameter out of it. Memory held:
// the optimizer's state for N/P elements, what the ZeRO formula counts. During step() only:
// the slice and its gradient (2 N/P; between steps the slice is an empty tensor without a
// gradient, the same tensor object, which keys the optimizer's state) and the all-gather's
// N. Parameters without a gradient
// in a step keep their values, as the whole optimizer leaves them; their slice of the optimizer's
// state still sees a zero gradient (Adam's moments decay), where the whole optimizer would not
// touch it.
//
// Construction is a collective over `comm`: the ranks compare the parameters' count,
// element total and dtype, and any rank whose model differs makes every rank fail, naming
// it. Errors: parameters of more than one dtype, or not contiguous CPU floating tensors,
// are Error(invalid_argument) naming the parameter.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include <torch/optim/optimizer.h>
#include <torch/types.h>

#include <braid/collectives/communicator.hpp>

namespace braid::torch {

class ZeroRedundancyOptimizer {
 public:
  using OptimizerFactory =
      std::function<std::unique_ptr<::torch::optim::Optimizer>(std::vector<::torch::Tensor>)>;

  ZeroRedundancyOptimizer(std::vector<::torch::Tensor> parameters,
                          std::shared_ptr<collectives::Communicator> comm, OptimizerFactory make);

  // Sets every parameter's gradient to zero (in place, as DDP's bucket views want).
  void zero_grad();
  // Steps this rank's slice with the gradients the parameters hold (the same on every rank:
  // DDP's averages), then all-gathers the slices into every parameter. A collective.
  void step();

  // This rank's slice: its first element in the flat index space, and its length (N / P).
  std::int64_t slice_begin() const noexcept { return slice_begin_; }
  std::int64_t slice_size() const noexcept { return slice_size_; }
  // The parameters' total elements (N, without the padding).
  std::int64_t total_size() const noexcept { return total_; }
  ::torch::optim::Optimizer& optimizer() noexcept { return *optimizer_; }

 private:
  // A piece of one parameter inside this rank's slice.
  struct Piece {
    std::size_t parameter = 0;
    std::int64_t parameter_offset = 0;  // in the parameter's flattened elements
    std::int64_t slice_offset = 0;      // in this rank's slice
    std::int64_t size = 0;
  };
  std::vector<::torch::Tensor> parameters_;
  std::shared_ptr<collectives::Communicator> comm_;
  std::int64_t total_ = 0;
  std::int64_t slice_begin_ = 0;
  std::int64_t slice_size_ = 0;
  std::vector<Piece> pieces_;
  ::torch::Tensor slice_;  // this rank's elements, the optimizer's one parameter
  std::unique_ptr<::torch::optim::Optimizer> optimizer_;
};

}  // namespace braid::torch
