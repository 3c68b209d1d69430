// braid::torch::FullyShardedDataParallel: parameters, gradients and optimizer state sharded
// over a communicator's ranks (ZeRO stage 3, PyTorch's FSDP FULL_SHARD), or gradients and
// optimizer state only (SHARD_GRAD_OP), for a libtorch model whose submodules are run
// through it.
//
//   braid::torch::FullyShardedDataParallel fsdp(comm);
//   for (auto& block : model->blocks) fsdp.shard(*block);   // the units, innermost first
//   fsdp.shard(*model);                                      // the rest: the root unit
//   torch::optim::Adam optimizer(fsdp.parameters(), 1e-3);   // the shards
//   // in model->forward:  h = fsdp.run(*block, [&] { return block->forward(h); });
//   auto y = fsdp.run(*model, [&] { return model->forward(x); });
//   loss(y).backward();   // each unit's gradients reduce-scattered as its backward ends
//   optimizer.step();
//
// A unit is a module's parameters not already in an earlier unit, flattened in their order
// into one vector of N elements padded to a multiple of the P ranks; each rank keeps its
// N/P slice (the shard, a leaf tensor the optimizer steps, so Adam's state is sharded too).
// run() gathers the unit (one all-gather of N) unless it is gathered, runs the forward,
// and under FULL_SHARD frees the gathered storage again; a hook on the unit's outputs
// gathers it once more before its backward. The module's parameters stay its own tensors:
// while gathered they are views of the unit's gathered storage; while sharded they are
// empty (shape [0]), so code that reads them outside run() sees an empty tensor rather
// than stale values. Freeing releases the storage's bytes in place and gathering refills
// the same storage, so what autograd saved in forward reads the right values in backward
// (PyTorch FSDP's storage resize).
//
// Backward: each parameter's gradient accumulates whole, as usual; when a unit's last one
// is ready its gradients are flattened and reduce-scattered (the average over ranks) into
// the shard's gradient while backward goes on with earlier units, and the unit's gathered
// storage and whole gradients are freed. Backward's end waits for every reduce-scatter.
// SHARD_GRAD_OP keeps units gathered from forward until their backward ends (no second
// gather); NO_SHARD keeps them gathered always and all-reduces (DDP's memory and traffic).
//
// Costs per unit and step (N elements, P ranks): FULL_SHARD all-gathers N twice and
// reduce-scatters N once (3 x (P-1)/P x N per rank, 1.5 x DDP's all-reduce), SHARD_GRAD_OP
// once and once; memory per rank: the shard, its gradient and optimizer state (N/P each),
// and, while a unit is gathered, N for its parameters and N for its gradients.
//
// Construction of a unit (shard()) is a collective: ranks compare the unit's element count
// and dtype, failing together, naming the rank, where they differ; rank 0's values are
// broadcast. Errors: a unit with no parameters of its own, parameters of several dtypes or
// not contiguous CPU floating tensors, run() of a module that is not a unit, are
// Error(invalid_argument) naming it. Not yet: prefetching the next unit's gather, no_sync,
// mixed precision, checkpoints (the later parts).
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <type_traits>
#include <vector>

#include <torch/nn/module.h>
#include <torch/types.h>

#include <braid/collectives/communicator.hpp>
#include <braid/torch/distributed_data_parallel.hpp>

namespace braid::torch {

enum class ShardingStrategy {
  full_shard,     // parameters, gradients, optimizer state (ZeRO-3)
  shard_grad_op,  // gradients and optimizer state; parameters gathered from forward to backward
  no_shard,       // nothing sharded: DDP's behaviour
};

struct FullyShardedDataParallelOptions {
  ShardingStrategy strategy = ShardingStrategy::full_shard;
};

class FullyShardedDataParallel {
 public:
  using Options = FullyShardedDataParallelOptions;

  FullyShardedDataParallel(std::shared_ptr<collectives::Communicator> comm, Options options = {});
  ~FullyShardedDataParallel();
  FullyShardedDataParallel(const FullyShardedDataParallel&) = delete;
  FullyShardedDataParallel& operator=(const FullyShardedDataParallel&) = delete;

  // Makes `module`'s parameters that no earlier unit took one unit. A collective.
  void shard(::torch::nn::Module& module);

  // Runs `forward` (the unit's forward, a callable) with `module`'s unit gathered, and
  // arranges for its backward (see above). Returns what `forward` returns.
  template <class Forward>
  auto run(::torch::nn::Module& module, Forward&& forward) {
    const std::size_t unit = before_forward(module);
    auto output = forward();
    std::vector<at::Tensor> tensors;
    detail::collect_tensors(output, tensors);
    after_forward(unit, tensors);
    return output;
  }

  // The shards, one leaf tensor per unit, in the order the units were made: what the
  // optimizer steps.
  std::vector<at::Tensor> parameters() const;
  // The elements of each unit (N, unpadded) and of this rank's shard of it (N / P).
  std::vector<std::int64_t> unit_sizes() const;
  std::int64_t shard_size(std::size_t unit) const;
  // Bytes of gathered parameter storage alive now, over every unit: 0 between steps under
  // FULL_SHARD and SHARD_GRAD_OP.
  std::int64_t gathered_bytes() const;

 private:
  struct Unit;
  std::size_t before_forward(const ::torch::nn::Module& module);
  void after_forward(std::size_t unit, const std::vector<at::Tensor>& outputs);
  void gather(Unit& unit);
  void release(Unit& unit);
  void on_gradient(std::size_t unit);
  void end_of_backward();

  std::shared_ptr<collectives::Communicator> comm_;
  Options options_;
  std::vector<std::unique_ptr<Unit>> units_;
  std::mutex mutex_;
  bool callback_queued_ = false;
};

}  // namespace braid::torch
