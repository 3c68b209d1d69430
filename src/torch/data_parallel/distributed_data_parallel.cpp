#include <array>
#include <unordered_set>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/utils/lambda_post_hook.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/torch.h>

#include <braid/build_config.hpp>
#include <braid/core/error.hpp>
#include <braid/core/fault_points.hpp>
#include <braid/core/log.hpp>
#include <braid/torch/data_parallel/distributed_data_parallel.hpp>
#include <braid/torch/data_parallel/sync_batch_norm.hpp>
#include <braid/torch/tensor_buffer.hpp>
#include <braid/transport/world.hpp>

#include "torch/cuda_current_stream.hpp"
#include "torch/data_parallel/data_parallel_core.hpp"
#if BRAID_WITH_CUDA
#include <braid/collectives/nccl_communicator.hpp>
#endif

namespace braid::torch::detail {
namespace {

using collectives::Communicator;

[[noreturn]] void refuse(const Communicator& comm, std::string what) {
  throw Error(Errc::invalid_argument, std::move(what),
              {.rank = comm.world_rank(comm.rank()), .operation = "DistributedDataParallel"});
}

// A model's shape as numbers, for comparing ranks: per parameter its dtype, rank and
// sizes, then a hash of its name.
std::vector<std::int64_t> signature(const std::vector<at::Tensor>& parameters,
                                    const std::vector<std::string>& names) {
  std::vector<std::int64_t> out{static_cast<std::int64_t>(parameters.size())};
  for (std::size_t i = 0; i < parameters.size(); ++i) {
    out.push_back(static_cast<std::int64_t>(parameters[i].scalar_type()) +
                  (parameters[i].is_cuda() ? 1000 : 0));  // CUDA and CPU ranks differ here
    out.push_back(parameters[i].dim());
    for (const std::int64_t size : parameters[i].sizes()) out.push_back(size);
    out.push_back(static_cast<std::int64_t>(std::hash<std::string>{}(names[i]) >> 1));
  }
  return out;
}

}  // namespace

DataParallelCore::DataParallelCore(::torch::nn::Module& module,
                                   std::shared_ptr<collectives::Communicator> comm,
                                   DistributedDataParallelOptions options)
    : module_(module), comm_(std::move(comm)), options_(options) {
  std::vector<dp::ParameterSpec> specs;
  for (const auto& item : module_.named_parameters(/*recurse=*/true)) {
    const at::Tensor& p = item.value();
    if (!p.requires_grad()) continue;
    const auto dtype = dtype_of(p.scalar_type());
    if (!p.is_contiguous() || !(p.device().is_cpu() || p.is_cuda()) || !dtype) {
      refuse(*comm_, fmt::format("parameter '{}' must be a contiguous CPU or CUDA tensor of a "
                                 "floating type; it is {} on {}",
                                 item.key(), c10::toString(p.scalar_type()), p.device().str()));
    }
    parameters_.push_back(p);
    names_.push_back(item.key());
    specs.push_back(dp::ParameterSpec{.name = item.key(),
                                      .count = static_cast<std::size_t>(p.numel()),
                                      .dtype = *dtype,
                                      .memory = p.is_cuda() ? MemoryKind::cuda : MemoryKind::host,
                                      .device = p.is_cuda() ? static_cast<int>(p.get_device()) : 0,
                                      .shape = p.sizes().vec()});
  }
  check_same_model();
  check_same_options();
  // CUDA parameters (all on one device: the reducer refuses a mix, naming it): buckets in
  // that device's memory, fed from libtorch's current stream, and NCCL where each rank has
  // a device of its own.
  std::shared_ptr<dp::BucketDevice> device;
  if (!specs.empty() && specs.front().memory == MemoryKind::cuda) {
    device = libtorch_bucket_device(specs.front().device);
    route_cuda(specs.front().device);
  }
  std::vector<at::Tensor> state = parameters_;
  for (const auto& buffer : module_.buffers(/*recurse=*/true)) state.push_back(buffer);
  broadcast_from_rank0(state);
  reducer_ = std::make_unique<dp::Reducer>(
      comm_, std::move(specs), *this,
      dp::ReducerOptions{.limits = options_.limits,
                         .rebuild_buckets = options_.rebuild_buckets,
                         .gradient_as_bucket_view = options_.gradient_as_bucket_view,
                         .shared_buckets = options_.shared_buckets,
                         .device = std::move(device)});
  for (std::size_t i = 0; i < parameters_.size(); ++i) {
    auto accumulator = ::torch::autograd::impl::grad_accumulator(parameters_[i]);
    hook_keys_.push_back(
        accumulator->add_post_hook(std::make_unique<::torch::autograd::utils::LambdaPostHook>(
            [this, i](const ::torch::autograd::variable_list& outputs,
                      const ::torch::autograd::variable_list&) {
              on_gradient(i);
              return outputs;
            })));
    accumulators_.push_back(std::move(accumulator));
  }
}

DataParallelCore::~DataParallelCore() {
  for (std::size_t i = 0; i < accumulators_.size(); ++i) {
    accumulators_[i]->del_post_hook(hook_keys_[i]);
  }
}

void DataParallelCore::check_same_model() {
  const std::vector<std::int64_t> mine = signature(parameters_, names_);
  std::vector<std::int64_t> length{static_cast<std::int64_t>(mine.size())};
  comm_->launch(comm_->broadcast(Buffer(length), 0)).get();
  std::vector<std::int64_t> reference(static_cast<std::size_t>(length[0]));
  if (comm_->rank() == 0) reference = mine;
  comm_->launch(comm_->broadcast(Buffer(reference), 0)).get();
  std::string difference;
  if (reference != mine) {
    if (reference.empty() || reference[0] != mine[0]) {
      difference = fmt::format("it has {} parameters requiring gradients, rank 0 has {}", mine[0],
                               reference.empty() ? 0 : reference[0]);
    } else {
      // Walk both signatures to the first parameter that differs.
      std::size_t a = 1;
      std::size_t b = 1;
      for (std::size_t i = 0; i < parameters_.size(); ++i) {
        const std::size_t width_a = 3 + static_cast<std::size_t>(mine[a + 1]);
        const std::size_t width_b =
            b + 1 < reference.size() ? 3 + static_cast<std::size_t>(reference[b + 1]) : 0;
        if (width_b == 0 || !std::equal(mine.begin() + a, mine.begin() + a + width_a,
                                        reference.begin() + b, reference.begin() + b + width_b)) {
          std::vector<std::int64_t> theirs;
          if (width_b >= 3)
            theirs.assign(reference.begin() + b + 2, reference.begin() + b + width_b - 1);
          const bool their_cuda = width_b >= 3 && reference[b] >= 1000;
          difference = fmt::format(
              "parameter {} '{}' is {} [{}] on {}; rank 0's parameter {} is {} [{}] on {} "
              "(or named differently)",
              i, names_[i], c10::toString(parameters_[i].scalar_type()),
              fmt::join(parameters_[i].sizes(), ", "),
              parameters_[i].is_cuda() ? "CUDA" : "the CPU", i,
              width_b >= 3 ? c10::toString(static_cast<c10::ScalarType>(reference[b] % 1000)) : "?",
              fmt::join(theirs, ", "), their_cuda ? "CUDA" : "the CPU");
          break;
        }
        a += width_a;
        b += width_b;
      }
    }
  }
  std::vector<std::int32_t> differs{difference.empty() ? 0 : 1};
  std::vector<std::int32_t> any(1, 0);
  comm_->launch(comm_->all_reduce(Buffer(differs), Buffer(any), ReduceOp::max)).get();
  if (!difference.empty()) {
    refuse(*comm_, "this rank's model differs from rank 0's: " + difference);
  }
  if (any[0] != 0) {
    refuse(*comm_,
           "another rank's model differs from rank 0's (that rank's error names the "
           "parameter)");
  }
}

void DataParallelCore::route_cuda(int device) {
#if BRAID_WITH_CUDA
  if (comm_->cuda_route() != nullptr) return;  // the caller chose (on every rank, as it must)
  // Every rank's (node, device): NCCL needs a device per rank; ranks that share one (two
  // processes on a one-GPU machine) stage through host memory over UCX instead. Every
  // rank reads the same table, so all make the same choice.
  transport::World& world = comm_->world();
  std::vector<std::int64_t> mine{world.node_of(comm_->world_rank(comm_->rank())), device};
  std::vector<std::int64_t> all(mine.size() * static_cast<std::size_t>(comm_->size()));
  comm_->launch(comm_->all_gather(Buffer(mine), Buffer(all))).get();
  for (int a = 0; a < comm_->size(); ++a) {
    for (int b = a + 1; b < comm_->size(); ++b) {
      const auto i = static_cast<std::size_t>(2 * a);
      const auto j = static_cast<std::size_t>(2 * b);
      if (all[i] == all[j] && all[i + 1] == all[j + 1]) {
        if (comm_->rank() == 0) {
          log::info(
              "ddp: ranks {} and {} share CUDA device {} on node {}: gradients are staged "
              "through host memory and carried by UCX, not NCCL (NCCL needs a device per "
              "rank)",
              comm_->world_rank(a), comm_->world_rank(b), all[i + 1], all[i]);
        }
        return;
      }
    }
  }
  comm_->route_cuda_to(comm_->launch(collectives::NcclCommunicator::create(*comm_, device)).get());
  log::debug("ddp: CUDA gradients on device {} travel on NCCL", device);
#else
  (void)device;
#endif
}

void DataParallelCore::check_same_options() {
  if (comm_->size() == 1) return;
  struct Named {
    const char* name;
    std::int64_t value;
  };
  const DistributedDataParallelOptions& o = options_;
  const std::array options{
      Named{"limits.first_bucket_bytes", static_cast<std::int64_t>(o.limits.first_bucket_bytes)},
      Named{"limits.bucket_cap_bytes", static_cast<std::int64_t>(o.limits.bucket_cap_bytes)},
      Named{"broadcast_buffers", o.broadcast_buffers},
      Named{"find_unused_parameters", o.find_unused_parameters},
      Named{"rebuild_buckets", o.rebuild_buckets},
      Named{"gradient_as_bucket_view", o.gradient_as_bucket_view},
      Named{"shared_buckets", o.shared_buckets},
      Named{"static_graph", o.static_graph}};
  std::vector<std::int64_t> low, high;
  for (const Named& option : options) low.push_back(option.value);
  high = low;
  comm_->launch(comm_->all_reduce(Buffer(low), ReduceOp::min)).get();
  comm_->launch(comm_->all_reduce(Buffer(high), ReduceOp::max)).get();
  std::vector<std::string> differing;
  for (std::size_t i = 0; i < options.size(); ++i) {
    if (low[i] != high[i]) {
      differing.push_back(fmt::format("{} is {} here, between {} and {} across the ranks",
                                      options[i].name, options[i].value, low[i], high[i]));
    }
  }
  if (!differing.empty()) {
    refuse(*comm_, fmt::format("the ranks' DistributedDataParallelOptions differ: {}",
                               fmt::join(differing, "; ")));
  }
}

void DataParallelCore::broadcast_from_rank0(const std::vector<at::Tensor>& tensors) {
  broadcast_from(tensors, 0);
}

void DataParallelCore::broadcast_from(const std::vector<at::Tensor>& tensors, int root) {
  if (comm_->size() == 1) return;
  std::vector<Future<void>> pending;
  for (const at::Tensor& tensor : tensors) {
    if (tensor.numel() == 0) continue;
    pending.push_back(comm_->launch(comm_->broadcast(as_buffer(tensor.detach()), root)));
  }
  for (auto& future : pending) future.get();
}

void DataParallelCore::broadcast_buffers_from(int root) {
  if (!options_.broadcast_buffers) return;
  std::vector<at::Tensor> buffers;
  for (const auto& buffer : module_.buffers(/*recurse=*/true)) buffers.push_back(buffer);
  broadcast_from(buffers, root);
}

void DataParallelCore::before_forward() {
  fault_point(FaultPoint::forward);
  const bool sync = ::torch::autograd::GradMode::is_enabled() && require_sync_;
  if (sync) {
    try {
      reducer_->check_previous_finished();
    } catch (const Error&) {
      // With uneven inputs a joined rank shadows the iteration this rank left unfinished,
      // in collectives nobody else will call: the refusal still makes this forward's notice
      // call, against which the joined rank's differs, so that it fails now instead of at
      // the deadline.
      if (uneven_inputs_) {
        try {
          (void)exchange_notice(/*active=*/true, sync, /*shadowed=*/false);
        } catch (const Error&) {
          // Our own error says more about us than the exchange's.
        }
      }
      throw;
    }
  }
  int buffers_from = 0;
  if (uneven_inputs_) {
    buffers_from = exchange_notice(/*active=*/true, sync, /*shadowed=*/false).first_active;
  }
  broadcast_buffers_from(buffers_from);
  std::lock_guard lock(span_mutex_);
  forward_span_.emplace(trace::Name("forward"));
}

void DataParallelCore::after_forward(const std::vector<at::Tensor>& outputs) {
  {
    std::lock_guard lock(span_mutex_);
    forward_span_.reset();
  }
  if (!::torch::autograd::GradMode::is_enabled()) return;
  std::optional<std::vector<std::size_t>> unused;
  if (options_.find_unused_parameters && require_sync_) {
    if (options_.static_graph && static_unused_) {
      unused = static_unused_;
    } else {
      unused = unused_parameters(outputs);
      if (options_.static_graph) static_unused_ = unused;
    }
  }
  reducer_->prepare_for_backward(require_sync_, std::move(unused));
  callback_queued_ = false;
  backward_started_ = false;
  // The gradient of an output is the first thing backward computes that is ours: the
  // backward compute span starts there.
  for (const at::Tensor& output : outputs) {
    if (!output.defined() || !output.requires_grad()) continue;
    output.register_hook([this](const at::Tensor&) {
      if (backward_started_.exchange(true)) return;
      std::lock_guard lock(span_mutex_);
      backward_span_.emplace(trace::Name("backward"));
    });
  }
}

void DataParallelCore::prepare_for_backward(bool sync) {
  if (options_.find_unused_parameters || uneven_inputs_) {
    refuse(*comm_,
           "prepare_for_backward() with find_unused_parameters or uneven inputs: a pipeline's "
           "backwards cannot be matched to the forwards those need");
  }
  reducer_->prepare_for_backward(sync, std::nullopt);
  callback_queued_ = false;
}

void DataParallelCore::allow_uneven_inputs() {
  reducer_->check_previous_finished();
  // A joined rank shadows DDP's own collectives only: a SyncBatchNorm's all-reduces on the
  // ranks still training would wait for it until the timeout.
  for (const auto& module : module_.modules()) {
    if (dynamic_cast<const SyncBatchNormImpl*>(module.get()) != nullptr) {
      throw Error(Errc::invalid_argument,
                  "allow_uneven_inputs() with a SyncBatchNorm in the model: a rank that has "
                  "joined cannot take part in its statistics (PyTorch's join() does not "
                  "support SyncBatchNorm either); give every rank the same number of batches",
                  {.rank = comm_->world_rank(comm_->rank()), .operation = "ddp"});
    }
  }
  uneven_inputs_ = true;
}

DataParallelCore::Notice DataParallelCore::exchange_notice(bool active, bool sync, bool shadowed) {
  // Under max, each as size - rank so that it names the lowest such rank (0: none): the
  // lowest active rank, the lowest active rank that synchronises, the lowest that does
  // not; and whether any joined rank has shadowed.
  const int size = comm_->size();
  const std::int64_t me = size - comm_->rank();
  std::vector<std::int64_t> said{active ? me : 0, active && sync ? me : 0, active && !sync ? me : 0,
                                 !active && shadowed ? 1 : 0};
  comm_->launch(comm_->all_reduce(Buffer(said), ReduceOp::max)).get();
  if (said[1] != 0 && said[2] != 0) {
    refuse(*comm_, fmt::format("with uneven inputs, the ranks still training disagree on "
                               "whether this iteration synchronises gradients: rank {} does, "
                               "rank {} runs its forward under no_sync() or without grad mode",
                               size - said[1], size - said[2]));
  }
  Notice notice{.first_active = said[0] == 0 ? -1 : size - static_cast<int>(said[0]),
                .sync = said[1] != 0,
                .shadowed = said[3] != 0};
  if (notice.first_active >= 0) last_first_active_ = notice.first_active;
  return notice;
}

DataParallelJoined DataParallelCore::join() {
  if (!uneven_inputs_) {
    refuse(*comm_,
           "join() without allow_uneven_inputs(): every rank calls allow_uneven_inputs() before "
           "its training loop, so that each forward tells the joined ranks what to shadow");
  }
  reducer_->check_previous_finished();
  trace::Span span(trace::Category::bucket, trace::Name("ddp.join"));
  DataParallelJoined joined;
  for (;;) {
    const Notice notice =
        exchange_notice(/*active=*/false, /*sync=*/false, joined.shadowed_forwards > 0);
    if (notice.first_active < 0) {
      uneven_inputs_ = false;
      if (!notice.shadowed) return joined;  // every rank ran the same iterations
      joined.parameters_from = last_first_active_;
      std::vector<at::Tensor> state = parameters_;
      for (const auto& buffer : module_.buffers(/*recurse=*/true)) state.push_back(buffer);
      broadcast_from(state, joined.parameters_from);
      return joined;
    }
    broadcast_buffers_from(notice.first_active);
    if (notice.sync) reducer_->shadow_iteration(options_.find_unused_parameters);
    ++joined.shadowed_forwards;
  }
}

std::vector<std::size_t> DataParallelCore::unused_parameters(
    const std::vector<at::Tensor>& outputs) const {
  std::unordered_set<const ::torch::autograd::Node*> seen;
  std::vector<const ::torch::autograd::Node*> stack;
  for (const at::Tensor& output : outputs) {
    if (!output.defined()) continue;
    if (const auto& fn = output.grad_fn()) stack.push_back(fn.get());
  }
  while (!stack.empty()) {
    const ::torch::autograd::Node* node = stack.back();
    stack.pop_back();
    if (!seen.insert(node).second) continue;
    for (const auto& edge : node->next_edges()) {
      if (edge.function) stack.push_back(edge.function.get());
    }
  }
  std::vector<std::size_t> unused;
  for (std::size_t i = 0; i < accumulators_.size(); ++i) {
    if (seen.count(accumulators_[i].get()) == 0) unused.push_back(i);
  }
  return unused;
}

void DataParallelCore::on_gradient(std::size_t index) {
  if (!callback_queued_.exchange(true)) {
    ::torch::autograd::Engine::get_default_engine().queue_callback([this] { end_of_backward(); });
  }
  reducer_->mark_ready(index);
}

void DataParallelCore::end_of_backward() {
  {
    std::lock_guard lock(span_mutex_);
    backward_span_.reset();
  }
  reducer_->finalize();
}

bool DataParallelCore::bind_gradient(std::size_t index, Buffer slot,
                                     std::shared_ptr<const void> owner) {
  const at::Tensor& p = parameters_[index];
  // A view of bucket memory whose storage holds the bucket: the gradient stays readable
  // after a rebuild or after the wrapper is gone, as PyTorch's bucket views do.
  p.mutable_grad() = ::torch::from_blob(
      slot.data(), p.sizes(), [owner = std::move(owner)](void*) {}, p.options());
  return true;
}

std::optional<Buffer> DataParallelCore::gradient(std::size_t index, bool create) {
  at::Tensor& grad = parameters_[index].mutable_grad();
  if (!grad.defined()) {
    if (!create) return std::nullopt;
    grad = ::torch::zeros_like(parameters_[index]);
  }
  return as_buffer(grad);
}

DataParallelHandle::DataParallelHandle(::torch::nn::Module& module,
                                       std::shared_ptr<collectives::Communicator> comm,
                                       DistributedDataParallelOptions options)
    : core_(std::make_unique<DataParallelCore>(module, std::move(comm), std::move(options))) {}
DataParallelHandle::~DataParallelHandle() = default;
DataParallelHandle::DataParallelHandle(DataParallelHandle&&) noexcept = default;
DataParallelHandle& DataParallelHandle::operator=(DataParallelHandle&&) noexcept = default;

void DataParallelHandle::before_forward() {
  core_->before_forward();
}
void DataParallelHandle::after_forward(const std::vector<at::Tensor>& outputs) {
  core_->after_forward(outputs);
}
void DataParallelHandle::prepare_for_backward(bool sync) {
  core_->prepare_for_backward(sync);
}
void DataParallelHandle::allow_uneven_inputs() {
  core_->allow_uneven_inputs();
}
DataParallelJoined DataParallelHandle::join() {
  return core_->join();
}
dp::Reducer& DataParallelHandle::reducer() noexcept {
  return core_->reducer();
}
std::atomic<bool>& DataParallelHandle::require_sync() noexcept {
  return core_->require_sync();
}

}  // namespace braid::torch::detail
