#include <map>
#include <mutex>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/torch.h>

#include <braid/core/error.hpp>
#include <braid/torch/sync_batch_norm.hpp>
#include <braid/torch/tensor_buffer.hpp>

namespace braid::torch {
namespace {

using collectives::Communicator;

[[noreturn]] void refuse(const Communicator& comm, std::string what) {
  throw Error(Errc::invalid_argument, std::move(what),
              {.rank = comm.world_rank(comm.rank()), .operation = "SyncBatchNorm"});
}

// Keeps the communicator alive in the autograd graph until backward has run, however
// long after the module that made the graph is gone.
struct HeldCommunicator : ::torch::CustomClassHolder {
  explicit HeldCommunicator(std::shared_ptr<Communicator> c) : comm(std::move(c)) {}
  std::shared_ptr<Communicator> comm;
};

::torch::Tensor summed_over_ranks(Communicator& comm, const ::torch::Tensor& tensor) {
  ::torch::Tensor sum = tensor.detach().contiguous().clone();
  comm.launch(comm.all_reduce(as_buffer(sum), ReduceOp::sum)).get();
  return sum;
}

// Every SyncBatchNorm made from one communicator shares one split from it, made by the
// first (a collective: every rank constructs its model's layers in the same order). Why
// not the communicator itself: a collective's place in a communicator's order is fixed
// when it is called, and DDP calls its bucket all-reduces on the runtime thread when a
// bucket launches, while the statistics' backward all-reduce is called on the autograd
// thread, so on one communicator ranks could number the two differently (PyTorch's
// process groups enqueue both from the autograd thread, in one order). Why one for all
// layers: each communicator maps a shared-memory arena of a few MiB.
std::shared_ptr<Communicator> statistics_communicator(const std::shared_ptr<Communicator>& parent) {
  struct Split {
    std::weak_ptr<Communicator> parent;
    std::weak_ptr<Communicator> child;
  };
  static std::mutex mutex;
  static std::map<const Communicator*, Split> splits;
  {
    std::lock_guard lock(mutex);
    const auto found = splits.find(parent.get());
    if (found != splits.end() && found->second.parent.lock() == parent) {
      if (std::shared_ptr<Communicator> child = found->second.child.lock()) return child;
    }
  }
  // Outside the lock: ranks as threads of one process split together.
  std::shared_ptr<Communicator> child = parent->launch(parent->split(0, parent->rank())).get();
  std::lock_guard lock(mutex);
  splits[parent.get()] = Split{.parent = parent, .child = child};
  return child;
}

struct AllReduceSum : ::torch::autograd::Function<AllReduceSum> {
  static ::torch::Tensor forward(::torch::autograd::AutogradContext* ctx,
                                 const ::torch::Tensor& tensor,
                                 c10::intrusive_ptr<HeldCommunicator> held) {
    ctx->saved_data["comm"] = c10::IValue::make_capsule(held);
    return summed_over_ranks(*held->comm, tensor);
  }
  static ::torch::autograd::variable_list backward(::torch::autograd::AutogradContext* ctx,
                                                   ::torch::autograd::variable_list grads) {
    auto held =
        c10::static_intrusive_pointer_cast<HeldCommunicator>(ctx->saved_data["comm"].toCapsule());
    return {summed_over_ranks(*held->comm, grads[0]), ::torch::Tensor()};
  }
};

}  // namespace

::torch::Tensor all_reduce_sum(std::shared_ptr<Communicator> comm, const ::torch::Tensor& tensor) {
  return AllReduceSum::apply(tensor, c10::make_intrusive<HeldCommunicator>(std::move(comm)));
}

SyncBatchNormImpl::SyncBatchNormImpl(std::shared_ptr<Communicator> comm,
                                     SyncBatchNormOptions options)
    : options_(options) {
  if (options_.num_features < 1 || !(options_.eps > 0) ||
      (options_.momentum && !(*options_.momentum >= 0 && *options_.momentum <= 1))) {
    refuse(*comm, fmt::format("num_features {} (>= 1), eps {} (> 0), momentum {} (in [0, 1], or "
                              "none for a cumulative average)",
                              options_.num_features, options_.eps, options_.momentum.value_or(-1)));
  }
  comm_ = statistics_communicator(comm);
  reset();
}

void SyncBatchNormImpl::reset() {
  const std::int64_t c = options_.num_features;
  if (options_.affine) {
    weight = register_parameter("weight", ::torch::ones({c}));
    bias = register_parameter("bias", ::torch::zeros({c}));
  }
  if (options_.track_running_stats) {
    running_mean = register_buffer("running_mean", ::torch::zeros({c}));
    running_var = register_buffer("running_var", ::torch::ones({c}));
    num_batches_tracked =
        register_buffer("num_batches_tracked", ::torch::zeros({}, ::torch::kLong));
  }
}

::torch::Tensor SyncBatchNormImpl::forward(const ::torch::Tensor& input) {
  const std::int64_t c = options_.num_features;
  const bool fits = input.dim() >= 2 && input.size(1) == c;
  const std::string misfit = fits ? std::string()
                                  : fmt::format("input of shape [{}] is not (N, {}[, ...])",
                                                fmt::join(input.sizes(), ", "), c);
  // In training the others are in the all-reduce already: a misfit goes into it (the two
  // numbers after the sums: how many ranks refused, and the sum of their rank + 1), so
  // every rank fails together, naming it, instead of waiting for it until the timeout.
  auto refuse_everywhere = [&](const ::torch::Tensor& global) {
    const double refusals = global[2 * c + 1].item<double>();
    if (refusals == 0) return;
    if (!fits) refuse(*comm_, misfit);
    const auto who = static_cast<int>(global[2 * c + 2].item<double>()) - 1;
    refuse(*comm_, refusals == 1
                       ? fmt::format("rank {} gave its SyncBatchNorm an input that is not "
                                     "(N, {}[, ...])",
                                     who, c)
                       : fmt::format("{} ranks gave their SyncBatchNorm inputs that are not "
                                     "(N, {}[, ...])",
                                     refusals, c));
  };
  if (!fits) {
    if (!is_training()) refuse(*comm_, misfit);
    ::torch::Tensor poison = ::torch::zeros({2 * c + 3}, ::torch::kDouble);
    poison[2 * c + 1] = 1.0;
    poison[2 * c + 2] = static_cast<double>(comm_->rank() + 1);
    refuse_everywhere(summed_over_ranks(*comm_, poison));
  }
  // Per-channel views: (1, C, 1, ...) to broadcast against the input.
  std::vector<std::int64_t> channel_shape(static_cast<std::size_t>(input.dim()), 1);
  channel_shape[1] = c;
  auto per_channel = [&](const ::torch::Tensor& t) { return t.reshape(channel_shape); };
  std::vector<std::int64_t> reduced_dims{0};
  for (std::int64_t d = 2; d < input.dim(); ++d) reduced_dims.push_back(d);

  // Batch statistics in training, and in evaluation without running statistics; only
  // training takes them over every rank, as PyTorch's SyncBatchNorm does.
  const bool batch_statistics = is_training() || !options_.track_running_stats;
  ::torch::Tensor mean, var;
  if (batch_statistics) {
    const ::torch::Tensor shift = options_.track_running_stats
                                      ? per_channel(running_mean.detach()).to(::torch::kDouble)
                                      : ::torch::zeros(channel_shape, ::torch::kDouble);
    const ::torch::Tensor centred = input.to(::torch::kDouble) - shift;
    const double local_count = static_cast<double>(input.numel() / c);
    ::torch::Tensor local =
        ::torch::cat({centred.sum(reduced_dims), centred.square().sum(reduced_dims),
                      ::torch::full({1}, local_count, ::torch::kDouble),
                      ::torch::zeros({2}, ::torch::kDouble)});  // no refusal (see above)
    const ::torch::Tensor global = is_training() ? all_reduce_sum(comm_, local) : local;
    refuse_everywhere(global);
    const ::torch::Tensor count = global.narrow(0, 2 * c, 1).detach();
    if (count.item<double>() < 2 && is_training()) {
      refuse(*comm_, fmt::format("training needs more than one value per channel across the "
                                 "ranks; got {}",
                                 count.item<double>()));
    }
    const ::torch::Tensor shifted_mean = global.narrow(0, 0, c) / count;
    // Never below zero: with the shift far from the batch mean (no running statistics, or
    // a small momentum early on) the difference cancels, and rounding could go negative.
    var = (global.narrow(0, c, c) / count - shifted_mean.square()).clamp_min(0);
    mean = shifted_mean + shift.reshape({c});
    if (is_training() && options_.track_running_stats) {
      ::torch::NoGradGuard no_grad;
      const double n = count.item<double>();
      num_batches_tracked.add_(1);
      // Without a momentum, the k-th batch weighs 1/k: the running statistics are the
      // average of every batch's (PyTorch's momentum=None).
      const double m = options_.momentum.value_or(
          1.0 / static_cast<double>(num_batches_tracked.item<int64_t>()));
      running_mean.mul_(1 - m).add_(mean.detach().to(running_mean.dtype()), m);
      running_var.mul_(1 - m).add_((var.detach() * (n / (n - 1))).to(running_var.dtype()), m);
    }
    mean = mean.to(input.dtype());
    var = var.to(input.dtype());
  } else {
    mean = running_mean;
    var = running_var;
  }
  ::torch::Tensor out = (input - per_channel(mean)) * per_channel((var + options_.eps).rsqrt());
  if (options_.affine) out = out * per_channel(weight) + per_channel(bias);
  return out;
}

}  // namespace braid::torch
