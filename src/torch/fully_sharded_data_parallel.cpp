#include <optional>
#include <set>

#include <fmt/format.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/functions/accumulate_grad.h>
#include <torch/csrc/autograd/utils/lambda_post_hook.h>
#include <torch/torch.h>

#include <braid/core/error.hpp>
#include <braid/torch/fully_sharded_data_parallel.hpp>
#include <braid/torch/tensor_buffer.hpp>

#include "tensor_collectives.hpp"

namespace braid::torch {

using ::torch::Tensor;

struct FullyShardedDataParallel::Unit {
  const ::torch::nn::Module* module = nullptr;
  std::string name;
  std::vector<Tensor> params;
  std::vector<std::int64_t> offsets;  // of each parameter in the flat vector
  std::vector<std::vector<std::int64_t>> shapes;
  std::int64_t total = 0;   // N
  std::int64_t padded = 0;  // N rounded up to a multiple of the ranks
  std::int64_t shard_size = 0;
  Tensor full;   // [padded]: the gathered storage, its bytes released while sharded
  Tensor shard;  // this rank's slice, the optimizer's parameter
  bool gathered = false;
  std::vector<std::shared_ptr<::torch::autograd::Node>> accumulators;
  std::vector<std::uintptr_t> hook_keys;
  std::size_t ready = 0;  // parameters whose gradient this backward has produced
  bool in_backward = false;
  std::optional<detail::TensorCollective> reducing;

  // The parameters as views of the gathered storage, in their own shapes.
  void point_parameters_at_full() {
    for (std::size_t i = 0; i < params.size(); ++i) {
      params[i].set_data(
          full.narrow(0, offsets[i], c10::multiply_integers(shapes[i])).view(shapes[i]));
    }
  }
};

namespace {

[[noreturn]] void refuse(const collectives::Communicator& comm, std::string what) {
  throw Error(Errc::invalid_argument, std::move(what),
              {.rank = comm.world_rank(comm.rank()), .operation = "FullyShardedDataParallel"});
}

// The gathered storage's bytes, released in place (views of it, in autograd's saved tensors
// too, keep the storage object and see new bytes when it is refilled).
void release_bytes(const Tensor& full) {
  c10::StorageImpl* storage = full.storage().unsafeGetStorageImpl();
  storage->set_data_ptr_noswap(at::DataPtr(nullptr, full.device()));
  storage->set_nbytes(0);
}

void allocate_bytes(const Tensor& full) {
  c10::StorageImpl* storage = full.storage().unsafeGetStorageImpl();
  const std::size_t bytes = static_cast<std::size_t>(full.numel()) * full.element_size();
  if (storage->nbytes() == bytes) return;
  storage->set_data_ptr_noswap(storage->allocator()->allocate(bytes));
  storage->set_nbytes(bytes);
}

}  // namespace

FullyShardedDataParallel::FullyShardedDataParallel(std::shared_ptr<collectives::Communicator> comm,
                                                   Options options)
    : comm_(std::move(comm)), options_(options) {}

FullyShardedDataParallel::~FullyShardedDataParallel() {
  for (auto& unit : units_) {
    for (std::size_t i = 0; i < unit->accumulators.size(); ++i) {
      unit->accumulators[i]->del_post_hook(unit->hook_keys[i]);
    }
  }
}

void FullyShardedDataParallel::shard(::torch::nn::Module& module) {
  auto unit = std::make_unique<Unit>();
  unit->module = &module;
  unit->name = module.name();
  std::set<const c10::TensorImpl*> taken;
  for (const auto& earlier : units_) {
    for (const Tensor& p : earlier->params) taken.insert(p.unsafeGetTensorImpl());
  }
  for (const Tensor& p : module.parameters()) {
    if (taken.insert(p.unsafeGetTensorImpl()).second) unit->params.push_back(p);
  }
  if (unit->params.empty()) {
    refuse(*comm_,
           fmt::format("{} has no parameters that an earlier unit did not take", unit->name));
  }
  const auto dtype = unit->params.front().scalar_type();
  for (const Tensor& p : unit->params) {
    if (!p.is_contiguous() || !p.device().is_cpu() || !p.is_floating_point() ||
        p.scalar_type() != dtype) {
      refuse(*comm_, fmt::format("{}'s parameters must be contiguous CPU floating tensors of "
                                 "one dtype",
                                 unit->name));
    }
    unit->offsets.push_back(unit->total);
    unit->shapes.push_back(p.sizes().vec());
    unit->total += p.numel();
  }
  // Every rank's unit alike (count of elements and dtype), or every rank fails.
  std::vector<std::int64_t> low{unit->total, static_cast<std::int64_t>(dtype)}, high = low;
  comm_->launch(comm_->all_reduce(Buffer(low), ReduceOp::min)).get();
  comm_->launch(comm_->all_reduce(Buffer(high), ReduceOp::max)).get();
  if (low != high) {
    refuse(*comm_, fmt::format("the ranks' unit {} differs: {} elements here, {}-{} across the "
                               "ranks",
                               unit->name, unit->total, low[0], high[0]));
  }
  const int ranks = comm_->size();
  unit->padded = (unit->total + ranks - 1) / ranks * ranks;
  const bool sharded = options_.strategy != ShardingStrategy::no_shard;
  unit->shard_size = sharded ? unit->padded / ranks : unit->padded;
  const auto options = unit->params.front().options().requires_grad(false);
  // Rank 0's values everywhere, flattened.
  unit->full = ::torch::zeros({unit->padded}, options);
  {
    ::torch::NoGradGuard no_grad;
    for (std::size_t i = 0; i < unit->params.size(); ++i) {
      unit->full.narrow(0, unit->offsets[i], unit->params[i].numel())
          .copy_(unit->params[i].detach().reshape({-1}));
    }
  }
  comm_->launch(comm_->broadcast(as_buffer(unit->full), 0)).get();
  unit->shard = (sharded ? unit->full.narrow(0, unit->shard_size * comm_->rank(), unit->shard_size)
                         : unit->full)
                    .clone();
  unit->shard.set_requires_grad(true);
  unit->gathered = true;
  unit->point_parameters_at_full();
  const std::size_t index = units_.size();
  for (const Tensor& p : unit->params) {
    auto accumulator = ::torch::autograd::impl::grad_accumulator(p);
    unit->hook_keys.push_back(
        accumulator->add_post_hook(std::make_unique<::torch::autograd::utils::LambdaPostHook>(
            [this, index](const ::torch::autograd::variable_list& outputs,
                          const ::torch::autograd::variable_list&) {
              on_gradient(index);
              return outputs;
            })));
    unit->accumulators.push_back(std::move(accumulator));
  }
  units_.push_back(std::move(unit));
  if (sharded) release(*units_.back());
}

void FullyShardedDataParallel::gather(Unit& unit) {
  // NO_SHARD stays gathered, and copies the optimizer's latest values in each time.
  if (unit.gathered && options_.strategy != ShardingStrategy::no_shard) return;
  allocate_bytes(unit.full);
  if (options_.strategy == ShardingStrategy::no_shard) {
    unit.full.copy_(unit.shard.detach());
  } else {
    comm_->launch(comm_->all_gather(as_buffer(unit.shard.detach()), as_buffer(unit.full))).get();
  }
  unit.point_parameters_at_full();
  unit.gathered = true;
}

void FullyShardedDataParallel::release(Unit& unit) {
  if (!unit.gathered || options_.strategy == ShardingStrategy::no_shard) return;
  for (Tensor& p : unit.params) p.set_data(::torch::empty({0}, unit.full.options()));
  release_bytes(unit.full);
  unit.gathered = false;
}

std::size_t FullyShardedDataParallel::before_forward(const ::torch::nn::Module& module) {
  for (std::size_t u = 0; u < units_.size(); ++u) {
    if (units_[u]->module == &module) {
      gather(*units_[u]);
      return u;
    }
  }
  refuse(*comm_, fmt::format("run() of {}, which is not a unit: shard() it first", module.name()));
}

void FullyShardedDataParallel::after_forward(std::size_t index,
                                             const std::vector<at::Tensor>& outputs) {
  Unit& unit = *units_[index];
  if (!::torch::autograd::GradMode::is_enabled()) {
    if (options_.strategy != ShardingStrategy::no_shard) release(unit);
    return;
  }
  unit.in_backward = true;
  if (options_.strategy == ShardingStrategy::full_shard) release(unit);
  // Gathered again before the unit's backward: the first gradient of one of its outputs.
  for (const at::Tensor& output : outputs) {
    if (!output.defined() || !output.requires_grad()) continue;
    output.register_hook([this, index](const at::Tensor&) {
      std::lock_guard lock(mutex_);
      gather(*units_[index]);
    });
  }
}

void FullyShardedDataParallel::on_gradient(std::size_t index) {
  std::lock_guard lock(mutex_);
  if (!callback_queued_) {
    callback_queued_ = true;
    ::torch::autograd::Engine::get_default_engine().queue_callback([this] { end_of_backward(); });
  }
  Unit& unit = *units_[index];
  if (++unit.ready < unit.params.size()) return;
  // Every gradient of the unit is in: flatten, reduce (scatter) while backward goes on.
  ::torch::NoGradGuard no_grad;
  Tensor flat = ::torch::zeros({unit.padded}, unit.full.options());
  for (std::size_t i = 0; i < unit.params.size(); ++i) {
    Tensor& grad = unit.params[i].mutable_grad();
    if (grad.defined()) flat.narrow(0, unit.offsets[i], grad.numel()).copy_(grad.reshape({-1}));
    grad = Tensor();
  }
  unit.reducing.emplace(options_.strategy == ShardingStrategy::no_shard
                            ? detail::start_reduce_over_ranks(*comm_, flat)
                            : detail::start_reduce_scatter_first_dim(*comm_, flat));
  release(unit);
}

void FullyShardedDataParallel::end_of_backward() {
  std::lock_guard lock(mutex_);
  callback_queued_ = false;
  for (auto& unit : units_) {
    if (!unit->in_backward) continue;
    unit->in_backward = false;
    if (!unit->reducing) {
      refuse(*comm_, fmt::format("backward ended before every parameter of {} had a gradient "
                                 "(a parameter the forward did not use)",
                                 unit->name));
    }
    Tensor summed = unit->reducing->result();
    unit->reducing.reset();
    unit->ready = 0;
    summed.div_(comm_->size());
    Tensor& grad = unit->shard.mutable_grad();
    if (grad.defined()) {
      grad.add_(summed);
    } else {
      grad = summed;
    }
    release(*unit);
  }
}

std::vector<at::Tensor> FullyShardedDataParallel::parameters() const {
  std::vector<at::Tensor> shards;
  for (const auto& unit : units_) shards.push_back(unit->shard);
  return shards;
}

std::vector<std::int64_t> FullyShardedDataParallel::unit_sizes() const {
  std::vector<std::int64_t> sizes;
  for (const auto& unit : units_) sizes.push_back(unit->total);
  return sizes;
}

std::int64_t FullyShardedDataParallel::shard_size(std::size_t unit) const {
  return units_.at(unit)->shard_size;
}

std::int64_t FullyShardedDataParallel::gathered_bytes() const {
  std::int64_t bytes = 0;
  for (const auto& unit : units_) {
    bytes += static_cast<std::int64_t>(unit->full.storage().nbytes());
  }
  return bytes;
}

}  // namespace braid::torch
