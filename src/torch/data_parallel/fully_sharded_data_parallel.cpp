#include <algorithm>
#include <cmath>
#include <set>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/functions/accumulate_grad.h>
#include <torch/csrc/autograd/utils/lambda_post_hook.h>
#include <torch/torch.h>

#include <braid/core/error.hpp>
#include <braid/torch/data_parallel/fully_sharded_data_parallel.hpp>
#include <braid/torch/tensor_buffer.hpp>
#include <braid/trace/compute_span.hpp>
#include <braid/trace/span.hpp>
#include <braid/transport/world.hpp>

#include "torch/data_parallel/fully_sharded_unit.hpp"
#include "torch/storage_bytes.hpp"

namespace braid::torch {

using ::torch::Tensor;

namespace {

[[noreturn]] void refuse(const collectives::Communicator& comm, std::string what) {
  throw Error(Errc::invalid_argument, std::move(what),
              {.rank = comm.world_rank(comm.rank()), .operation = "FullyShardedDataParallel"});
}

}  // namespace

FullyShardedDataParallel::FullyShardedDataParallel(std::shared_ptr<collectives::Communicator> comm,
                                                   Options options)
    : comm_(std::move(comm)), options_(options) {
  if (options_.prefetch < 0) {
    refuse(*comm_, fmt::format("prefetch {} must be 0 or more", options_.prefetch));
  }
  shard_comm_ = comm_;
  if (options_.strategy == ShardingStrategy::hybrid_shard) {
    // Shard inside each node; the ranks holding the same shard on every node replicate it.
    transport::World& world = comm_->world();
    const int node = world.node_of(comm_->world_rank(comm_->rank()));
    int on_node = 0;
    for (int r = 0; r < comm_->rank(); ++r) on_node += world.node_of(comm_->world_rank(r)) == node;
    shard_comm_ = comm_->launch(comm_->split(node, comm_->rank())).get();
    replicate_comm_ = comm_->launch(comm_->split(on_node, comm_->rank())).get();
    std::vector<std::int64_t> low{shard_comm_->size()}, high = low;
    comm_->launch(comm_->all_reduce(Buffer(low), ReduceOp::min)).get();
    comm_->launch(comm_->all_reduce(Buffer(high), ReduceOp::max)).get();
    if (low != high) {
      refuse(*comm_, fmt::format("HYBRID_SHARD needs the same number of ranks on every node: "
                                 "this rank's node has {}, others between {} and {}",
                                 shard_comm_->size(), low[0], high[0]));
    }
  }
}

FullyShardedDataParallel::~FullyShardedDataParallel() {
  for (auto& unit : units_) {
    if (unit->gathering) unit->gathering->wait();
    if (unit->reducing) unit->reducing.reset();  // waits for it
    for (std::size_t i = 0; i < unit->accumulators.size(); ++i) {
      unit->accumulators[i]->del_post_hook(unit->hook_keys[i]);
    }
  }
}

bool FullyShardedDataParallel::is_unit(const ::torch::nn::Module& module) const {
  return std::any_of(units_.begin(), units_.end(),
                     [&](const auto& unit) { return unit->module == &module; });
}

std::vector<std::string> FullyShardedDataParallel::shard_by_size(::torch::nn::Module& root,
                                                                 std::int64_t min_parameters) {
  if (min_parameters < 1) {
    refuse(*comm_, fmt::format("shard_by_size needs min_parameters >= 1, not {}", min_parameters));
  }
  std::set<const c10::TensorImpl*> taken;
  for (const auto& unit : units_) {
    for (const Tensor& p : unit->params) taken.insert(p.unsafeGetTensorImpl());
  }
  auto untaken = [&](const ::torch::nn::Module& module) {
    std::int64_t count = 0;
    for (const Tensor& p : module.parameters()) {
      if (taken.count(p.unsafeGetTensorImpl()) == 0) count += p.numel();
    }
    return count;
  };
  std::vector<std::string> made;
  // Children first: a block becomes a unit before the stack that holds it is weighed.
  auto visit = [&](auto& self, ::torch::nn::Module& module, const std::string& path) -> void {
    for (const auto& item : module.named_children()) {
      self(self, *item.value(), path.empty() ? item.key() : path + "." + item.key());
    }
    if (&module == &root || untaken(module) < min_parameters) return;
    shard(module, path);
    for (const Tensor& p : units_.back()->params) taken.insert(p.unsafeGetTensorImpl());
    made.push_back(path);
  };
  visit(visit, root, "");
  if (untaken(root) > 0) {
    shard(root, "root");
    made.emplace_back("root");
  }
  return made;
}

void FullyShardedDataParallel::shard(::torch::nn::Module& module, std::string name) {
  auto unit = std::make_unique<Unit>();
  unit->module = &module;
  unit->name = name.empty() ? module.name() : std::move(name);
  unit->gather_mark = trace::intern(fmt::format("fsdp.gather {}", unit->name));
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
  const int ranks = shard_comm_->size();
  unit->padded = (unit->total + ranks - 1) / ranks * ranks;
  const bool sharded = options_.strategy != ShardingStrategy::no_shard;
  unit->shard_size = sharded ? unit->padded / ranks : unit->padded;
  // Rank 0's values everywhere, flattened, in the parameters' dtype: the master copy.
  Tensor master =
      ::torch::zeros({unit->padded}, unit->params.front().options().requires_grad(false));
  {
    ::torch::NoGradGuard no_grad;
    for (std::size_t i = 0; i < unit->params.size(); ++i) {
      master.narrow(0, unit->offsets[i], unit->params[i].numel())
          .copy_(unit->params[i].detach().reshape({-1}));
    }
  }
  comm_->launch(comm_->broadcast(as_buffer(master), 0)).get();
  unit->shard =
      (sharded ? master.narrow(0, unit->shard_size * shard_comm_->rank(), unit->shard_size)
               : master)
          .clone();
  unit->shard.set_requires_grad(true);
  const auto compute_dtype =
      options_.mixed_precision ? options_.mixed_precision->param_dtype : dtype;
  unit->full = master.to(compute_dtype).clone();
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
  if (options_.strategy != ShardingStrategy::no_shard) release(*units_.back());
}

void FullyShardedDataParallel::start_gather(std::size_t index) {
  Unit& unit = *units_[index];
  if (unit.gathered || unit.gathering) return;
  // A mark on the calling thread where each gather starts, so the trace shows which unit a
  // prefetch fetched while which one computed.
  trace::instant(trace::Category::user, *unit.gather_mark);
  detail::allocate_bytes(unit.full);
  unit.gathering_input = unit.shard.detach().to(unit.full.scalar_type());
  if (options_.strategy == ShardingStrategy::no_shard) {
    unit.full.copy_(unit.gathering_input);
    unit.gathering.emplace();  // nothing in flight: an empty future reads as done
  } else {
    unit.gathering = shard_comm_->launch(
        shard_comm_->all_gather(as_buffer(unit.gathering_input), as_buffer(unit.full)));
  }
  count_gathered();
}

void FullyShardedDataParallel::gather(std::size_t index) {
  Unit& unit = *units_[index];
  // NO_SHARD stays gathered, and copies the optimizer's latest values in each forward.
  if (unit.gathered && options_.strategy == ShardingStrategy::no_shard &&
      unit.pending_backwards == 0) {
    unit.gathered = false;
  }
  if (unit.gathered) return;
  start_gather(index);
  if (unit.gathering->valid()) unit.gathering->get();
  unit.gathering.reset();
  unit.gathering_input = Tensor();
  unit.point_parameters_at_full();
  unit.gathered = true;
}

void FullyShardedDataParallel::prefetch_after(std::size_t index, bool backward) {
  const std::vector<std::size_t>& order = backward ? backward_order_ : order_;
  if (options_.prefetch == 0 || (backward ? recording_backward_order_ : recording_order_)) return;
  const auto at = std::find(order.begin(), order.end(), index);
  if (at == order.end()) return;
  for (auto next = at + 1; next != order.end() && next - at <= options_.prefetch; ++next) {
    start_gather(*next);
  }
}

void FullyShardedDataParallel::release(Unit& unit) {
  if (options_.strategy == ShardingStrategy::no_shard) return;
  if (unit.gathering) {
    if (unit.gathering->valid()) unit.gathering->wait();
    unit.gathering.reset();
    unit.gathering_input = Tensor();
  } else if (!unit.gathered) {
    return;
  }
  for (Tensor& p : unit.params) p.set_data(::torch::empty({0}, unit.full.options()));
  detail::release_bytes(unit.full);
  unit.gathered = false;
  count_gathered();
}

void FullyShardedDataParallel::count_gathered() {
  std::int64_t gathered = 0;
  for (const auto& unit : units_) gathered += unit->gathered || unit->gathering ? 1 : 0;
  trace::counter(trace::Category::user, "fsdp gathered units", gathered);
}

std::size_t FullyShardedDataParallel::before_forward(const ::torch::nn::Module& module) {
  std::lock_guard lock(mutex_);
  for (std::size_t u = 0; u < units_.size(); ++u) {
    if (units_[u]->module != &module) continue;
    if (recording_order_) {
      if (std::find(order_.begin(), order_.end(), u) != order_.end()) {
        recording_order_ = false;  // a unit ran again: the first step is over
      } else {
        order_.push_back(u);
      }
    }
    // The enclosing unit's compute pauses while this one gathers and runs.
    if (!forward_spans_.empty()) forward_spans_.back().end();
    gather(u);
    prefetch_after(u, /*backward=*/false);
    forward_spans_.emplace_back(trace::Name("fsdp.forward"));
    forward_spans_.back().arg("unit", static_cast<std::int64_t>(u));
    return u;
  }
  refuse(*comm_, fmt::format("run() of {}, which is not a unit: shard() it first", module.name()));
}

void FullyShardedDataParallel::abandon_forward(std::size_t running) {
  std::lock_guard lock(mutex_);
  // The running unit's forward ends here, with no backward to come: its span (the enclosing
  // unit's resumes), and its gathered storage (the strategies that keep parameters
  // gathered gather them again).
  if (!forward_spans_.empty()) forward_spans_.pop_back();
  if (!forward_spans_.empty())
    forward_spans_.back() = trace::ComputeSpan(trace::Name("fsdp.forward"));
  release(*units_[running]);
}

void FullyShardedDataParallel::refuse_sharded_use(std::size_t running, const c10::Error& error) {
  // The error an inner run() rethrew as it was: an enclosing run() passes it on untouched,
  // though the inner unit, released by then, now reads as sharded.
  thread_local const c10::Error* passed_on = nullptr;
  std::vector<std::string> sharded;
  if (&error != passed_on) {
    std::lock_guard lock(mutex_);
    for (std::size_t u = 0; u < units_.size(); ++u) {
      const Unit& unit = *units_[u];
      if (u != running && !unit.gathered && !unit.gathering) {
        sharded.push_back("'" + unit.name + "'");
      }
    }
  }
  abandon_forward(running);
  if (sharded.empty()) {
    passed_on = &error;
    throw;
  }
  refuse(*comm_,
         fmt::format("libtorch failed inside run() of unit '{}' while {} {} sharded. If this "
                     "forward calls a sharded unit's module directly rather than through "
                     "fsdp.run(unit, ...), it meets that unit's empty parameters (shape [0]) and "
                     "fails so. libtorch: {}",
                     units_[running]->name, fmt::join(sharded, ", "),
                     sharded.size() == 1 ? "was" : "were", error.what_without_backtrace()));
}

void FullyShardedDataParallel::after_forward(std::size_t index,
                                             const std::vector<at::Tensor>& outputs) {
  std::lock_guard lock(mutex_);
  Unit& unit = *units_[index];
  if (!forward_spans_.empty()) forward_spans_.pop_back();  // ends this unit's span
  if (!forward_spans_.empty()) {
    forward_spans_.back() = trace::ComputeSpan(trace::Name("fsdp.forward"));  // resumes
  }
  if (!::torch::autograd::GradMode::is_enabled()) {
    release(unit);
    return;
  }
  ++unit.pending_backwards;
  if (options_.strategy == ShardingStrategy::full_shard ||
      options_.strategy == ShardingStrategy::hybrid_shard) {
    release(unit);
  }
  // Gathered again before the unit's backward: the first gradient of one of its outputs.
  for (const at::Tensor& output : outputs) {
    if (!output.defined() || !output.requires_grad()) continue;
    output.register_hook([this, index](const at::Tensor&) {
      std::lock_guard lock(mutex_);
      if (units_[index]->pending_backwards == 0) return;
      if (recording_backward_order_ && std::find(backward_order_.begin(), backward_order_.end(),
                                                 index) == backward_order_.end()) {
        backward_order_.push_back(index);
      }
      gather(index);
      prefetch_after(index, /*backward=*/true);
      backward_spans_[index] = trace::ComputeSpan(trace::Name("fsdp.backward"));
      backward_spans_[index].arg("unit", static_cast<std::int64_t>(index));
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
  backward_spans_.erase(index);  // the unit's backward is done
  // Reductions that have finished give their flattened gradients back now, so backward
  // holds those of the reductions in flight, not every unit's until its end. (Not under
  // HYBRID_SHARD: its second reduction is a collective every rank must call in one order.)
  if (!replicate_comm_) {
    for (auto& other : units_) {
      if (other->reducing && other->reducing->ready()) finish_reduction(*other);
    }
  }
  // Every gradient of the unit is in: flatten, then reduce (scatter) while backward goes on.
  ::torch::NoGradGuard no_grad;
  const auto reduce_dtype =
      options_.mixed_precision ? options_.mixed_precision->reduce_dtype : unit.shard.scalar_type();
  Tensor flat = unit.accumulated.defined()
                    ? unit.accumulated.to(reduce_dtype)
                    : ::torch::zeros({unit.padded}, unit.shard.options().dtype(reduce_dtype));
  for (std::size_t i = 0; i < unit.params.size(); ++i) {
    Tensor& grad = unit.params[i].mutable_grad();
    if (grad.defined()) flat.narrow(0, unit.offsets[i], grad.numel()).add_(grad.reshape({-1}));
    grad = Tensor();
  }
  unit.ready = 0;
  unit.pending_backwards = std::max(unit.pending_backwards - 1, 0);
  if (!sync_) {
    unit.accumulated = flat.to(unit.shard.scalar_type());  // unsharded, until a synced step
  } else {
    unit.accumulated = Tensor();
    unit.reducing.emplace(options_.strategy == ShardingStrategy::no_shard
                              ? detail::start_reduce_over_ranks(*shard_comm_, flat)
                              : detail::start_reduce_scatter_first_dim(*shard_comm_, flat));
  }
  // SHARD_GRAD_OP keeps the unit gathered while forwards still wait for their backward (a
  // pipeline's microbatches).
  if (options_.strategy != ShardingStrategy::shard_grad_op || unit.pending_backwards == 0) {
    release(unit);
  }
}

void FullyShardedDataParallel::finish_reduction(Unit& unit) {
  Tensor summed = unit.reducing->result();
  unit.reducing.reset();  // frees the flattened gradients it read
  if (replicate_comm_ && replicate_comm_->size() > 1) {
    summed = detail::reduce_over_ranks(*replicate_comm_, summed);
  }
  summed = summed.to(unit.shard.scalar_type()).div_(comm_->size());
  Tensor& grad = unit.shard.mutable_grad();
  if (grad.defined()) {
    grad.add_(summed);
  } else {
    grad = summed;
  }
}

void FullyShardedDataParallel::end_of_backward() {
  std::lock_guard lock(mutex_);
  callback_queued_ = false;
  recording_order_ = false;
  recording_backward_order_ = false;
  for (auto& unit : units_) {
    if (unit->ready != 0) {
      refuse(*comm_, fmt::format("backward ended before every parameter of {} had a gradient "
                                 "(a parameter the forward did not use)",
                                 unit->name));
    }
    if (unit->pending_backwards == 0) release(*unit);
    if (unit->reducing) finish_reduction(*unit);  // else not in this backward, or accumulated
  }
}

void FullyShardedDataParallel::set_gradient_sync(bool sync) {
  sync_ = sync;
}

double FullyShardedDataParallel::clip_grad_norm(double max_norm) {
  double squares = 0;
  for (const auto& unit : units_) {
    if (unit->shard.grad().defined()) {
      squares += unit->shard.grad().to(::torch::kDouble).square().sum().item<double>();
    }
  }
  // Each shard counts once over the ranks that shard it (NO_SHARD: every rank holds it all).
  if (options_.strategy != ShardingStrategy::no_shard && shard_comm_->size() > 1) {
    std::vector<double> total{squares};
    shard_comm_->launch(shard_comm_->all_reduce(Buffer(total), ReduceOp::sum)).get();
    squares = total[0];
  }
  const double norm = std::sqrt(squares);
  const double scale = max_norm / (norm + 1e-6);
  if (scale < 1) {
    for (const auto& unit : units_) {
      if (unit->shard.grad().defined()) unit->shard.mutable_grad().mul_(scale);
    }
  }
  return norm;
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

std::vector<std::string> FullyShardedDataParallel::forward_order() const {
  std::vector<std::string> names;
  for (const std::size_t u : order_) names.push_back(units_[u]->name);
  return names;
}

}  // namespace braid::torch
