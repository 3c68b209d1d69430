// The 3D job's model and task (examples/train_3d), shared with braid-bench's pipeline
// worker so that the benchmark times the job users run: a small GPT-style language model
// (token embedding tied to the output head, transformer blocks) cut into pipeline stages,
// on a synthetic next-token task whose loss falls to near zero (each sequence follows a
// fixed random permutation of the vocabulary).
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>
#include <torch/torch.h>

#include <braid/torch/tensor_parallel/parallel_transformer_block.hpp>
#include <braid/torch/tensor_parallel/tp_mappings.hpp>
#include <braid/torch/tensor_parallel/vocab_parallel.hpp>

#include "models.hpp"

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
  bool parse(const std::string& option, const std::string& value) {
    if (option == "--layers")
      layers = whole_number(option, value, 1);
    else if (option == "--hidden")
      hidden = whole_number(option, value, 2);
    else if (option == "--heads")
      heads = whole_number(option, value, 1);
    else if (option == "--vocab")
      vocab = whole_number(option, value, 2);
    else if (option == "--seq")
      seq = whole_number(option, value, 2);
    else if (option == "--global-batch")
      global_batch = whole_number(option, value, 1);
    else if (option == "--seed")
      seed = static_cast<std::uint64_t>(whole_number(option, value, 0));
    else
      return false;
    return true;
  }
};

// What this machine's memory allows, checked before anything is allocated: a mistyped
// --hidden or --layers otherwise ends in libtorch's allocator failure, naming no flag. The
// estimate is fp32 parameters, gradients and Adam's two moments (16 bytes a parameter; a
// block holds 12 hidden^2 of them, split over `tp`, plus the tied embedding) and the
// activations of one microbatch through this rank's `layers` (about 16 floats per token per
// hidden unit per block, plus the vocabulary's logits). Throws std::invalid_argument naming
// the flags and both sizes.
inline void check_fits_in_memory(const GptOptions& s, int layers, int tp, int micro) {
  const double memory = memory_of_this_machine();
  const double hidden = s.hidden;
  const double parameters = 16.0 * (12.0 * hidden * hidden * layers / tp + 2.0 * s.vocab * hidden);
  const double tokens = static_cast<double>(s.seq) * micro;
  const double activations = 4.0 * tokens * (16.0 * hidden * layers + 2.0 * s.vocab);
  const auto gib = [](double bytes) { return bytes / (1 << 30); };
  if (parameters > memory) {
    throw std::invalid_argument(fmt::format(
        "--layers {} --hidden {} --vocab {}: this rank's share of the model needs about {:.3g} "
        "GiB for its parameters, gradients and optimizer state, more than this machine's {:.1f} "
        "GiB",
        s.layers, s.hidden, s.vocab, gib(parameters), gib(memory)));
  }
  if (activations > memory) {
    throw std::invalid_argument(fmt::format(
        "--seq {} --global-batch {} --hidden {}: a microbatch's activations need about {:.3g} GiB "
        "on this rank, more than this machine's {:.1f} GiB",
        s.seq, s.global_batch, s.hidden, gib(activations), gib(memory)));
  }
}

// Which pipeline schedule, over how many microbatches and stages per rank, as the 3D job
// and braid-bench's pipeline worker take them (--schedule, --microbatches,
// --virtual-stages).
struct ScheduleChoice {
  std::string schedule = "1f1b";
  int microbatches = 4;
  int virtual_stages = 0;  // 0 until finish(): 2 for interleaved, else 1

  bool parse(const std::string& option, const std::string& value) {
    if (option == "--schedule")
      schedule = value;
    else if (option == "--microbatches")
      microbatches = whole_number(option, value, 1);
    else if (option == "--virtual-stages")
      virtual_stages = whole_number(option, value, 1);
    else
      return false;
    return true;
  }
  void finish() {
    if (virtual_stages == 0) virtual_stages = schedule == "interleaved" ? 2 : 1;
  }
};

// The global batch of step `step`: [seq + 1, global_batch] token ids, each column a walk
// through a fixed random permutation of the vocabulary from a random first token.
inline torch::Tensor gpt_global_batch(const GptOptions& s, int step) {
  at::Generator task = at::detail::createCPUGenerator(s.seed * 7919 + 17);
  const torch::Tensor next = torch::randperm(s.vocab, task, torch::kLong);
  at::Generator draws = at::detail::createCPUGenerator(s.seed * 1000003 + step);
  torch::Tensor tokens = torch::empty({s.seq + 1, s.global_batch}, torch::kLong);
  tokens[0] = torch::randint(s.vocab, {s.global_batch}, draws, torch::kLong);
  for (int t = 0; t < s.seq; ++t) tokens[t + 1] = next.index_select(0, tokens[t]);
  return tokens;
}

// One pipeline stage: the embedding on the first, `layers` transformer blocks from
// `first_layer`, and the final LayerNorm, the tied output head and the vocabulary-parallel
// loss on the last.
struct GptStageImpl : torch::nn::Module {
  GptStageImpl(const GptOptions& s, braid::torch::tp::TensorParallelGroup tp, int first_layer,
               int layers, bool first, bool last)
      : tp(std::move(tp)), first(first), last(last) {
    const braid::torch::VocabParallelEmbeddingOptions embedding{
        .num_embeddings = s.vocab, .dim = s.hidden, .seed = s.seed * 1000, .init_std = 0.02};
    // The last stage keeps its own copy of the tied embedding (unless it is also the
    // first): the embedding group adds the two copies' gradients every step.
    if (first || last) {
      embed = register_module("embed", braid::torch::VocabParallelEmbedding(this->tp, embedding));
    }
    for (int l = first_layer; l < first_layer + layers; ++l) {
      blocks.push_back(register_module(
          fmt::format("block{}", l),
          braid::torch::ParallelTransformerBlock(
              this->tp, braid::torch::ParallelTransformerBlockOptions{
                            .hidden = s.hidden,
                            .heads = s.heads,
                            .seed = s.seed * 1000 + 1 + static_cast<std::uint64_t>(l)})));
    }
    if (last)
      norm = register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({s.hidden})));
  }

  // tokens [seq, mb] on the first stage; the loss's share on the last (targets [seq, mb]).
  torch::Tensor forward(const torch::Tensor& input, const torch::Tensor& tokens,
                        const torch::Tensor& targets, double loss_scale) {
    torch::Tensor h = first ? embed(tokens) : input;
    for (auto& block : blocks) h = block(h);
    if (!last) return h;
    h = norm(h);
    const torch::Tensor logits =
        torch::matmul(braid::torch::tp::copy_to_region(tp, h), embed->weight.t());
    return braid::torch::vocab_parallel_cross_entropy(tp, logits, targets).sum() * loss_scale;
  }

  braid::torch::tp::TensorParallelGroup tp;
  bool first, last;
  braid::torch::VocabParallelEmbedding embed{nullptr};
  std::vector<braid::torch::ParallelTransformerBlock> blocks;
  torch::nn::LayerNorm norm{nullptr};
};

}  // namespace example_models
