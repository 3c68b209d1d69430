// The models and synthetic task of braid's training examples and benchmarks: the main
// job (examples/ddp_train) and braid-bench's compute-tax workers train the same ones, so
// their step times compare.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include <torch/torch.h>

namespace example_models {

// hidden -> hidden x layers -> hidden/2 -> 1, ReLU between.
struct MlpImpl : torch::nn::Module {
  explicit MlpImpl(int hidden, int layers) {
    for (int i = 0; i < layers; ++i) {
      body->push_back(torch::nn::Linear(hidden, hidden));
      body->push_back(torch::nn::ReLU());
    }
    body->push_back(torch::nn::Linear(hidden, hidden / 2));
    body->push_back(torch::nn::ReLU());
    body->push_back(torch::nn::Linear(hidden / 2, 1));
    register_module("body", body);
  }
  torch::Tensor forward(const torch::Tensor& x) { return body->forward(x); }
  torch::nn::Sequential body;
};
TORCH_MODULE(Mlp);

// An encoder block (self-attention + feed-forward) on sequences of 16 tokens, then a
// linear head on the mean token.
struct TransformerImpl : torch::nn::Module {
  explicit TransformerImpl(int hidden, int layers) {
    for (int i = 0; i < layers; ++i) {
      blocks.push_back(register_module(
          "block" + std::to_string(i),
          torch::nn::TransformerEncoderLayer(torch::nn::TransformerEncoderLayerOptions(hidden, 4)
                                                 .dim_feedforward(2 * hidden)
                                                 .dropout(0.0))));
    }
    head = register_module("head", torch::nn::Linear(hidden, 1));
  }
  torch::Tensor forward(const torch::Tensor& x) {  // x: [seq, batch, hidden]
    torch::Tensor h = x;
    for (auto& block : blocks) h = block->forward(h);
    return head->forward(h.mean(0));
  }
  std::vector<torch::nn::TransformerEncoderLayer> blocks;
  torch::nn::Linear head{nullptr};
};
TORCH_MODULE(Transformer);

constexpr int kSequence = 16;

// The synthetic task: inputs from a per-rank, per-step seed; targets from a fixed teacher
// (the same on every rank): a smooth function of a random projection of the first 16
// features.
struct Task {
  static constexpr int kFeatures = 16;
  torch::Tensor teacher;
  bool transformer;
  int hidden;
  Task(int hidden_, bool transformer_) : transformer(transformer_), hidden(hidden_) {
    torch::manual_seed(4242);
    teacher = torch::randn({kFeatures, 1}) / 4;
  }
  std::pair<torch::Tensor, torch::Tensor> batch(int rank, int step, int size) const {
    torch::manual_seed(1000003 * (step + 1) + rank);
    if (!transformer) {
      torch::Tensor x = torch::randn({size, hidden});
      return {x, torch::tanh(x.narrow(1, 0, kFeatures).matmul(teacher) * 2)};
    }
    torch::Tensor x = torch::randn({kSequence, size, hidden});
    return {x, torch::tanh(x.mean(0).narrow(1, 0, kFeatures).matmul(teacher) * 8)};
  }
};

}  // namespace example_models
