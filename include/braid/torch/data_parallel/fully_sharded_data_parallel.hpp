// braid::torch::FullyShardedDataParallel: parameters, gradients and optimizer state sharded
// over a communicator's ranks (ZeRO stage 3, PyTorch's FSDP FULL_SHARD), or gradients and
// optimizer state only (SHARD_GRAD_OP), or sharded inside each node and replicated across
// nodes (HYBRID_SHARD), for a libtorch model whose submodules are run through it.
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
// into one vector of N elements padded to a multiple of the P ranks it is sharded over;
// each rank keeps its N/P slice (the shard, a leaf tensor the optimizer steps, so Adam's
// state is sharded too). run() gathers the unit (one all-gather of N) unless it is
// gathered, runs the forward, and under FULL_SHARD frees the gathered storage again; a
// hook on the unit's outputs gathers it once more before its backward. The module's
// parameters stay its own tensors: while gathered they are views of the unit's gathered
// storage; while sharded they are empty (shape [0]), so code that reads them outside run()
// sees an empty tensor rather than stale values. Freeing releases the storage's bytes in
// place and gathering refills the same storage, so what autograd saved in forward reads
// the right values in backward (PyTorch FSDP's storage resize).
//
// Prefetch. The order units run in is recorded in the first step; from the second, when a
// unit's forward starts, the all-gathers of the next `prefetch` units in that order start
// too, and in backward those of the next units in the reverse order, so the gathers run
// while the current unit computes. Gathered at once, at most: the units whose run()
// encloses the current one (the root's), the current one, and `prefetch` ahead; each change of
// the count is a trace counter ("fsdp gathered units"). Each unit's forward (less the
// inner units' runs) and backward (from its gather to its last gradient) is a compute span,
// "fsdp.forward" and "fsdp.backward", and every gather and reduction a comm span, so
// braid-trace summary reports what the prefetch and the reduce-scatters hid; where a
// gather starts, the calling thread records an instant "fsdp.gather UNIT".
//
// Backward: each parameter's gradient accumulates whole, as usual; when a unit's last one
// is ready its gradients are flattened and reduce-scattered (the average over ranks) into
// the shard's gradient while backward goes on with earlier units, and the unit's gathered
// storage and whole gradients are freed; the flattened copy goes when its reduction has
// finished (checked as each later unit's gradients come in). Backward's end waits for every
// reduce-scatter.
// SHARD_GRAD_OP keeps units gathered from forward until their backward ends (no second
// gather); NO_SHARD keeps them gathered always and all-reduces (DDP's memory and traffic);
// HYBRID_SHARD reduce-scatters inside the node, then all-reduces the shard across nodes.
// Under no_sync() the flattened gradients accumulate unsharded (N per unit) instead, and
// the next synchronised backward reduces their sum.
//
// Mixed precision (options.mixed_precision): units are gathered in param_dtype (bf16 or
// f16: half the all-gather bytes; the forward and backward compute in it, so inputs must be
// in it too), gradients are reduced in reduce_dtype, and the shards (the optimizer's master
// weights) stay f32.
//
// Checkpoints: full_state_dict() gathers every parameter whole on rank 0, by its name in
// the root module, and load_full_state_dict() takes such a dict on every rank, whatever
// the number of ranks that saved it; save_sharded() and load_sharded() write and read each
// rank's shards (the same ranks and units only). The optimizer's state is over the shards:
// save it per rank beside them (torch::save(optimizer, ...)).
//
// Costs per unit and step (N elements, P ranks): FULL_SHARD all-gathers N twice and
// reduce-scatters N once (3 x (P-1)/P x N per rank, 1.5 x DDP's all-reduce), SHARD_GRAD_OP
// once and once; memory per rank: the shard, its gradient and optimizer state (N/P each),
// and, while a unit is gathered, N for its parameters and N for its gradients.
//
// shard() is a collective: ranks compare the unit's element count and dtype, failing
// together, naming the unit, where they differ; rank 0's values are broadcast. Errors: a
// unit with no parameters of its own, parameters of several dtypes or not contiguous CPU
// floating tensors, run() of a module that is not a unit, a state dict missing a parameter
// or holding one of another shape, a sharded checkpoint from other ranks or units, are
// Error(invalid_argument) naming it; a rank that dies during a gather or a reduction fails
// the others' call naming it (Errc::peer_failed), as every collective does.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <c10/core/ScalarType.h>
#include <c10/util/Exception.h>
#include <torch/nn/module.h>
#include <torch/types.h>

#include <braid/collectives/communicator.hpp>
#include <braid/torch/data_parallel/module_outputs.hpp>
#include <braid/torch/data_parallel/no_sync.hpp>
#include <braid/trace/compute_span.hpp>

namespace braid::torch {

enum class ShardingStrategy {
  full_shard,     // parameters, gradients, optimizer state (ZeRO-3)
  shard_grad_op,  // gradients and optimizer state; parameters gathered from forward to backward
  no_shard,       // nothing sharded: DDP's behaviour
  hybrid_shard,   // full_shard inside each node, replicated across nodes
};

struct MixedPrecision {
  c10::ScalarType param_dtype = c10::ScalarType::BFloat16;   // gathers and compute
  c10::ScalarType reduce_dtype = c10::ScalarType::BFloat16;  // gradient reductions
};

struct FullyShardedDataParallelOptions {
  ShardingStrategy strategy = ShardingStrategy::full_shard;
  int prefetch = 1;  // units gathered ahead (0: each when it runs)
  std::optional<MixedPrecision> mixed_precision;
};

class FullyShardedDataParallel {
 public:
  using Options = FullyShardedDataParallelOptions;

  // A collective under HYBRID_SHARD (it splits `comm` by node and across nodes).
  FullyShardedDataParallel(std::shared_ptr<collectives::Communicator> comm, Options options = {});
  ~FullyShardedDataParallel();
  FullyShardedDataParallel(const FullyShardedDataParallel&) = delete;
  FullyShardedDataParallel& operator=(const FullyShardedDataParallel&) = delete;

  // Makes `module`'s parameters that no earlier unit took one unit, called `name` in
  // messages and forward_order() (empty: the module's type name). A collective.
  void shard(::torch::nn::Module& module, std::string name = {});

  // The size-based auto-wrap policy (PyTorch's size_based_auto_wrap_policy): walks `root`'s
  // submodules children first and makes a unit of each whose parameters that no unit took
  // yet number at least `min_parameters`, named by its path in `root` ("blocks.3"); then
  // `root` takes the rest, as "root". Returns the units' names in the order made. Every
  // module that became a unit must run through run() (run_if_unit() for code that does not
  // know which did). A collective, as shard().
  std::vector<std::string> shard_by_size(::torch::nn::Module& root, std::int64_t min_parameters);

  // Whether `module` is a unit.
  bool is_unit(const ::torch::nn::Module& module) const;
  // run(module, forward) where `module` is a unit, forward() where it is not: for a model's
  // forward written once for any wrapping.
  template <class Forward>
  auto run_if_unit(::torch::nn::Module& module, Forward&& forward) {
    return is_unit(module) ? run(module, std::forward<Forward>(forward)) : forward();
  }

  // Runs `forward` (the unit's forward, a callable) with `module`'s unit gathered, and
  // arranges for its backward (see above). Returns what `forward` returns. A libtorch error
  // inside `forward` while other units are sharded (most often a forward that calls a
  // unit's module directly instead of through run(), so it meets the unit's empty
  // parameters) becomes Error(invalid_argument) naming those units, with libtorch's
  // message; running out of memory stays c10::OutOfMemoryError. Whatever `forward` throws,
  // the unit's forward is abandoned (its span ended, its gathered parameters released).
  template <class Forward>
  auto run(::torch::nn::Module& module, Forward&& forward) {
    const std::size_t unit = before_forward(module);
    auto output = [&] {
      try {
        return forward();
      } catch (const c10::OutOfMemoryError&) {
        abandon_forward(unit);
        throw;
      } catch (const c10::Error& e) {
        refuse_sharded_use(unit, e);
      } catch (...) {
        abandon_forward(unit);
        throw;
      }
    }();
    std::vector<at::Tensor> tensors;
    detail::collect_tensors(output, tensors);
    after_forward(unit, tensors);
    return output;
  }

  // While it lives, backward passes accumulate unsharded gradients locally; the first
  // backward after it reduces their sum (PyTorch's no_sync()).
  using NoSync = braid::torch::NoSync;
  [[nodiscard]] NoSync no_sync() { return NoSync(sync_); }

  // The same switch for schedules that run several forwards before their backwards (a
  // pipeline stage's microbatches, torch/pipeline_executor.hpp): the stage's
  // prepare_backward sets it before each backward, true for the last of the step, which
  // reduces what the others accumulated. A unit keeps its place for every forward whose
  // backward is still to come (SHARD_GRAD_OP: gathered until the last of them).
  void set_gradient_sync(bool sync);

  // After backward: scales the shards' gradients so that the whole gradient's L2 norm is
  // at most `max_norm`; returns the norm before. A collective (one all-reduce of a number).
  double clip_grad_norm(double max_norm);

  // The shards, one leaf tensor per unit, in the order the units were made: what the
  // optimizer steps (f32 under mixed precision).
  std::vector<at::Tensor> parameters() const;
  // The elements of each unit (N, unpadded) and of this rank's shard of it.
  std::vector<std::int64_t> unit_sizes() const;
  std::int64_t shard_size(std::size_t unit) const;
  // Bytes of gathered parameter storage alive now, over every unit: 0 between steps under
  // FULL_SHARD, SHARD_GRAD_OP and HYBRID_SHARD.
  std::int64_t gathered_bytes() const;
  // The units' names in the order their forwards ran in the first step.
  std::vector<std::string> forward_order() const;

  // Checkpoints (see above). Collectives, every rank calling them alike.
  std::map<std::string, at::Tensor> full_state_dict(const ::torch::nn::Module& root);
  void load_full_state_dict(const ::torch::nn::Module& root,
                            const std::map<std::string, at::Tensor>& state);
  void save_sharded(const std::string& directory);
  void load_sharded(const std::string& directory);

  struct Unit;  // src/torch/fully_sharded_unit.hpp

 private:
  std::size_t before_forward(const ::torch::nn::Module& module);
  void after_forward(std::size_t unit, const std::vector<at::Tensor>& outputs);
  // After `forward` threw: ends the unit's span and releases its gathered parameters.
  void abandon_forward(std::size_t unit);
  // Called in a catch block with what it caught: abandons the unit's forward, then throws
  // the Error described at run(), or rethrows `error` where no other unit was sharded (or
  // an inner run() rethrew it already: an outer one does not relabel it).
  [[noreturn]] void refuse_sharded_use(std::size_t unit, const c10::Error& error);
  void start_gather(std::size_t unit);
  void gather(std::size_t unit);
  void prefetch_after(std::size_t unit, bool backward);
  void release(Unit& unit);
  void count_gathered();
  void on_gradient(std::size_t unit);
  void finish_reduction(Unit& unit);
  void end_of_backward();
  std::map<const c10::TensorImpl*, std::string> names_in(const ::torch::nn::Module& root) const;

  std::shared_ptr<collectives::Communicator> comm_;
  std::shared_ptr<collectives::Communicator> shard_comm_;      // whom a unit is sharded over
  std::shared_ptr<collectives::Communicator> replicate_comm_;  // HYBRID_SHARD: across nodes
  Options options_;
  std::vector<std::unique_ptr<Unit>> units_;
  std::vector<std::size_t> order_;           // units in forward order, from the first step
  std::vector<std::size_t> backward_order_;  // and in the order their backwards began
  bool recording_order_ = true;
  bool recording_backward_order_ = true;
  // Compute spans: the running units' forwards (innermost last; an enclosing one is paused
  // while an inner one runs) and each unit's backward from its gather to its last gradient.
  std::vector<trace::ComputeSpan> forward_spans_;
  std::map<std::size_t, trace::ComputeSpan> backward_spans_;
  std::recursive_mutex mutex_;
  bool callback_queued_ = false;
  std::atomic<bool> sync_{true};
};

}  // namespace braid::torch
