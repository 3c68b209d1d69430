// A pre-LayerNorm transformer block built from braid's tensor-parallel layers (Megatron-
// Core's TransformerLayer, without dropout): causal self-attention whose heads are split
// across the TP ranks, then an MLP, column-parallel then row-parallel.
//
//   braid::torch::ParallelTransformerBlock block(
//       tp, braid::torch::ParallelTransformerBlockOptions{.hidden = 512, .heads = 8});
//   auto y = block(x);   // x, y: [s, b, 512] ([s/t, b, 512] with sequence_parallel)
//   loss.backward();
//   braid::torch::tp::all_reduce_replicated_gradients(tp, block->sequence_parallel_parameters());
//   optimizer.step();
//
//   x = x + proj(attention(qkv(ln1(x))))      qkv: column-parallel, heads / t per rank
//   x = x + fc2(gelu(fc1(ln2(x))))            fc1 column-, fc2 row-parallel
//
// Per block and step, without sequence parallelism: two all-reduces of [s, b, h] in
// forward (after proj and fc2) and two in backward (the input gradients of qkv and fc1,
// each hidden behind its layer's weight-gradient product). With it, each all-reduce
// becomes an all-gather and a reduce-scatter of the same size (forward: the gathers
// before qkv and fc1, the reduce-scatters after proj and fc2; backward: the reverse, the
// reduce-scatters hidden behind qkv's and fc1's weight gradients, the gathers not), and
// LayerNorm works on [s/t, b, h].
//
// The QKV weight's rows are laid out per head ([heads][q, k, v][head_dim]), so rank r's
// rows are the q, k and v of heads [r heads/t, (r+1) heads/t): the attention of each head
// is local. The layers' seeds are mixed from `seed` (neighbouring seeds share nothing),
// so a block at TP t and at TP 1 built with the same options start identical;
// parameter_partition_dims() says how each parameter is split, for checkpoints and for comparing
// with a one-process twin.
//
// Errors: heads not dividing by the TP degree, hidden not dividing by heads, an input that
// is not [s, b, hidden], are Error(invalid_argument) naming the rank.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <torch/nn/cloneable.h>
#include <torch/nn/modules/normalization.h>
#include <torch/nn/pimpl.h>
#include <torch/types.h>

#include <braid/torch/tensor_parallel/parallel_linear.hpp>

namespace braid::torch {

struct ParallelTransformerBlockOptions {
  std::int64_t hidden = 0;
  std::int64_t heads = 0;       // split across the TP ranks
  std::int64_t ffn_hidden = 0;  // 0: 4 x hidden
  bool sequence_parallel = false;
  bool overlap_grad_reduce = true;  // ColumnParallelLinear's backward overlap
  double layer_norm_eps = 1e-5;
  std::uint64_t seed = 0;
};

class ParallelTransformerBlockImpl : public ::torch::nn::Cloneable<ParallelTransformerBlockImpl> {
 public:
  ParallelTransformerBlockImpl(tp::TensorParallelGroup tp, ParallelTransformerBlockOptions options);

  // x: [s, b, hidden] on every TP rank ([s/t, b, hidden] with sequence_parallel, rank r
  // holding positions [r s/t, (r+1) s/t)). Returns the same shape. A collective.
  ::torch::Tensor forward(const ::torch::Tensor& x);
  void reset() override;

  // The parameters whose gradients need tp::all_reduce_replicated_gradients once per step:
  // under sequence parallelism LayerNorm's and the row-parallel biases; none otherwise.
  std::vector<::torch::Tensor> sequence_parallel_parameters() const;
  // Each parameter's name (as named_parameters() gives it) and the dimension it is split
  // along across the TP ranks; -1 for a parameter every rank holds whole.
  std::map<std::string, std::int64_t> parameter_partition_dims() const;

  ::torch::nn::LayerNorm ln1{nullptr}, ln2{nullptr};
  ColumnParallelLinear qkv{nullptr}, fc1{nullptr};
  RowParallelLinear proj{nullptr}, fc2{nullptr};

  const ParallelTransformerBlockOptions& options() const noexcept { return options_; }

 private:
  ::torch::Tensor attention(const ::torch::Tensor& qkv_out) const;

  tp::TensorParallelGroup tp_;
  ParallelTransformerBlockOptions options_;
};

class ParallelTransformerBlock : public ::torch::nn::ModuleHolder<ParallelTransformerBlockImpl> {
 public:
  using ::torch::nn::ModuleHolder<ParallelTransformerBlockImpl>::ModuleHolder;
  using ::torch::nn::ModuleHolder<ParallelTransformerBlockImpl>::get;
};

}  // namespace braid::torch
