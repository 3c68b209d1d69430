#include "launch_environment.hpp"

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

// /dev/nvidia0, /dev/nvidia1, ...: one per GPU the NVIDIA driver shows this node.
int nvidia_gpus() {
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

int cores() {
  return std::max(1U, std::thread::hardware_concurrency());
}

// torchrun's --nproc-per-node values.
int parse_nproc(std::string_view name, std::string_view text) {
  if (text == "cpu") return cores();
  if (text == "gpu" || text == "auto") {
    const int gpus = nvidia_gpus();
    if (gpus > 0) return gpus;
    if (text == "gpu") {
      throw std::invalid_argument(fmt::format("{}=gpu but this node shows no NVIDIA GPU", name));
    }
    return cores();
  }
  return parse_count(name, text, 1, 1 << 16);
}

// "N" or "N:N"; elastic membership (MIN:MAX with MIN < MAX) needs a rendezvous braid-run
// does not have.
int parse_nnodes(std::string_view name, std::string_view text) {
  const auto colon = text.find(':');
  if (colon == std::string_view::npos) return parse_count(name, text, 1, 1 << 16);
  const int low = parse_count(name, text.substr(0, colon), 1, 1 << 16);
  const int high = parse_count(name, text.substr(colon + 1), 1, 1 << 16);
  if (low != high) {
    throw std::invalid_argument(fmt::format(
        "{}='{}' asks for a number of nodes that changes; braid-run starts a fixed number: "
        "set it to one number",
        name, text));
  }
  return low;
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
      const int nnodes = parse_nnodes(name, *value);
      if (!std::exchange(given.nnodes, true)) o.nnodes = nnodes;
    } else if (name == "PET_NPROC_PER_NODE") {
      const int nproc = parse_nproc(name, *value);
      if (!std::exchange(given.nproc_per_node, true)) o.nproc_per_node = nproc;
    } else if (name == "PET_NODE_RANK") {
      const int node_rank = parse_count(name, *value, 0, (1 << 16) - 1);
      if (!std::exchange(given.node_rank, true)) o.node_rank = node_rank;
    } else if (name == "PET_MASTER_ADDR") {
      if (!std::exchange(given.master_addr, true)) o.master_addr = *value;
    } else {
      const auto port = static_cast<std::uint16_t>(parse_count(name, *value, 1, 65535));
      if (!std::exchange(given.master_port, true)) o.master_port = port;
    }
  }
  if (read_from.empty()) return std::nullopt;
  // A PyTorchJob names node 0 as torchrun's static rendezvous reads it, not in PET_*.
  for (auto [name, is_set] : {std::pair{std::string_view("MASTER_ADDR"), &given.master_addr},
                              std::pair{std::string_view("MASTER_PORT"), &given.master_port}}) {
    auto value = read(env, name);
    if (!value || std::exchange(*is_set, true)) continue;
    read_from.push_back(fmt::format("{}={}", name, *value));
    if (name == "MASTER_ADDR") {
      o.master_addr = *value;
    } else {
      o.master_port = static_cast<std::uint16_t>(parse_count(name, *value, 1, 65535));
    }
  }
  return fmt::format("torchrun's PET_* variables (Kubeflow): {}", fmt::join(read_from, " "));
}

std::optional<std::string> apply_slurm(LaunchOptions& o, GivenFlags& given,
                                       const config::EnvLookup& env) {
  if (!read(env, "SLURM_PROCID")) return std::nullopt;  // an allocation, not a job step
  // The step's counts first: srun -E leaves the allocation's in SLURM_NTASKS/SLURM_NNODES.
  const auto pick = [&](std::string_view step, std::string_view job) {
    auto value = read(env, step);
    return value ? std::pair{step, *value} : std::pair{job, read(env, job).value_or("")};
  };
  const auto [tasks_name, tasks] = pick("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS");
  const auto [nodes_name, nodes] = pick("SLURM_STEP_NUM_NODES", "SLURM_NNODES");
  const std::string node = read(env, "SLURM_NODEID").value_or("");
  if (tasks.empty() || nodes.empty() || node.empty()) {
    throw std::invalid_argument(fmt::format(
        "SLURM_PROCID is set but not all of {} ('{}'), {} ('{}') and SLURM_NODEID ('{}') are",
        tasks_name, tasks, nodes_name, nodes, node));
  }
  const int task_count = parse_count(tasks_name, tasks, 1, 1 << 30);
  const int node_count = parse_count(nodes_name, nodes, 1, 1 << 16);
  const int node_id = parse_count("SLURM_NODEID", node, 0, node_count - 1);
  if (task_count != node_count) {
    throw std::invalid_argument(fmt::format(
        "{}={} over {}={}: braid-run starts a node's ranks itself, so srun should start one "
        "braid-run per node (srun --ntasks-per-node 1 braid-run -n RANKS ...), or start the "
        "program itself without braid-run",
        tasks_name, task_count, nodes_name, node_count));
  }
  if (!std::exchange(given.nnodes, true)) o.nnodes = node_count;
  if (!std::exchange(given.node_rank, true)) o.node_rank = node_id;
  std::string store = "from the flags";
  if (!given.master_addr || !given.master_port) {
    std::optional<transport::HostPort> address;
    try {
      address = transport::slurm_store_address(env);
    } catch (const Error& e) {
      throw std::invalid_argument(e.detail());
    }
    if (address) {
      if (!std::exchange(given.master_addr, true)) o.master_addr = address->host;
      if (!std::exchange(given.master_port, true)) o.master_port = address->port;
      store = fmt::format("{} (the step's first node; port from SLURM_JOB_ID)",
                          transport::format_host_port(address->host, address->port));
    }
  }
  return fmt::format("Slurm's {}={} SLURM_NODEID={}; store {}", nodes_name, node_count, node_id,
                     store);
}

}  // namespace

std::optional<std::string> apply_launcher_environment(LaunchOptions& options, GivenFlags& given,
                                                      const config::EnvLookup& env) {
  if (auto line = apply_pet(options, given, env)) return line;
  return apply_slurm(options, given, env);
}

}  // namespace braid::launcher
