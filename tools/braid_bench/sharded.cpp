#include "sharded.hpp"

#include <chrono>
#include <filesystem>
#include <iostream>
#include <map>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <thread>

#include <fmt/format.h>

#include "json_fields.hpp"
#include "list_argument.hpp"
#include "median.hpp"
#include "subprocess.hpp"

namespace braid::bench {
namespace {

struct ShardedOptions {
  std::vector<int> ranks{2, 4};
  std::vector<std::string> strategies{"none", "optimizer", "grad", "full", "no_shard"};
  std::string model = "mlp";
  int hidden = 512;
  int layers = 5;
  int batch = 32;
  int steps = 20;
  int rounds = 3;
  std::string optimizer = "adam";
  bool json = false;
};

ShardedOptions parse_options(const std::vector<std::string>& args) {
  ShardedOptions o;
  const CountOptions counts{{"--hidden", {&o.hidden, 8}},
                            {"--layers", {&o.layers, 1}},
                            {"--batch", {&o.batch, 1}},
                            {"--steps", {&o.steps, 4}},
                            {"--rounds", {&o.rounds, 1}}};
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--json") {
      o.json = true;
      continue;
    }
    if (i + 1 >= args.size()) throw std::invalid_argument(a + " needs a value");
    const std::string& value = args[++i];
    if (a == "--ranks") {
      o.ranks.clear();
      for (const auto& r : split_list(value)) o.ranks.push_back(count_argument(a, r, 2, 64));
    } else if (a == "--strategies") {
      o.strategies = split_list(value);
      for (const auto& s : o.strategies) {
        if (s != "none" && s != "optimizer" && s != "grad" && s != "full" && s != "no_shard")
          throw std::invalid_argument("--strategies none,optimizer,grad,full,no_shard, not " + s);
      }
    } else if (a == "--model") {
      if (value != "mlp" && value != "transformer")
        throw std::invalid_argument("--model mlp|transformer");
      o.model = value;
    } else if (a == "--optimizer") {
      if (value != "adam" && value != "sgd") throw std::invalid_argument("--optimizer adam|sgd");
      o.optimizer = value;
    } else if (!take_count(counts, a, value)) {
      throw std::invalid_argument("unknown option " + a);
    }
  }
  if (o.ranks.empty() || o.strategies.empty())
    throw std::invalid_argument("--ranks and --strategies need at least one item");
  return o;
}

std::string runner_name(const std::string& strategy) {
  if (strategy == "none") return "DDP";
  if (strategy == "optimizer") return "ZeRO-1 (DDP + ZeroRedundancyOpt)";
  if (strategy == "grad") return "FSDP SHARD_GRAD_OP (ZeRO-2)";
  if (strategy == "full") return "FSDP FULL_SHARD (ZeRO-3)";
  return "FSDP NO_SHARD";
}

std::optional<std::string> run_config(const ShardedOptions& o, int ranks,
                                      const std::string& strategy) {
  // BLAS on one thread, as libtorch's intra-op threads are (see tp.cpp).
  const std::vector<std::string> argv{"env",
                                      "OPENBLAS_NUM_THREADS=1",
                                      "OMP_NUM_THREADS=1",
                                      sibling_program("braid-run"),
                                      "-n",
                                      std::to_string(ranks),
                                      sibling_program("braid-bench-sharded-worker"),
                                      "--sharding",
                                      strategy,
                                      "--model",
                                      o.model,
                                      "--hidden",
                                      std::to_string(o.hidden),
                                      "--layers",
                                      std::to_string(o.layers),
                                      "--batch",
                                      std::to_string(o.batch),
                                      "--steps",
                                      std::to_string(o.steps),
                                      "--optimizer",
                                      o.optimizer};
  const CommandResult result = run_command(argv, std::chrono::seconds(600));
  std::stringstream lines(result.output);
  for (std::string line; std::getline(lines, line);) {
    const auto brace = line.find("{\"sharded_step\"");
    if (brace != std::string::npos && result.exit_code == 0) return line.substr(brace);
  }
  std::cerr << fmt::format("braid-bench sharded: {} on {} ranks printed no result (exit {}):\n{}\n",
                           strategy, ranks, result.exit_code, result.output);
  return std::nullopt;
}

// The medians over the rounds of every number a worker prints.
std::map<std::string, double> medians(const std::vector<std::string>& lines) {
  static const std::vector<std::string> keys{"parameters",           "step_ms",
                                             "exposed_ms",           "communication_ms",
                                             "estimate_bytes",       "estimate_transient_bytes",
                                             "held_parameter_bytes", "held_gradient_bytes",
                                             "held_optimizer_bytes", "held_bytes",
                                             "peak_rss_bytes",       "loss"};
  std::map<std::string, double> figures;
  for (const auto& key : keys) {
    std::vector<double> values;
    for (const auto& line : lines) values.push_back(json_number(line, key).value_or(0));
    figures[key] = median(values);
  }
  return figures;
}

double mib(double bytes) {
  return bytes / (1 << 20);
}

}  // namespace

int run_sharded(const std::vector<std::string>& args) {
  const ShardedOptions o = parse_options(args);
  if (!std::filesystem::exists(sibling_program("braid-bench-sharded-worker"))) {
    std::cerr << "braid-bench sharded: the worker is built with libtorch only\n";
    return 1;
  }
  std::map<std::pair<int, std::string>, std::vector<std::string>> lines;
  for (int round = 0; round < o.rounds; ++round) {
    for (int ranks : o.ranks) {
      for (const auto& strategy : o.strategies) {
        wait_until_quiet();
        if (auto line = run_config(o, ranks, strategy)) lines[{ranks, strategy}].push_back(*line);
      }
    }
  }
  const unsigned cores = std::thread::hardware_concurrency();
  if (!o.json) {
    std::cout << fmt::format(
        "sharded data parallelism: the main job's {} ({} wide, {} layers; each hidden layer or "
        "block one unit), batch {} per rank, {}, f32; medians over {} steps (after a warm-up), "
        "then over {} rounds taken in turns; {} core(s) here.\n\n",
        o.model, o.hidden, o.layers, o.batch, o.optimizer, o.steps, o.rounds, cores);
    std::cout << fmt::format("{:<33} {:>5} {:>8} {:>8} {:>8} {:>9} {:>9} {:>7} {:>9} {:>9}\n",
                             "runner", "ranks", "step ms", "exposed", "comm ms", "formula",
                             "held MiB", "held/", "transient", "peak RSS");
    std::cout << fmt::format("{:<33} {:>5} {:>8} {:>8} {:>8} {:>9} {:>9} {:>7} {:>9} {:>9}\n", "",
                             "", "", "ms", "", "MiB", "", "DDP's", "MiB", "MiB");
  }
  int status = 0;
  for (int ranks : o.ranks) {
    std::optional<double> ddp_held;
    if (lines.count({ranks, "none"})) ddp_held = medians(lines[{ranks, "none"}])["held_bytes"];
    for (const auto& strategy : o.strategies) {
      if (!lines.count({ranks, strategy})) {
        status = 1;
        continue;
      }
      auto f = medians(lines[{ranks, strategy}]);
      std::optional<double> of_ddp;
      if (ddp_held && *ddp_held > 0) of_ddp = f["held_bytes"] / *ddp_held;
      if (o.json) {
        std::string line = fmt::format(
            "{{\"runner\":\"{}\",\"sharding\":\"{}\",\"ranks\":{},\"step_ms\":{:.3f},"
            "\"exposed_ms\":{:.3f},\"communication_ms\":{:.3f},\"estimate_bytes\":{:.0f},"
            "\"estimate_transient_bytes\":{:.0f},\"held_bytes\":{:.0f},"
            "\"held_parameter_bytes\":{:.0f},\"held_gradient_bytes\":{:.0f},"
            "\"held_optimizer_bytes\":{:.0f},\"peak_rss_bytes\":{:.0f},\"loss\":{:.6f}",
            runner_name(strategy), strategy, ranks, f["step_ms"], f["exposed_ms"],
            f["communication_ms"], f["estimate_bytes"], f["estimate_transient_bytes"],
            f["held_bytes"], f["held_parameter_bytes"], f["held_gradient_bytes"],
            f["held_optimizer_bytes"], f["peak_rss_bytes"], f["loss"]);
        if (of_ddp) line += fmt::format(",\"held_of_ddp\":{:.3f}", *of_ddp);
        std::cout << line << "}" << std::endl;
        continue;
      }
      std::cout << fmt::format(
          "{:<33} {:>5} {:>8.2f} {:>8.2f} {:>8.2f} {:>9.2f} {:>9.2f} {:>7} {:>9.2f} {:>9.1f}\n",
          runner_name(strategy), ranks, f["step_ms"], f["exposed_ms"], f["communication_ms"],
          mib(f["estimate_bytes"]), mib(f["held_bytes"]),
          of_ddp ? fmt::format("{:.2f}", *of_ddp) : "-", mib(f["estimate_transient_bytes"]),
          mib(f["peak_rss_bytes"]));
    }
  }
  if (!o.json) {
    std::cout << fmt::format(
        "\nformula: the ZeRO paper's model state per rank (parameters, gradients, optimizer "
        "state; braid/dp/model_state_memory.hpp), transient beside it (the largest unit's whole "
        "gradients, and parameters under FULL_SHARD). held: the tensors the rank with the most "
        "held after its last step, FSDP's gathered units at the peak sampled as each unit ran "
        "forward and began backward (ZeRO-1's all-gather buffer lives inside its step only). "
        "peak RSS: the "
        "process's VmHWM (libtorch, braid and the activations too), the most of any rank. "
        "exposed: communication no compute span covers (braid-trace's definition) per rank and "
        "step (FSDP traces each unit's forward and backward as compute spans; ZeRO-1's all-gather "
        "after the optimizer blocks the step). comm: the traced "
        "communication. {} ranks on {} core(s): ranks beyond the cores share them, so their "
        "step times measure contention as much as communication.\n",
        o.ranks.back(), cores);
  }
  return status;
}

}  // namespace braid::bench
