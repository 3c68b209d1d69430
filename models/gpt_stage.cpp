#include "braid_models/gpt_stage.hpp"

#include <stdexcept>
#include <utility>

#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>

namespace example_models {

bool GptOptions::parse(const std::string& option, const std::string& value) {
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

void check_fits_in_memory(const GptOptions& s, int layers, int tp, int micro) {
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

bool ScheduleChoice::parse(const std::string& option, const std::string& value) {
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

torch::Tensor gpt_global_batch(const GptOptions& s, int step) {
  at::Generator task = at::detail::createCPUGenerator(s.seed * 7919 + 17);
  const torch::Tensor next = torch::randperm(s.vocab, task, torch::kLong);
  at::Generator draws = at::detail::createCPUGenerator(s.seed * 1000003 + step);
  torch::Tensor tokens = torch::empty({s.seq + 1, s.global_batch}, torch::kLong);
  tokens[0] = torch::randint(s.vocab, {s.global_batch}, draws, torch::kLong);
  for (int t = 0; t < s.seq; ++t) tokens[t + 1] = next.index_select(0, tokens[t]);
  return tokens;
}

GptStageImpl::GptStageImpl(const GptOptions& s, braid::torch::tp::TensorParallelGroup tp,
                           int first_layer, int layers, bool first, bool last)
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

torch::Tensor GptStageImpl::forward(const torch::Tensor& input, const torch::Tensor& tokens,
                                    const torch::Tensor& targets, double loss_scale) {
  torch::Tensor h = first ? embed(tokens) : input;
  for (auto& block : blocks) h = block(h);
  if (!last) return h;
  h = norm(h);
  const torch::Tensor logits =
      torch::matmul(braid::torch::tp::copy_to_region(tp, h), embed->weight.t());
  return braid::torch::vocab_parallel_cross_entropy(tp, logits, targets).sum() * loss_scale;
}

}  // namespace example_models
