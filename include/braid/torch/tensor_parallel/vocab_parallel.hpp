// Vocabulary parallelism for libtorch (Megatron-Core's VocabParallelEmbedding and
// vocab_parallel_cross_entropy): the embedding table and the output logits split across the
// tensor-parallel ranks by vocabulary, so no rank holds a whole [V, h] table nor a whole
// [s, b, V] logits tensor.
//
//   braid::torch::VocabParallelEmbedding embed(
//       tp, braid::torch::VocabParallelEmbeddingOptions{.num_embeddings = 32000, .dim = 512});
//   auto h = embed(tokens);                    // tokens [s, b] -> h [s, b, 512]
//   auto logits = head(h);                     // a ColumnParallelLinear: [s, b, 32000 / t]
//   auto loss = braid::torch::vocab_parallel_cross_entropy(tp, logits, targets).mean();
//
// The embedding: each rank holds rows [r V/t, (r+1) V/t) of the table, looks up the tokens
// in its range (zeros for the rest), and the ranks' lookups are summed (an all-reduce of
// [s, b, h]; under sequence_parallel a reduce-scatter to [s/t, b, h]). Initialised from
// `seed` as one process's Embedding would be (normal(0, init_std)), each rank keeping its
// rows.
//
// The cross-entropy of logits split by vocabulary, per token (reduction "none"; take the
// mean yourself), as torch::nn::functional::cross_entropy of the whole logits: the
// logits' maximum over the vocabulary is all-reduced (max), then the target's logit and
// the sum of exponentials are all-reduced together (one all-reduce of 2 floats a token:
// Megatron-Core makes them two). Backward is local: softmax minus the one-hot target, the
// softmax kept from forward ([s, b, V/t] floats). Computed in f32 for 16-bit logits.
//
// Errors: a vocabulary that does not divide by the TP degree, targets whose shape is not
// the logits' without the last dimension, token ids outside [0, V) (checked on every
// rank: each sees every id), are Error(invalid_argument) naming the rank.
#pragma once

#include <cstdint>

#include <torch/nn/cloneable.h>
#include <torch/nn/pimpl.h>
#include <torch/types.h>

#include <braid/torch/tensor_parallel/tp_mappings.hpp>

namespace braid::torch {

struct VocabParallelEmbeddingOptions {
  std::int64_t num_embeddings = 0;  // the vocabulary V, split across the TP ranks
  std::int64_t dim = 0;
  bool sequence_parallel = false;  // output reduce-scattered along the sequence
  std::uint64_t seed = 0;
  // The table's initial standard deviation: libtorch's Embedding draws N(0, 1); a table
  // tied to the output head wants a small one (GPT-2 and Megatron-Core use 0.02), or the
  // first logits are huge.
  double init_std = 1.0;
};

class VocabParallelEmbeddingImpl : public ::torch::nn::Cloneable<VocabParallelEmbeddingImpl> {
 public:
  VocabParallelEmbeddingImpl(tp::TensorParallelGroup tp, VocabParallelEmbeddingOptions options);

  // tokens: integer ids, [s, b] (any shape; sequence first under sequence_parallel).
  // Returns tokens.shape + [dim] (with the first dimension / t under sequence_parallel).
  ::torch::Tensor forward(const ::torch::Tensor& tokens);
  void reset() override;
  void load_full(const ::torch::Tensor& weight);  // this rank's rows of a [V, dim] table

  ::torch::Tensor weight;  // [V / t, dim]
  static constexpr std::int64_t weight_partition_dim = 0;
  // The first id this rank's rows hold, and one past the last.
  std::int64_t vocab_start() const noexcept;
  std::int64_t vocab_end() const noexcept;

 private:
  tp::TensorParallelGroup tp_;
  VocabParallelEmbeddingOptions options_;
};

class VocabParallelEmbedding : public ::torch::nn::ModuleHolder<VocabParallelEmbeddingImpl> {
 public:
  using ::torch::nn::ModuleHolder<VocabParallelEmbeddingImpl>::ModuleHolder;
  using ::torch::nn::ModuleHolder<VocabParallelEmbeddingImpl>::get;
};

// logits: [..., V / t], this rank's slice of the vocabulary (rank r holds ids
// [r V/t, (r+1) V/t)). targets: [...], int64 (or int32) ids in [0, V). Returns the loss per token,
// [...], in the logits' dtype (f32 for 16-bit ones). A collective (two all-reduces).
::torch::Tensor vocab_parallel_cross_entropy(tp::TensorParallelGroup tp,
                                             const ::torch::Tensor& logits,
                                             const ::torch::Tensor& targets);

}  // namespace braid::torch
