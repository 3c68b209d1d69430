#include "braid_models/models.hpp"

#include <chrono>
#include <cmath>
#include <ctime>
#include <stdexcept>
#include <unistd.h>

#include <fmt/format.h>

namespace example_models {

MlpImpl::MlpImpl(int hidden, int layers) : hidden_layers(layers) {
  for (int i = 0; i < layers; ++i) {
    body->push_back(torch::nn::Linear(hidden, hidden));
    body->push_back(torch::nn::ReLU());
  }
  body->push_back(torch::nn::Linear(hidden, hidden / 2));
  body->push_back(torch::nn::ReLU());
  body->push_back(torch::nn::Linear(hidden / 2, 1));
  register_module("body", body);
}

std::vector<std::shared_ptr<torch::nn::Module>> MlpImpl::units() const {
  std::vector<std::shared_ptr<torch::nn::Module>> hidden;
  for (int i = 0; i < hidden_layers; ++i) hidden.push_back(body->ptr(2 * i));
  return hidden;
}

TransformerImpl::TransformerImpl(int hidden, int layers) {
  for (int i = 0; i < layers; ++i) {
    blocks.push_back(register_module(
        "block" + std::to_string(i),
        torch::nn::TransformerEncoderLayer(torch::nn::TransformerEncoderLayerOptions(hidden, 4)
                                               .dim_feedforward(2 * hidden)
                                               .dropout(0.0))));
  }
  head = register_module("head", torch::nn::Linear(hidden, 1));
}

torch::Tensor TransformerImpl::forward(const torch::Tensor& x) {
  torch::Tensor h = x;
  for (auto& block : blocks) h = block->forward(h);
  return head->forward(h.mean(0));
}

std::vector<std::shared_ptr<torch::nn::Module>> TransformerImpl::units() const {
  std::vector<std::shared_ptr<torch::nn::Module>> all;
  for (const auto& block : blocks) all.push_back(block.ptr());
  return all;
}

Task::Task(int hidden_, bool transformer_) : transformer(transformer_), hidden(hidden_) {
  torch::manual_seed(4242);
  teacher = torch::randn({kFeatures, 1}) / 4;
}

std::pair<torch::Tensor, torch::Tensor> Task::batch(int rank, int step, int size) const {
  torch::manual_seed(1000003 * (step + 1) + rank);
  if (!transformer) {
    torch::Tensor x = torch::randn({size, hidden});
    return {x, torch::tanh(x.narrow(1, 0, kFeatures).matmul(teacher) * 2)};
  }
  torch::Tensor x = torch::randn({kSequence, size, hidden});
  return {x, torch::tanh(x.mean(0).narrow(1, 0, kFeatures).matmul(teacher) * 8)};
}

double memory_of_this_machine() {
  return static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGE_SIZE));
}

void compute_for(double ms) {
  const auto until = std::chrono::steady_clock::now() +
                     std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                         std::chrono::duration<double, std::milli>(ms));
  volatile double sink = 1.0;
  while (std::chrono::steady_clock::now() < until) {
    for (int i = 0; i < 1000; ++i) sink = sink * 1.0000001 + 1e-9;
  }
}

double thread_cpu_seconds() {
  timespec now{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &now);
  return static_cast<double>(now.tv_sec) + static_cast<double>(now.tv_nsec) * 1e-9;
}

double decimal_number(const std::string& option, const std::string& text) {
  std::size_t used = 0;
  double value = 0;
  try {
    value = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != text.size() || !(value > 0) || !std::isfinite(value)) {
    throw std::invalid_argument(option + " needs a positive number, not '" + text + "'");
  }
  return value;
}

void ModelChoice::finish() {
  if (name != "mlp" && name != "transformer")
    throw std::invalid_argument("--model mlp|transformer");
  if (hidden == 0) hidden = transformer() ? 256 : 512;
  if (layers == 0) layers = transformer() ? 4 : 5;
  const double width = hidden;
  const double parameters = 16.0 * layers * width * width * (transformer() ? 12 : 1);
  const double activations = 4.0 * batch * width * layers * (transformer() ? 16.0 * kSequence : 4);
  const double memory = memory_of_this_machine();
  if (parameters > memory || activations > memory) {
    throw std::invalid_argument(fmt::format(
        "--model {} --hidden {} --layers {} --batch {} needs about {:.3g} GiB for the model and "
        "{:.3g} GiB of activations per rank, more than this machine's {:.1f} GiB",
        name, hidden, layers, batch, parameters / (1 << 30), activations / (1 << 30),
        memory / (1 << 30)));
  }
}

Mlp ModelChoice::make_mlp() const {
  if (seed >= 0) torch::manual_seed(static_cast<std::uint64_t>(seed));
  return Mlp(hidden, layers);
}

Transformer ModelChoice::make_transformer() const {
  if (seed >= 0) torch::manual_seed(static_cast<std::uint64_t>(seed));
  return Transformer(hidden, layers);
}

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const std::string& name,
                                                        std::vector<torch::Tensor> parameters,
                                                        double lr) {
  if (name == "adam") {
    return std::make_unique<torch::optim::Adam>(std::move(parameters),
                                                torch::optim::AdamOptions(lr));
  }
  if (name == "sgd") {
    return std::make_unique<torch::optim::SGD>(std::move(parameters),
                                               torch::optim::SGDOptions(0.01).momentum(0.9));
  }
  throw std::invalid_argument("--optimizer adam|sgd, not '" + name + "'");
}

void set_compute_threads(int threads) {
  torch::set_num_threads(threads);
  at::globalContext().setFlushDenormal(true);
}

}  // namespace example_models
