// Data parallelism as the examples' --sharding chooses it: DDP (none), DDP with
// ZeroRedundancyOptimizer (optimizer: ZeRO-1), or FullyShardedDataParallel under
// SHARD_GRAD_OP (grad: ZeRO-2), FULL_SHARD (full: ZeRO-3) or NO_SHARD (no_shard), each hidden
// layer or transformer block one unit and the root unit the rest. Every choice computes the
// same step from the same start and data. Shared by the main job (examples/ddp_train.cpp)
// and braid-bench's sharded worker, with the model-state bytes a rank holds estimated (the
// ZeRO paper's formulas, braid/dp/model_state_memory.hpp) and measured (its tensors).
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <torch/torch.h>

#include <braid/braid.hpp>
#include <braid/torch/checkpoint/disk_checkpoints.hpp>
#include <braid/torch/data_parallel/distributed_data_parallel.hpp>
#include <braid/torch/data_parallel/fully_sharded_data_parallel.hpp>
#include <braid/torch/data_parallel/zero_redundancy_optimizer.hpp>

#include "braid_models/models.hpp"
#include "braid_models/restartable.hpp"
#include "braid_models/training_checks.hpp"

namespace example_models {

enum class Sharding { none, optimizer, grad, full, no_shard };

Sharding sharding_named(const std::string& text);

bool is_fsdp(Sharding s);

// What the choice shards, in the formulas' terms (NO_SHARD is DDP's).
braid::dp::ShardedState sharded_state(Sharding s);

// How the main job names the choice beside "gradient sync:".
std::string describe(Sharding s, const TrainingChoice& training);

// Bytes of model state one rank holds, measured from its tensors.
struct HeldBytes {
  std::int64_t parameters = 0;  // with FSDP's gathered units at their sampled peak
  std::int64_t gradients = 0;
  std::int64_t optimizer_state = 0;
  std::int64_t total() const { return parameters + gradients + optimizer_state; }
};

std::int64_t bytes_of(const torch::Tensor& t);

// The state tensors of the examples' optimizers (Adam's moments, SGD's momentum).
std::int64_t optimizer_state_bytes(const torch::optim::Optimizer& optimizer);

// K of the examples' optimizers (make_optimizer's): Adam's two f32 moments, SGD's momentum.
int optimizer_state_bytes_per_parameter(const std::string& optimizer);

// This process's peak resident size (VmHWM), in bytes; 0 where /proc does not say.
std::int64_t peak_resident_bytes();

std::string mib(std::int64_t bytes);

// One rank's model under `sharding`, with its optimizer; sync false (none only) trains
// without communication. Construction is a collective (DDP's, ZeRO's and each unit's checks).
template <class Model>
class ShardedTraining {
 public:
  ShardedTraining(Model model, std::shared_ptr<braid::collectives::Communicator> comm,
                  Sharding sharding, bool sync, const TrainingChoice& training, double lr)
      : model_(model), comm_(std::move(comm)), sharding_(sharding) {
    if (!sync && sharding != Sharding::none)
      throw std::invalid_argument("--sync none needs --sharding none");
    for (const auto& p : model_->parameters()) parameters_ += p.numel();
    if (is_fsdp(sharding)) {
      using braid::torch::ShardingStrategy;
      fsdp_.emplace(comm_,
                    braid::torch::FullyShardedDataParallelOptions{
                        .strategy = sharding == Sharding::full   ? ShardingStrategy::full_shard
                                    : sharding == Sharding::grad ? ShardingStrategy::shard_grad_op
                                                                 : ShardingStrategy::no_shard});
      for (const auto& unit : model_->units()) fsdp_->shard(*unit);
      fsdp_->shard(*model_);
      optimizer_ = make_optimizer(training.optimizer, fsdp_->parameters(), lr);
      return;
    }
    if (sync) ddp_.emplace(model_, comm_, training.ddp);  // rank 0's weights everywhere
    if (sharding == Sharding::optimizer) {
      zero_.emplace(model_->parameters(), comm_, [&](std::vector<torch::Tensor> slice) {
        return make_optimizer(training.optimizer, std::move(slice), lr);
      });
    } else {
      optimizer_ = make_optimizer(training.optimizer, model_->parameters(), lr);
    }
  }

  torch::Tensor forward(const torch::Tensor& x) {
    if (!fsdp_) return ddp_ ? ddp_->forward(x) : model_->forward(x);
    // Each unit's gathered bytes sampled as it runs forward, and again as its backward starts
    // (this hook runs after the one FSDP's run() put first, which gathers the unit again).
    auto run_unit = [&](torch::nn::Module& unit, auto&& unit_forward) {
      torch::Tensor out = fsdp_->run(unit, [&] {
        torch::Tensor y = unit_forward();
        sample_gathered();
        return y;
      });
      if (out.requires_grad())
        out.register_hook([this](const torch::Tensor&) { sample_gathered(); });
      return out;
    };
    return run_unit(*model_, [&] { return model_->forward(x, run_unit); });
  }

  // In place, not libtorch 2's default of none: a DDP gradient stays its bucket's view, where
  // a new tensor each step would cost the reducer a copy into the bucket.
  void zero_grad() { zero_ ? zero_->zero_grad() : optimizer_->zero_grad(/*set_to_none=*/false); }

  void step() {
    if (zero_) {
      // No compute span: ZeRO's step ends in a blocking all-gather the span would hide.
      zero_->step();
      return;
    }
    braid::trace::ComputeRegion region("optimizer");
    optimizer_->step();
  }

  // This rank's whole training state after `step` steps, for the checkpoints: its
  // parameters (FSDP: its shards), the model's buffers, its optimizer's state (ZeRO: its
  // slice's) and the CPU generator. restore() puts such a state back into a ShardedTraining
  // built alike.
  braid::torch::TrainingState state(std::int64_t step) {
    braid::torch::TrainingState state =
        training_state(step, held_parameters(), model_->buffers(), optimizer());
    // What every rank holds alike, which an in-memory copy splits among them: everything
    // under DDP and NO_SHARD, the parameters and buffers under ZeRO-1; nothing under the
    // other FSDP strategies, or without synchronisation.
    const bool all = ddp_.has_value() ? !zero_ : sharding_ == Sharding::no_shard;
    const bool model = ddp_.has_value() || sharding_ == Sharding::no_shard;
    for (const auto& [name, tensor] : state.tensors) {
      if (all || (model && !name.starts_with("optimizer"))) state.replicated.insert(name);
    }
    return state;
  }

  void restore(const braid::torch::TrainingState& state) {
    restore_training_state(state, held_parameters(), model_->buffers(), optimizer());
  }

  // The optimizer this rank steps (ZeRO: over its slice).
  torch::optim::Optimizer& optimizer() { return zero_ ? zero_->optimizer() : *optimizer_; }

  braid::torch::DistributedDataParallel<Model>* ddp() { return ddp_ ? &*ddp_ : nullptr; }

  // What this rank holds of the model's parameters: all of them, or (FSDP) its shards.
  std::vector<torch::Tensor> held_parameters() const {
    return fsdp_ ? fsdp_->parameters() : model_->parameters();
  }
  std::int64_t parameter_count() const { return parameters_; }

  // Tensors every rank holds alike after a step (for ranks_hold_the_same_weights): the
  // model's under DDP and ZeRO-1, NO_SHARD's shards (whole); none where each rank holds
  // its own shard.
  std::vector<torch::Tensor> replicated_parameters() const {
    if (!fsdp_) return model_->parameters();
    if (sharding_ == Sharding::no_shard) return fsdp_->parameters();
    return {};
  }

  // The ZeRO formulas for this model and choice, in f32, with the largest unit's transient.
  braid::dp::ModelStateMemory estimate(const std::string& optimizer) const {
    std::int64_t largest_unit = 0;
    if (fsdp_) {
      for (std::int64_t n : fsdp_->unit_sizes()) largest_unit = std::max(largest_unit, n);
    }
    return braid::dp::estimate_model_state_memory(
        {.parameters = parameters_,
         .ranks = comm_->size(),
         .optimizer_state_bytes = optimizer_state_bytes_per_parameter(optimizer),
         .largest_unit =
             sharded_state(sharding_) >= braid::dp::ShardedState::gradients ? largest_unit : 0},
        sharded_state(sharding_));
  }

  // What this rank holds now (after a step), with FSDP's gathered parameters at the peak
  // sampled while units ran. FSDP's whole gradients of a unit before its reduce-scatter are
  // not visible from here.
  HeldBytes held() {
    HeldBytes held;
    if (fsdp_) {
      for (const auto& shard : fsdp_->parameters()) {
        held.parameters += bytes_of(shard);
        held.gradients += bytes_of(shard.grad());
      }
      held.parameters += std::max(gathered_peak_, fsdp_->gathered_bytes());
      held.optimizer_state = optimizer_state_bytes(*optimizer_);
      return held;
    }
    for (const auto& p : model_->parameters()) {
      held.parameters += bytes_of(p);
      held.gradients += bytes_of(p.grad());
    }
    if (zero_) {
      // The slice the inner optimizer steps and its gradient: empty outside step(), as the
      // all-gather's buffer is.
      for (const auto& group : zero_->optimizer().param_groups()) {
        for (const auto& slice : group.params()) {
          held.parameters += bytes_of(slice);
          held.gradients += bytes_of(slice.grad());
        }
      }
      held.optimizer_state = optimizer_state_bytes(zero_->optimizer());
    } else {
      held.optimizer_state = optimizer_state_bytes(*optimizer_);
    }
    return held;
  }

 private:
  void sample_gathered() { gathered_peak_ = std::max(gathered_peak_, fsdp_->gathered_bytes()); }

  Model model_;
  std::shared_ptr<braid::collectives::Communicator> comm_;
  Sharding sharding_;
  std::int64_t parameters_ = 0;
  std::optional<braid::torch::DistributedDataParallel<Model>> ddp_;
  std::optional<braid::torch::ZeroRedundancyOptimizer> zero_;
  std::optional<braid::torch::FullyShardedDataParallel> fsdp_;
  std::unique_ptr<torch::optim::Optimizer> optimizer_;
  std::int64_t gathered_peak_ = 0;
};

}  // namespace example_models
