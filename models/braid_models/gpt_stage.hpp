// The 3D job's model and task (examples/train_3d), shared with braid-bench's pipeline
// worker so that the benchmark times the job users run: a small GPT-style language model
// (token embedding tied to the output head, transformer blocks) cut into pipeline stages,
// on a synthetic next-token task whose loss falls to near zero (each sequence follows a
// fixed random permutation of the vocabulary).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <torch/torch.h>

#include <braid/torch/tensor_parallel/parallel_transformer_block.hpp>
#include <braid/torch/tensor_parallel/tp_mappings.hpp>
#include <braid/torch/tensor_parallel/vocab_parallel.hpp>

#include "braid_models/models.hpp"

namespace example_models {

// The model's shape, the batch and the seed of its weights and data.
struct GptOptions {
  int layers = 4;
  int hidden = 64;
  int heads = 4;
  int vocab = 64;
  int seq = 16;
  int global_batch = 8;  // sequences per step over every data-parallel rank
  std::uint64_t seed = 1;

  // Takes `option` with its `value` if it is one of these (--layers, --hidden, --heads,
  // --vocab, --seq, --global-batch, --seed); false if not.
  bool parse(const std::string& option, const std::string& value);
};

// What this machine's memory allows, checked before anything is allocated: a mistyped
// --hidden or --layers otherwise ends in libtorch's allocator failure, naming no flag. The
// estimate is fp32 parameters, gradients and Adam's two moments (16 bytes a parameter; a
// block holds 12 hidden^2 of them, split over `tp`, plus the tied embedding) and the
// activations of one microbatch through this rank's `layers` (about 16 floats per token per
// hidden unit per block, plus the vocabulary's logits). Throws std::invalid_argument naming
// the flags and both sizes.
void check_fits_in_memory(const GptOptions& s, int layers, int tp, int micro);

// Which pipeline schedule, over how many microbatches and stages per rank, as the 3D job
// and braid-bench's pipeline worker take them (--schedule, --microbatches,
// --virtual-stages).
struct ScheduleChoice {
  std::string schedule = "1f1b";
  int microbatches = 4;
  int virtual_stages = 0;  // 0 until finish(): 2 for interleaved, else 1

  bool parse(const std::string& option, const std::string& value);
  void finish() {
    if (virtual_stages == 0) virtual_stages = schedule == "interleaved" ? 2 : 1;
  }
};

// The global batch of step `step`: [seq + 1, global_batch] token ids, each column a walk
// through a fixed random permutation of the vocabulary from a random first token.
torch::Tensor gpt_global_batch(const GptOptions& s, int step);

// One pipeline stage: the embedding on the first, `layers` transformer blocks from
// `first_layer`, and the final LayerNorm, the tied output head and the vocabulary-parallel
// loss on the last.
struct GptStageImpl : torch::nn::Module {
  GptStageImpl(const GptOptions& s, braid::torch::tp::TensorParallelGroup tp, int first_layer,
               int layers, bool first, bool last);

  // tokens [seq, mb] on the first stage; the loss's share on the last (targets [seq, mb]).
  torch::Tensor forward(const torch::Tensor& input, const torch::Tensor& tokens,
                        const torch::Tensor& targets, double loss_scale);

  braid::torch::tp::TensorParallelGroup tp;
  bool first, last;
  braid::torch::VocabParallelEmbedding embed{nullptr};
  std::vector<braid::torch::ParallelTransformerBlock> blocks;
  torch::nn::LayerNorm norm{nullptr};
};

}  // namespace example_models
