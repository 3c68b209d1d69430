// Tensor-parallel linear layers for libtorch (Megatron-Core's ColumnParallelLinear and
// RowParallelLinear), whose collectives are braid's. A column-parallel layer holds a slice
// of the output features, a row-parallel one a slice of the input features; a
// column-then-row pair (an MLP, attention's projections) needs one all-reduce forward
// and one backward:
//
//   auto tp = co_await grid->group("tp");   // parallel/rank_grid.hpp
//   braid::torch::ColumnParallelLinear fc1(tp, braid::torch::ColumnParallelLinearOptions{
//                                                   .in_features = 512, .out_features = 2048});
//   braid::torch::RowParallelLinear fc2(tp, braid::torch::RowParallelLinearOptions{
//                                                .in_features = 2048, .out_features = 512});
//   auto y = fc2(torch::gelu(fc1(x)));     // x, y: [s, b, 512] on every TP rank
//
// Overlap. ColumnParallelLinear's backward computes the input gradient, starts its
// all-reduce (reduce-scatter under sequence parallelism), computes the weight and bias
// gradients while it runs, and only then waits: the reduction is hidden behind the
// weight-gradient product (Megatron-Core's async tensor-parallel all-reduce). Turn it off
// with overlap_grad_reduce = false to measure what it saves.
//
// Sequence parallelism (sequence_parallel = true): activations outside the TP layers are
// split along the sequence, [s/t, b, h] per rank. ColumnParallelLinear all-gathers its
// input along the sequence (and reduce-scatters the input gradient); RowParallelLinear
// reduce-scatters its output instead of all-reducing it (and all-gathers the gradient).
// The same bytes move as without it, but LayerNorm and dropout between the layers work on
// 1/t of the activations. The row-parallel bias is then a replicated parameter whose
// gradient each rank computes from its part of the sequence: give it (and LayerNorm's) to
// tp::all_reduce_replicated_gradients once per step (sequence_parallel_parameters()).
//
// Initialisation. Each layer makes the full weight from `seed` (libtorch's Linear
// distribution, uniform in +-1/sqrt(in_features), bias likewise) and keeps its rank's
// slice, so a TP model and its one-process twin built with the same seeds start
// identical, whatever the TP degree (Megatron-Core's CPU initialisation). Cost: the full
// weight exists for a moment on every rank. load_full() takes a slice of given weights.
//
// Tracing: each layer's local products are compute spans ("tp.column_linear.forward",
// ".backward", "tp.row_linear..."), its collectives comm spans, so `braid-trace summary`
// shows how much TP communication was hidden.
//
// Errors: features that do not divide by the TP degree, an input whose last dimension is
// not in_features (or its slice), are Error(invalid_argument) naming the rank, the layer
// and the shapes. The collectives' errors are the communicator's (tp_mappings.hpp).
#pragma once

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include <torch/nn/cloneable.h>
#include <torch/nn/pimpl.h>
#include <torch/types.h>

#include <braid/torch/tensor_parallel/tp_mappings.hpp>

namespace braid::torch {

struct ColumnParallelLinearOptions {
  std::int64_t in_features = 0;
  std::int64_t out_features = 0;  // split across the TP ranks: each holds out_features / t
  bool bias = true;
  bool gather_output = false;       // all-gather the output to every rank's whole
  bool sequence_parallel = false;   // input is [s/t, b, in]: all-gathered along the sequence
  bool overlap_grad_reduce = true;  // the input gradient's reduction hides behind dW
  std::uint64_t seed = 0;
};

struct RowParallelLinearOptions {
  std::int64_t in_features = 0;  // split across the TP ranks: each holds in_features / t
  std::int64_t out_features = 0;
  bool bias = true;                // replicated, added after the reduction
  bool input_is_parallel = true;   // the input is already this rank's slice (a column-parallel
                                   // layer's output); false: sliced here
  bool sequence_parallel = false;  // output reduce-scattered along the sequence: [s/t, b, out]
  std::uint64_t seed = 0;
};

// The weights one process would make for a Linear(in, out) from `seed` (weight [out, in],
// bias [out]; no bias: an undefined tensor): the tensors a TP layer slices.
std::pair<::torch::Tensor, ::torch::Tensor> initial_linear_parameters(std::int64_t in_features,
                                                                      std::int64_t out_features,
                                                                      bool bias,
                                                                      std::uint64_t seed);

class ColumnParallelLinearImpl : public ::torch::nn::Cloneable<ColumnParallelLinearImpl> {
 public:
  ColumnParallelLinearImpl(tp::TensorParallelGroup tp, ColumnParallelLinearOptions options);

  // input: [..., in_features] ([s/t, b, in_features] with sequence_parallel). Returns
  // [..., out_features / t], or [..., out_features] with gather_output. A collective in
  // forward and backward where the mapping needs one.
  ::torch::Tensor forward(const ::torch::Tensor& input);
  void reset() override;
  // Sets this rank's shards to its slice of the full weight [out, in] and bias [out].
  void load_full(const ::torch::Tensor& weight, const ::torch::Tensor& bias = {});

  ::torch::Tensor weight;  // [out_features / t, in_features]: rows of the full weight
  ::torch::Tensor bias;    // [out_features / t]
  static constexpr std::int64_t weight_partition_dim = 0;

  const ColumnParallelLinearOptions& options() const noexcept { return options_; }
  const tp::TensorParallelGroup& group() const noexcept { return tp_; }

 private:
  tp::TensorParallelGroup tp_;
  ColumnParallelLinearOptions options_;
};

class RowParallelLinearImpl : public ::torch::nn::Cloneable<RowParallelLinearImpl> {
 public:
  RowParallelLinearImpl(tp::TensorParallelGroup tp, RowParallelLinearOptions options);

  // input: [..., in_features / t] (input_is_parallel) or [..., in_features]. Returns
  // [..., out_features] on every rank, or [s/t, b, out_features] with sequence_parallel.
  ::torch::Tensor forward(const ::torch::Tensor& input);
  void reset() override;
  void load_full(const ::torch::Tensor& weight, const ::torch::Tensor& bias = {});
  // The bias under sequence parallelism over two or more ranks (its gradient is partial
  // on each rank); none otherwise.
  std::vector<::torch::Tensor> sequence_parallel_parameters() const;

  ::torch::Tensor weight;  // [out_features, in_features / t]: columns of the full weight
  ::torch::Tensor bias;    // [out_features], the same on every rank
  static constexpr std::int64_t weight_partition_dim = 1;

  const RowParallelLinearOptions& options() const noexcept { return options_; }
  const tp::TensorParallelGroup& group() const noexcept { return tp_; }

 private:
  tp::TensorParallelGroup tp_;
  RowParallelLinearOptions options_;
};

// What TORCH_MODULE would declare, spelled out (inside braid::torch the macro's
// unqualified torch:: names this namespace).
class ColumnParallelLinear : public ::torch::nn::ModuleHolder<ColumnParallelLinearImpl> {
 public:
  using ::torch::nn::ModuleHolder<ColumnParallelLinearImpl>::ModuleHolder;
  using ::torch::nn::ModuleHolder<ColumnParallelLinearImpl>::get;
};
class RowParallelLinear : public ::torch::nn::ModuleHolder<RowParallelLinearImpl> {
 public:
  using ::torch::nn::ModuleHolder<RowParallelLinearImpl>::ModuleHolder;
  using ::torch::nn::ModuleHolder<RowParallelLinearImpl>::get;
};

}  // namespace braid::torch
