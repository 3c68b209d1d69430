#include <map>
#include <mutex>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/torch.h>

#include <braid/core/error.hpp>
#include <braid/torch/data_parallel/sync_batch_norm.hpp>

#include "torch/tensor_collectives.hpp"

namespace braid::torch {
namespace {

using collectives::Communicator;

[[noreturn]] void refuse(const Communicator& comm, std::string what) {
  throw Error(Errc::invalid_argument, std::move(what),
              {.rank = comm.world_rank(comm.rank()), .operation = "SyncBatchNorm"});
}

using detail::HeldCommunicator;

::torch::Tensor summed_over_ranks(Communicator& comm, const ::torch::Tensor& tensor) {
  return detail::reduce_over_ranks(comm, tensor);
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

// Per-channel views of a (C) tensor, (1, C, 1, ...), to broadcast against an input of
// `dims` dimensions.
::torch::Tensor per_channel(const ::torch::Tensor& t, std::int64_t dims) {
  std::vector<std::int64_t> shape(static_cast<std::size_t>(dims), 1);
  shape[1] = t.numel();
  return t.reshape(shape);
}

std::vector<std::int64_t> all_but_channels(std::int64_t dims) {
  std::vector<std::int64_t> reduced{0};
  for (std::int64_t d = 2; d < dims; ++d) reduced.push_back(d);
  return reduced;
}

// y = (x - mean) * invstd * weight + bias, with mean and invstd those of the batch over
// every rank, differentiated as PyTorch's SyncBatchNorm is: autograd keeps the input (which
// the layer before holds anyway) and three C-vectors, not the intermediate tensors a
// composition of operators would keep. Backward all-reduces the per-channel sums of dy
// and dy * (x - mean) (2C doubles) where the input needs a gradient:
//   dx = (dy - sum(dy) / N - (x - mean) * invstd^2 * sum(dy * (x - mean)) / N)
//        * invstd * weight
// and gives the affine parameters this rank's share (DDP averages them). `held` is null
// where the statistics are this rank's alone (evaluation without running statistics).
// No double backward, as PyTorch's. Without affine parameters, weight and bias are empty
// tensors (libtorch's Function::apply has failed on undefined inputs).
struct NormaliseWithBatchStatistics : ::torch::autograd::Function<NormaliseWithBatchStatistics> {
  static bool affine(const ::torch::Tensor& weight) { return weight.numel() != 0; }

  // mean and invstd come in computing_dtype(input); the arithmetic runs in it and the
  // result goes back to the input's dtype.
  static ::torch::Tensor forward(::torch::autograd::AutogradContext* ctx,
                                 const ::torch::Tensor& input, const ::torch::Tensor& weight,
                                 const ::torch::Tensor& bias, const ::torch::Tensor& mean,
                                 const ::torch::Tensor& invstd, double count,
                                 c10::intrusive_ptr<HeldCommunicator> held) {
    const std::int64_t dims = input.dim();
    const auto dtype = mean.scalar_type();
    ::torch::Tensor out = (input.to(dtype) - per_channel(mean, dims)) * per_channel(invstd, dims);
    if (affine(weight)) {
      out = out * per_channel(weight.to(dtype), dims) + per_channel(bias.to(dtype), dims);
    }
    ctx->save_for_backward({input, weight, mean, invstd});
    ctx->saved_data["count"] = count;
    if (held) ctx->saved_data["comm"] = c10::IValue::make_capsule(held);
    return out.to(input.scalar_type());
  }

  static ::torch::autograd::variable_list backward(::torch::autograd::AutogradContext* ctx,
                                                   ::torch::autograd::variable_list grads) {
    if (::torch::GradMode::is_enabled()) {
      // backward(create_graph=true): this backward is not itself differentiable.
      throw Error(Errc::invalid_argument,
                  "SyncBatchNorm has no double backward (a backward with create_graph)",
                  {.operation = "SyncBatchNorm"});
    }
    const auto saved = ctx->get_saved_variables();
    const ::torch::Tensor& input = saved[0];
    const ::torch::Tensor& weight = saved[1];
    const ::torch::Tensor& mean = saved[2];
    const ::torch::Tensor& invstd = saved[3];
    const auto dtype = mean.scalar_type();
    const ::torch::Tensor dy = grads[0].to(dtype);
    const std::int64_t dims = input.dim();
    const std::vector<std::int64_t> reduced = all_but_channels(dims);
    const ::torch::Tensor xmu = input.to(dtype) - per_channel(mean, dims);
    // In double: the sums over the batch cancel (dy sums to ~0 under a mean loss).
    const ::torch::Tensor sum_dy = dy.sum(reduced, false, ::torch::kDouble);
    const ::torch::Tensor sum_dy_xmu = (dy * xmu).sum(reduced, false, ::torch::kDouble);
    ::torch::Tensor grad_input, grad_weight, grad_bias;
    if (affine(weight) && ctx->needs_input_grad(1)) {
      grad_weight = (sum_dy_xmu * invstd.to(::torch::kDouble)).to(weight.scalar_type());
    }
    if (affine(weight) && ctx->needs_input_grad(2)) grad_bias = sum_dy.to(weight.scalar_type());
    if (ctx->needs_input_grad(0)) {
      ::torch::Tensor sums = ::torch::cat({sum_dy, sum_dy_xmu});
      if (ctx->saved_data.count("comm") != 0) {
        auto held = c10::static_intrusive_pointer_cast<HeldCommunicator>(
            ctx->saved_data["comm"].toCapsule());
        sums = summed_over_ranks(*held->comm, sums);
      }
      const double count = ctx->saved_data["count"].toDouble();
      const std::int64_t c = mean.numel();
      const ::torch::Tensor mean_dy = (sums.narrow(0, 0, c) / count).to(dtype);
      const ::torch::Tensor mean_dy_xmu = (sums.narrow(0, c, c) / count).to(dtype);
      const ::torch::Tensor scale = affine(weight) ? invstd * weight.to(dtype) : invstd;
      grad_input = ((dy - per_channel(mean_dy, dims) -
                     xmu * per_channel(invstd.square() * mean_dy_xmu, dims)) *
                    per_channel(scale, dims))
                       .to(input.scalar_type());
    }
    return {grad_input,        grad_weight,       grad_bias,        ::torch::Tensor(),
            ::torch::Tensor(), ::torch::Tensor(), ::torch::Tensor()};
  }
};

// What SyncBatchNorm computes in: the input's dtype, but f32 for 16-bit floats, whose
// range cannot hold the per-channel factors (1/sqrt(eps) squared is 1e5), as PyTorch's
// kernels keep them in f32.
::torch::ScalarType computing_dtype(const ::torch::Tensor& input) {
  const auto dtype = input.scalar_type();
  return dtype == ::torch::kHalf || dtype == ::torch::kBFloat16 ? ::torch::kFloat : dtype;
}

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
  const std::int64_t dims = input.dim();
  // Evaluation with running statistics: elementwise, nothing to communicate.
  if (!is_training() && options_.track_running_stats) {
    ::torch::Tensor out = (input - per_channel(running_mean, dims)) *
                          per_channel((running_var + options_.eps).rsqrt(), dims);
    if (options_.affine) out = out * per_channel(weight, dims) + per_channel(bias, dims);
    return out;
  }
  // Batch statistics in training, and in evaluation without running statistics; only
  // training takes them over every rank, as PyTorch's SyncBatchNorm does.
  ::torch::Tensor mean, invstd;
  double n = 0;
  {
    ::torch::NoGradGuard no_grad;  // NormaliseWithBatchStatistics differentiates them
    const std::vector<std::int64_t> reduced = all_but_channels(dims);
    const ::torch::Tensor shift =
        options_.track_running_stats ? per_channel(running_mean.detach(), dims).to(::torch::kDouble)
                                     : per_channel(::torch::zeros({c}, ::torch::kDouble), dims);
    const ::torch::Tensor centred = input.detach().to(::torch::kDouble) - shift;
    const double local_count = static_cast<double>(input.numel() / c);
    ::torch::Tensor local =
        ::torch::cat({centred.sum(reduced), centred.square().sum(reduced),
                      ::torch::full({1}, local_count, ::torch::kDouble),
                      ::torch::zeros({2}, ::torch::kDouble)});  // no refusal (see above)
    const ::torch::Tensor global = is_training() ? summed_over_ranks(*comm_, local) : local;
    refuse_everywhere(global);
    n = global[2 * c].item<double>();
    if (n < 2 && is_training()) {
      refuse(*comm_, fmt::format("training needs more than one value per channel across the "
                                 "ranks; got {}",
                                 n));
    }
    const ::torch::Tensor shifted_mean = global.narrow(0, 0, c) / n;
    // Never below zero: with the shift far from the batch mean (no running statistics, or
    // a small momentum early on) the difference cancels, and rounding could go negative.
    const ::torch::Tensor var = (global.narrow(0, c, c) / n - shifted_mean.square()).clamp_min(0);
    const ::torch::Tensor batch_mean = shifted_mean + shift.reshape({c});
    if (is_training() && options_.track_running_stats) {
      num_batches_tracked.add_(1);
      // Without a momentum, the k-th batch weighs 1/k: the running statistics are the
      // average of every batch's (PyTorch's momentum=None).
      const double m = options_.momentum.value_or(
          1.0 / static_cast<double>(num_batches_tracked.item<int64_t>()));
      running_mean.mul_(1 - m).add_(batch_mean.to(running_mean.dtype()), m);
      running_var.mul_(1 - m).add_((var * (n / (n - 1))).to(running_var.dtype()), m);
    }
    mean = batch_mean.to(computing_dtype(input));
    invstd = (var + options_.eps).rsqrt().to(computing_dtype(input));
  }
  return NormaliseWithBatchStatistics::apply(
      input, options_.affine ? weight : ::torch::empty({0}),
      options_.affine ? bias : ::torch::empty({0}), mean, invstd, n,
      is_training() ? c10::make_intrusive<HeldCommunicator>(comm_)
                    : c10::intrusive_ptr<HeldCommunicator>());
}

}  // namespace braid::torch
