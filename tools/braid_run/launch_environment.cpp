#include "launch_environment.hpp"

#include <algorithm>
#include <charconv>
#include <dirent.h>
#include <stdexcept>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include <braid/core/error.hpp>
#include <braid/transport/bootstrap.hpp>

namespace braid::launcher {
namespace {

std::optional<std::string> read(const config::EnvLookup& env, std::string_view name) {
  auto value = env(name);
  if (!value) return std::nullopt;
  std::string_view text = config::trim(*value);
  if (text.empty()) return std::nullopt;
  return std::string(text);
}

int parse_count(std::string_view name, std::string_view text, int minimum, int maximum) {
  int value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size() || value < minimum || value > maximum) {
    throw std::invalid_argument(
        fmt::format("{}='{}' is not an integer from {} to {}", name, text, minimum, maximum));
  }
  return value;
}

// The GPUs this process may use: CUDA_VISIBLE_DEVICES's entries where it is set (as
// torchrun counts them), else /dev/nvidia0, /dev/nvidia1, ...: one per GPU the driver shows.
int nvidia_gpus(const config::EnvLookup& env) {
  if (auto visible = env("CUDA_VISIBLE_DEVICES")) {
    const std::string_view list = config::trim(*visible);
    return list.empty() ? 0 : 1 + static_cast<int>(std::count(list.begin(), list.end(), ','));
  }
  DIR* dev = ::opendir("/dev");
  if (dev == nullptr) return 0;
  int gpus = 0;
  while (const dirent* entry = ::readdir(dev)) {
    std::string_view name(entry->d_name);
    if (name.size() > 6 && name.starts_with("nvidia") &&
        name.find_first_not_of("0123456789", 6) == std::string_view::npos) {
      ++gpus;
    }
  }
  ::closedir(dev);
  return gpus;
}

// torchrun takes IPv6 addresses bare; accept them bracketed too.
std::string bare_host(std::string_view host) {
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  return std::string(host);
}

int cores() {
  return std::max(1U, std::thread::hardware_concurrency());
}

// torchrun's --nproc-per-node values.
int parse_nproc(std::string_view name, std::string_view text, const config::EnvLookup& env) {
  if (text == "cpu") return cores();
  if (text == "gpu" || text == "auto") {
    const int gpus = nvidia_gpus(env);
    if (gpus > 0) return gpus;
    if (text == "gpu") {
      throw std::invalid_argument(fmt::format("{}=gpu but this node shows no NVIDIA GPU", name));
    }
    return cores();
  }
  return parse_count(name, text, 1, 1 << 16);
}

// "N" or "MIN:MAX" (MIN <= MAX): the fewest and the most nodes.
std::pair<int, int> parse_nnodes(std::string_view name, std::string_view text) {
  const auto colon = text.find(':');
  if (colon == std::string_view::npos) {
    const int n = parse_count(name, text, 1, 1 << 16);
    return {n, n};
  }
  const int low = parse_count(name, text.substr(0, colon), 1, 1 << 16);
  const int high = parse_count(name, text.substr(colon + 1), 1, 1 << 16);
  if (low > high) {
    throw std::invalid_argument(
        fmt::format("{}='{}' asks for at least more nodes than at most", name, text));
  }
  return {low, high};
}

std::optional<std::string> apply_pet(LaunchOptions& o, GivenFlags& given,
                                     const config::EnvLookup& env) {
  constexpr std::string_view kNames[] = {"PET_NNODES", "PET_NPROC_PER_NODE", "PET_NODE_RANK",
                                         "PET_MASTER_ADDR", "PET_MASTER_PORT"};
  std::vector<std::string> read_from;
  for (std::string_view name : kNames) {
    auto value = read(env, name);
    if (!value) continue;
    read_from.push_back(fmt::format("{}={}", name, *value));
    // Each value is checked even where a flag overrides it: a malformed one is a mistake.
    if (name == "PET_NNODES") {
      const auto [fewest, most] = parse_nnodes(name, *value);
      if (!std::exchange(given.nnodes, true)) {
        o.min_nnodes = fewest;
        o.nnodes = most;
      }
    } else if (name == "PET_NPROC_PER_NODE") {
      const int nproc = parse_nproc(name, *value, env);
      if (!std::exchange(given.nproc_per_node, true)) o.nproc_per_node = nproc;
    } else if (name == "PET_NODE_RANK") {
      const int node_rank = parse_count(name, *value, 0, (1 << 16) - 1);
      if (!std::exchange(given.node_rank, true)) o.node_rank = node_rank;
    } else if (name == "PET_MASTER_ADDR") {
      if (!std::exchange(given.master_addr, true)) o.master_addr = bare_host(*value);
    } else {
      const auto port = static_cast<std::uint16_t>(parse_count(name, *value, 1, 65535));
      if (!std::exchange(given.master_port, true)) o.master_port = port;
    }
  }
  if (read_from.empty()) return std::nullopt;
  // Operators older than the Training Operator 1.7 name node 0 only in MASTER_ADDR and
  // MASTER_PORT.
  for (auto [name, is_set] : {std::pair{std::string_view("MASTER_ADDR"), &given.master_addr},
                              std::pair{std::string_view("MASTER_PORT"), &given.master_port}}) {
    auto value = read(env, name);
    if (!value || std::exchange(*is_set, true)) continue;
    read_from.push_back(fmt::format("{}={}", name, *value));
    if (name == "MASTER_ADDR") {
      o.master_addr = bare_host(*value);
    } else {
      o.master_port = static_cast<std::uint16_t>(parse_count(name, *value, 1, 65535));
    }
  }
  // What the flags' checks would say, said of the variables the values came from.
  const std::string from = fmt::format("{}", fmt::join(read_from, " "));
  if (o.node_rank >= o.nnodes) {
    throw std::invalid_argument(fmt::format(
        "node rank {} is not below the {} node(s) of the job ({})", o.node_rank, o.nnodes, from));
  }
  if (o.nnodes > 1 && o.master_addr.empty()) {
    throw std::invalid_argument(fmt::format(
        "{} node(s) but no address of node 0: set PET_MASTER_ADDR (or MASTER_ADDR) ({})", o.nnodes,
        from));
  }
  return fmt::format("torchrun's PET_* variables (Kubeflow): {}", from);
}

std::optional<std::string> apply_slurm(LaunchOptions& o, GivenFlags& given,
                                       const config::EnvLookup& env) {
  if (given.nnodes && given.node_rank && given.master_addr && given.master_port) {
    return std::nullopt;  // the command line says it all
  }
  std::optional<transport::LaunchInfo> step;
  try {
    step = transport::parse_slurm_step(env);
  } catch (const Error& e) {
    throw std::invalid_argument(e.detail());
  }
  if (!step) return std::nullopt;
  if (step->local_world_size != 1) {
    throw std::invalid_argument(fmt::format(
        "srun started {} tasks on this node ({}): braid-run starts a node's ranks itself, so "
        "srun should start one braid-run per node (srun --ntasks-per-node 1 braid-run -n RANKS "
        "...), or start the program itself without braid-run",
        step->local_world_size, step->description));
  }
  if (!std::exchange(given.nnodes, true)) o.nnodes = step->num_nodes;
  if (!std::exchange(given.node_rank, true)) o.node_rank = step->node_rank;
  if (!std::exchange(given.master_addr, true)) o.master_addr = step->store_host;
  if (!std::exchange(given.master_port, true)) o.master_port = step->store_port;
  return fmt::format("srun's step ({})", step->description);
}

}  // namespace

std::optional<std::string> apply_launcher_environment(LaunchOptions& options, GivenFlags& given,
                                                      const config::EnvLookup& env) {
  if (auto line = apply_pet(options, given, env)) return line;
  return apply_slurm(options, given, env);
}

}  // namespace braid::launcher
