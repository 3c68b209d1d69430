// The models and synthetic task of braid's training examples and benchmarks: the main
// job (examples/ddp_train) and braid-bench's workers train the same ones, so their step
// times compare. Plain libtorch, no braid: braid-bench's compute-plain worker links it
// without braid (models.cpp holds the bodies).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <torch/torch.h>

#include "braid_models/whole_number.hpp"

namespace example_models {

// hidden -> hidden x layers -> hidden/2 -> 1, ReLU between.
//
// Each model also runs its forward with its units (the hidden layers, the blocks) handed to
// `run_unit(module, forward)`, as a sharded-data-parallel wrapper (FullyShardedDataParallel's
// run) takes them; the arithmetic is forward(x)'s. units() lists the modules to shard in turn,
// innermost first; the model itself is the root unit, holding the rest.
struct MlpImpl : torch::nn::Module {
  explicit MlpImpl(int hidden, int layers);
  torch::Tensor forward(const torch::Tensor& x) { return body->forward(x); }
  template <class RunUnit>
  torch::Tensor forward(torch::Tensor x, RunUnit&& run_unit) {
    for (int i = 0; i < hidden_layers; ++i) {  // a hidden Linear and its ReLU
      torch::nn::AnyModule& linear = body->begin()[2 * i];
      torch::nn::AnyModule& relu = body->begin()[2 * i + 1];
      x = run_unit(*linear.ptr(), [&] { return relu.forward(linear.forward(x)); });
    }
    for (std::size_t i = 2 * static_cast<std::size_t>(hidden_layers); i < body->size(); ++i) {
      x = body->begin()[static_cast<std::ptrdiff_t>(i)].forward(x);
    }
    return x;
  }
  std::vector<std::shared_ptr<torch::nn::Module>> units() const;
  int hidden_layers;
  torch::nn::Sequential body;
};
TORCH_MODULE(Mlp);

// An encoder block (self-attention + feed-forward) on sequences of 16 tokens, then a
// linear head on the mean token.
struct TransformerImpl : torch::nn::Module {
  explicit TransformerImpl(int hidden, int layers);
  torch::Tensor forward(const torch::Tensor& x);  // x: [seq, batch, hidden]
  template <class RunUnit>
  torch::Tensor forward(const torch::Tensor& x, RunUnit&& run_unit) {
    torch::Tensor h = x;
    for (auto& block : blocks) h = run_unit(*block, [&] { return block->forward(h); });
    return head->forward(h.mean(0));
  }
  std::vector<std::shared_ptr<torch::nn::Module>> units() const;
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
  Task(int hidden, bool transformer);
  // Inputs and targets of `size` samples for `rank`'s `step`.
  std::pair<torch::Tensor, torch::Tensor> batch(int rank, int step, int size) const;
};

// This machine's physical memory in bytes: what a model's size is checked against before it
// is built.
double memory_of_this_machine();

// Keeps this thread's core busy for `ms` milliseconds: a slower rank's extra compute
// (--straggle-ms), spinning rather than sleeping, as a slower device would.
void compute_for(double ms);

// One window of dp::CadenceBalancer's cadence mode: `step(i)` for each of `count`
// micro-batches, all but the last under DDP's no_sync() from their forward on, so the last
// backward reduces what the window accumulated. `ddp` may be null where `count` is 1.
template <class Ddp, class Step>
void run_window(Ddp* ddp, int count, Step&& step) {
  for (int i = 0; i + 1 < count; ++i) {
    auto local = ddp->no_sync();
    step(i);
  }
  step(count - 1);
}

// This thread's CPU time in seconds: what a rank's compute took, without the time it spent
// waiting (for a collective, a slower rank) off its core.
double thread_cpu_seconds();

// How the main jobs and their benchmarks compute on the CPU: `threads` intra-op threads,
// and denormal floats flushed to zero on this thread. Late in training, Adam's second
// moments (squared gradients) fall below 1e-38, where each x86 float operation on them
// takes about a hundred cycles instead of a few: ddp_train's step grew from 8 to 17 ms
// after 700 steps, with no change in its losses once flushed. PyTorch leaves denormals on
// unless told (torch.set_flush_denormal); the Python peers are told, so that comparisons
// stay like for like.
void set_compute_threads(int threads);

// A positive finite decimal number for `option` ("0.001", "3e-3"); anything else is
// std::invalid_argument naming the option.
double decimal_number(const std::string& option, const std::string& text);

// Which model, how big, and the batch: the options every program that trains these models
// takes (--model, --hidden, --layers, --batch, --seed), with the main job's defaults.
struct ModelChoice {
  std::string name = "mlp";
  int hidden = 0;  // 0 until finish(): the model's default
  int layers = 0;
  int batch = 32;
  int seed = -1;  // the initial weights' seed; -1: libtorch's own, a different one each run

  // Takes `option` (reading its value with `value()`) if it is one of these; false if not.
  template <class Value>
  bool parse(const std::string& option, Value&& value) {
    if (option == "--model")
      name = value();
    else if (option == "--hidden")
      hidden = whole_number(option, value(), 8);
    else if (option == "--layers")
      layers = whole_number(option, value(), 1);
    else if (option == "--batch")
      batch = whole_number(option, value(), 1);
    else if (option == "--seed")
      seed = whole_number(option, value(), 0);
    else
      return false;
    return true;
  }
  // Checks the name and fills in the defaults: MLP 512 wide with 5 hidden layers (1.44M
  // parameters in several buckets, enough backward to overlap), transformer 256 x 4.
  // Refuses a shape this machine's memory cannot hold (fp32 parameters, gradients and Adam's
  // two moments, 16 bytes a parameter; the activations of one batch, about 16 floats a token
  // per hidden unit per block in a transformer and 4 a sample per unit in an MLP), before
  // anything is allocated: a mistyped --hidden otherwise ends in libtorch's allocator error.
  void finish();
  bool transformer() const { return name == "transformer"; }
  Mlp make_mlp() const;
  Transformer make_transformer() const;
};

// Adam with learning rate `lr`, or SGD (lr 0.01, momentum 0.9): the cheaper step, so
// communication is a larger share of it.
std::unique_ptr<torch::optim::Optimizer> make_optimizer(const std::string& name,
                                                        std::vector<torch::Tensor> parameters,
                                                        double lr);

}  // namespace example_models
