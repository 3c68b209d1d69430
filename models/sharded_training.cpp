#include "braid_models/sharded_training.hpp"

#include <fstream>

namespace example_models {

Sharding sharding_named(const std::string& text) {
  if (text == "none") return Sharding::none;
  if (text == "optimizer") return Sharding::optimizer;
  if (text == "grad") return Sharding::grad;
  if (text == "full") return Sharding::full;
  if (text == "no_shard") return Sharding::no_shard;
  throw std::invalid_argument("--sharding none|optimizer|grad|full|no_shard, not '" + text + "'");
}

bool is_fsdp(Sharding s) {
  return s == Sharding::grad || s == Sharding::full || s == Sharding::no_shard;
}

braid::dp::ShardedState sharded_state(Sharding s) {
  switch (s) {
    case Sharding::optimizer:
      return braid::dp::ShardedState::optimizer;
    case Sharding::grad:
      return braid::dp::ShardedState::gradients;
    case Sharding::full:
      return braid::dp::ShardedState::parameters;
    default:
      return braid::dp::ShardedState::none;
  }
}

std::string describe(Sharding s, const TrainingChoice& training) {
  switch (s) {
    case Sharding::none:
      return training.ddp.gradient_as_bucket_view ? "braid DDP, gradients in the buckets"
                                                  : "braid DDP, copy mode";
    case Sharding::optimizer:
      return "braid DDP with ZeroRedundancyOptimizer (ZeRO-1)";
    case Sharding::grad:
      return "braid FSDP SHARD_GRAD_OP (ZeRO-2)";
    case Sharding::full:
      return "braid FSDP FULL_SHARD (ZeRO-3)";
    case Sharding::no_shard:
      return "braid FSDP NO_SHARD";
  }
  return "";
}

std::int64_t bytes_of(const torch::Tensor& t) {
  return t.defined() ? t.numel() * static_cast<std::int64_t>(t.element_size()) : 0;
}

std::int64_t optimizer_state_bytes(const torch::optim::Optimizer& optimizer) {
  std::int64_t bytes = 0;
  for (const auto& [key, state] : optimizer.state()) {
    if (const auto* adam = dynamic_cast<const torch::optim::AdamParamState*>(state.get())) {
      bytes += bytes_of(adam->exp_avg()) + bytes_of(adam->exp_avg_sq()) +
               bytes_of(adam->max_exp_avg_sq());
    } else if (const auto* sgd = dynamic_cast<const torch::optim::SGDParamState*>(state.get())) {
      bytes += bytes_of(sgd->momentum_buffer());
    }
  }
  return bytes;
}

int optimizer_state_bytes_per_parameter(const std::string& optimizer) {
  return optimizer == "adam" ? braid::dp::kAdamStateBytes : braid::dp::kSgdMomentumStateBytes;
}

std::int64_t peak_resident_bytes() {
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("VmHWM:", 0) == 0) return std::stoll(line.substr(6)) * 1024;  // kB
  }
  return 0;
}

std::string mib(std::int64_t bytes) {
  return fmt::format("{:.2f} MiB", static_cast<double>(bytes) / (1 << 20));
}

}  // namespace example_models
