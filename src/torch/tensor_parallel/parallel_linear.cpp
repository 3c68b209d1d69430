#include <cmath>

#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/torch.h>

#include <braid/core/error.hpp>
#include <braid/torch/tensor_parallel/parallel_linear.hpp>
#include <braid/trace/compute_span.hpp>

#include "torch/tensor_collectives.hpp"

namespace braid::torch {
namespace {

using collectives::Communicator;
using ::torch::Tensor;
using ::torch::autograd::AutogradContext;
using ::torch::autograd::variable_list;

[[noreturn]] void refuse(const Communicator& comm, const char* layer, std::string what) {
  throw Error(Errc::invalid_argument, std::move(what),
              {.rank = comm.world_rank(comm.rank()), .operation = layer});
}

// What the product does with the TP group around it.
enum class InputGather : std::int64_t { none, sequence };  // forward: all-gather the input
enum class InputGradReduction : std::int64_t { none, all_reduce, reduce_scatter_sequence };

struct SpanNames {
  trace::Name forward, backward;
};
constexpr SpanNames kColumnSpans{"tp.column_linear.forward", "tp.column_linear.backward"};
constexpr SpanNames kRowSpans{"tp.row_linear.forward", "tp.row_linear.backward"};

// y = x W^T + b over this rank's shard, with the collectives of a column-parallel layer
// folded in: the sequence all-gather of x in forward, and in backward the reduction of
// dx started before dW and db are computed and awaited after them (overlap), or at once.
// Autograd keeps x (gathered, under sequence parallelism: t times this rank's input;
// Megatron-Core gathers it again in backward instead, trading memory for a collective).
struct ShardedLinear : ::torch::autograd::Function<ShardedLinear> {
  static Tensor forward(AutogradContext* ctx, const Tensor& input, const Tensor& weight,
                        const Tensor& bias, std::shared_ptr<Communicator> comm, std::int64_t gather,
                        std::int64_t reduction, bool overlap, bool column) {
    const Tensor total = static_cast<InputGather>(gather) == InputGather::sequence
                             ? detail::gather_first_dim(*comm, input)
                             : input;
    const SpanNames& names = column ? kColumnSpans : kRowSpans;
    trace::ComputeSpan span(names.forward);
    Tensor out = ::torch::matmul(total, weight.t());
    if (bias.numel() != 0) out.add_(bias);
    span.end();
    ctx->save_for_backward({total, weight});
    ctx->saved_data["reduction"] = reduction;
    ctx->saved_data["overlap"] = overlap;
    ctx->saved_data["column"] = column;
    ctx->saved_data["bias"] = bias.numel() != 0;
    detail::save_communicator(ctx, std::move(comm));
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const Tensor& total = saved[0];
    const Tensor& weight = saved[1];
    const auto reduction = static_cast<InputGradReduction>(ctx->saved_data["reduction"].toInt());
    const bool overlap = ctx->saved_data["overlap"].toBool();
    const SpanNames& names = ctx->saved_data["column"].toBool() ? kColumnSpans : kRowSpans;
    auto comm = detail::saved_communicator(ctx);
    const Tensor grad = grads[0];

    trace::ComputeSpan span(names.backward);
    Tensor grad_input;
    std::optional<detail::TensorCollective> reducing;
    if (ctx->needs_input_grad(0)) {
      grad_input = ::torch::matmul(grad, weight);
      if (reduction == InputGradReduction::all_reduce) {
        reducing.emplace(detail::start_reduce_over_ranks(*comm, grad_input));
      } else if (reduction == InputGradReduction::reduce_scatter_sequence) {
        reducing.emplace(detail::start_reduce_scatter_first_dim(*comm, grad_input));
      }
      if (reducing && !overlap) {
        span.end();  // the wait is communication, not compute
        grad_input = reducing->result();
        reducing.reset();
        span = trace::ComputeSpan(names.backward);
      }
    }
    const Tensor grad_2d = grad.reshape({-1, grad.size(-1)});
    Tensor grad_weight, grad_bias;
    if (ctx->needs_input_grad(1)) {
      grad_weight = grad_2d.t().mm(total.reshape({-1, total.size(-1)}));
    }
    if (ctx->saved_data["bias"].toBool() && ctx->needs_input_grad(2)) grad_bias = grad_2d.sum(0);
    span.end();
    if (reducing) grad_input = reducing->result();
    return {grad_input, grad_weight, grad_bias, Tensor(), Tensor(), Tensor(), Tensor(), Tensor()};
  }
};

void check_divides(const Communicator& comm, const char* layer, const char* what,
                   std::int64_t features) {
  if (features < 1 || features % comm.size() != 0) {
    refuse(comm, layer,
           fmt::format("{} {} must be positive and divide by the tensor-parallel degree {}", what,
                       features, comm.size()));
  }
}

void check_last_dim(const Communicator& comm, const char* layer, const Tensor& input,
                    std::int64_t expected, const char* meaning) {
  if (input.dim() < 1 || input.size(-1) != expected) {
    refuse(comm, layer,
           fmt::format("input of shape [{}]: its last dimension must be {} ({})",
                       fmt::join(input.sizes(), ", "), expected, meaning));
  }
}

void check_full_shape(const Communicator& comm, const char* layer, const Tensor& given,
                      std::vector<std::int64_t> expected, const char* what) {
  if (given.sizes().vec() != expected) {
    refuse(comm, layer,
           fmt::format("load_full: the full {} has shape [{}], expected [{}]", what,
                       fmt::join(given.sizes(), ", "), fmt::join(expected, ", ")));
  }
}

Tensor no_bias() {
  return ::torch::empty({0});
}

}  // namespace

std::pair<Tensor, Tensor> initial_linear_parameters(std::int64_t in_features,
                                                    std::int64_t out_features, bool bias,
                                                    std::uint64_t seed) {
  ::torch::NoGradGuard no_grad;
  at::Generator generator = at::detail::createCPUGenerator(seed);
  // libtorch's Linear: kaiming_uniform(a = sqrt(5)) is uniform in +-1/sqrt(in), and so is
  // its bias.
  const double bound = 1.0 / std::sqrt(static_cast<double>(in_features));
  Tensor weight = ::torch::empty({out_features, in_features}).uniform_(-bound, bound, generator);
  Tensor b = bias ? ::torch::empty({out_features}).uniform_(-bound, bound, generator) : Tensor();
  return {weight, b};
}

ColumnParallelLinearImpl::ColumnParallelLinearImpl(tp::TensorParallelGroup tp,
                                                   ColumnParallelLinearOptions options)
    : tp_(std::move(tp)), options_(options) {
  constexpr const char* layer = "ColumnParallelLinear";
  if (options_.in_features < 1) {
    refuse(*tp_, layer, fmt::format("in_features {} must be positive", options_.in_features));
  }
  check_divides(*tp_, layer, "out_features", options_.out_features);
  if (options_.gather_output && options_.sequence_parallel) {
    refuse(*tp_, layer,
           "gather_output and sequence_parallel together: under sequence parallelism the "
           "output stays split across the ranks (a RowParallelLinear follows)");
  }
  reset();
}

void ColumnParallelLinearImpl::reset() {
  auto [full_weight, full_bias] = initial_linear_parameters(
      options_.in_features, options_.out_features, options_.bias, options_.seed);
  weight = register_parameter(
      "weight", detail::slice_for_rank(*tp_, full_weight, 0, "ColumnParallelLinear").clone());
  if (options_.bias) {
    bias = register_parameter(
        "bias", detail::slice_for_rank(*tp_, full_bias, 0, "ColumnParallelLinear").clone());
  }
}

void ColumnParallelLinearImpl::load_full(const Tensor& full_weight, const Tensor& full_bias) {
  constexpr const char* layer = "ColumnParallelLinear";
  ::torch::NoGradGuard no_grad;
  check_full_shape(*tp_, layer, full_weight, {options_.out_features, options_.in_features},
                   "weight");
  weight.copy_(detail::slice_for_rank(*tp_, full_weight, 0, layer));
  if (options_.bias && full_bias.defined()) {
    check_full_shape(*tp_, layer, full_bias, {options_.out_features}, "bias");
    bias.copy_(detail::slice_for_rank(*tp_, full_bias, 0, layer));
  }
}

Tensor ColumnParallelLinearImpl::forward(const Tensor& input) {
  constexpr const char* layer = "ColumnParallelLinear";
  check_last_dim(*tp_, layer, input, options_.in_features, "in_features");
  const bool sp = options_.sequence_parallel && tp_->size() > 1;
  const auto reduction = tp_->size() == 1 ? InputGradReduction::none
                         : sp             ? InputGradReduction::reduce_scatter_sequence
                                          : InputGradReduction::all_reduce;
  Tensor out = ShardedLinear::apply(
      input, weight, options_.bias ? bias : no_bias(), tp_,
      static_cast<std::int64_t>(sp ? InputGather::sequence : InputGather::none),
      static_cast<std::int64_t>(reduction), options_.overlap_grad_reduce, true);
  return options_.gather_output ? tp::gather_from_region(tp_, out) : out;
}

RowParallelLinearImpl::RowParallelLinearImpl(tp::TensorParallelGroup tp,
                                             RowParallelLinearOptions options)
    : tp_(std::move(tp)), options_(options) {
  constexpr const char* layer = "RowParallelLinear";
  check_divides(*tp_, layer, "in_features", options_.in_features);
  if (options_.out_features < 1) {
    refuse(*tp_, layer, fmt::format("out_features {} must be positive", options_.out_features));
  }
  if (options_.sequence_parallel && !options_.input_is_parallel) {
    refuse(*tp_, layer,
           "sequence_parallel needs input_is_parallel: the input of a row-parallel layer under "
           "sequence parallelism is a column-parallel layer's output");
  }
  reset();
}

void RowParallelLinearImpl::reset() {
  auto [full_weight, full_bias] = initial_linear_parameters(
      options_.in_features, options_.out_features, options_.bias, options_.seed);
  weight = register_parameter(
      "weight", detail::slice_for_rank(*tp_, full_weight, 1, "RowParallelLinear").clone());
  if (options_.bias) bias = register_parameter("bias", full_bias);
}

void RowParallelLinearImpl::load_full(const Tensor& full_weight, const Tensor& full_bias) {
  constexpr const char* layer = "RowParallelLinear";
  ::torch::NoGradGuard no_grad;
  check_full_shape(*tp_, layer, full_weight, {options_.out_features, options_.in_features},
                   "weight");
  weight.copy_(detail::slice_for_rank(*tp_, full_weight, 1, layer));
  if (options_.bias && full_bias.defined()) {
    check_full_shape(*tp_, layer, full_bias, {options_.out_features}, "bias");
    bias.copy_(full_bias);
  }
}

std::vector<Tensor> RowParallelLinearImpl::sequence_parallel_parameters() const {
  if (options_.sequence_parallel && options_.bias && tp_->size() > 1) return {bias};
  return {};
}

Tensor RowParallelLinearImpl::forward(const Tensor& input) {
  constexpr const char* layer = "RowParallelLinear";
  const std::int64_t shard = options_.in_features / tp_->size();
  Tensor input_parallel;
  if (options_.input_is_parallel) {
    check_last_dim(*tp_, layer, input, shard, "in_features / the tensor-parallel degree");
    input_parallel = input;
  } else {
    check_last_dim(*tp_, layer, input, options_.in_features, "in_features");
    input_parallel = tp::scatter_to_region(tp_, input);
  }
  const Tensor partial = ShardedLinear::apply(
      input_parallel, weight, no_bias(), tp_, static_cast<std::int64_t>(InputGather::none),
      static_cast<std::int64_t>(InputGradReduction::none), false, false);
  Tensor out = options_.sequence_parallel ? tp::reduce_scatter_to_sequence_region(tp_, partial)
                                          : tp::reduce_from_region(tp_, partial);
  return options_.bias ? out + bias : out;
}

}  // namespace braid::torch
