// braid-bench sharded: the main job's model trained under DDP, DDP with
// ZeroRedundancyOptimizer (ZeRO-1) and FullyShardedDataParallel's SHARD_GRAD_OP (ZeRO-2),
// FULL_SHARD (ZeRO-3) and NO_SHARD, on 2 and 4 ranks, runners taking turns: step time, exposed
// and traced communication, the model state per rank the ZeRO formulas estimate beside what
// the ranks held, and the peak resident size.

#include <chrono>
#include <map>
#include <optional>
#include <thread>

#include <fmt/format.h>

#include "../harness/report.hpp"
#include "../harness/results.hpp"
#include "../harness/rounds.hpp"
#include "../harness/subprocess.hpp"
#include "modes.hpp"

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

OptionTable table(ShardedOptions& o) {
  return {counts("--ranks", o.ranks, 2, 64),
          words("--strategies", o.strategies, {"none", "optimizer", "grad", "full", "no_shard"}),
          word("--model", o.model, {"mlp", "transformer"}),
          count("--hidden", o.hidden, 8),
          count("--layers", o.layers, 1),
          count("--batch", o.batch, 1),
          count("--steps", o.steps, 4),
          count("--rounds", o.rounds, 1),
          word("--optimizer", o.optimizer, {"adam", "sgd"}),
          flag("--json", o.json)};
}

std::string runner_name(const std::string& strategy) {
  if (strategy == "none") return "DDP";
  if (strategy == "optimizer") return "ZeRO-1 (DDP + ZeroRedundancyOpt)";
  if (strategy == "grad") return "FSDP SHARD_GRAD_OP (ZeRO-2)";
  if (strategy == "full") return "FSDP FULL_SHARD (ZeRO-3)";
  return "FSDP NO_SHARD";
}

std::optional<std::string> run_config(ShardedOptions& o, int ranks, const std::string& strategy) {
  std::vector<std::string> args{"--sharding", strategy};
  for (auto& a : arguments(
           table(o), {"--model", "--hidden", "--layers", "--batch", "--steps", "--optimizer"}))
    args.push_back(a);
  return result_line(run_command(under_braid_run(ranks, "braid-bench-sharded-worker", args, true),
                                 std::chrono::seconds(600)),
                     "sharded_step", "sharded", fmt::format("{} on {} ranks", strategy, ranks));
}

// The medians over the rounds of every number a worker prints.
std::map<std::string, double> figures_of(const std::vector<std::string>& lines) {
  return medians(lines,
                 {"parameters", "step_ms", "exposed_ms", "communication_ms", "estimate_bytes",
                  "estimate_transient_bytes", "held_parameter_bytes", "held_gradient_bytes",
                  "held_optimizer_bytes", "held_bytes", "peak_rss_bytes", "loss"});
}

double mib(double bytes) {
  return bytes / (1 << 20);
}

int run(ShardedOptions& o) {
  if (!have_worker("sharded", "braid-bench-sharded-worker")) return 1;
  std::vector<std::pair<int, std::string>> configs;
  for (int ranks : o.ranks) {
    for (const auto& strategy : o.strategies) configs.emplace_back(ranks, strategy);
  }
  const auto runs = run_rounds(o.rounds, configs,
                               [&](const auto& c) { return run_config(o, c.first, c.second); });
  std::map<std::pair<int, std::string>, std::vector<std::string>> lines;
  for (std::size_t c = 0; c < configs.size(); ++c) {
    if (!runs[c].empty()) lines[configs[c]] = runs[c];
  }
  const unsigned cores = std::thread::hardware_concurrency();
  const Report report(o.json,
                      {"runner", "ranks", "step ms", "exposed\nms", "comm ms", "formula\nMiB",
                       "held MiB", "held/\nDDP's", "transient\nMiB", "peak RSS\nMiB"},
                      {-33, 5, 8, 8, 8, 9, 9, 7, 9, 9});
  report.say(fmt::format(
      "sharded data parallelism: the main job's {} ({} wide, {} layers; each hidden layer or "
      "block one unit), batch {} per rank, {}, f32; medians over {} steps (after a warm-up), "
      "then over {} rounds taken in turns; {} core(s) here.\n\n",
      o.model, o.hidden, o.layers, o.batch, o.optimizer, o.steps, o.rounds, cores));
  report.heading();
  int status = 0;
  for (int ranks : o.ranks) {
    std::optional<double> ddp_held;
    if (lines.count({ranks, "none"})) ddp_held = figures_of(lines[{ranks, "none"}])["held_bytes"];
    for (const auto& strategy : o.strategies) {
      if (!lines.count({ranks, strategy})) {
        status = 1;
        continue;
      }
      auto f = figures_of(lines[{ranks, strategy}]);
      std::optional<double> of_ddp;
      if (ddp_held && *ddp_held > 0) of_ddp = f["held_bytes"] / *ddp_held;
      JsonLine json;
      json.add("runner", runner_name(strategy)).add("sharding", strategy).add("ranks", ranks);
      json.add_each(f, {"step_ms", "exposed_ms", "communication_ms"}, "{:.3f}")
          .add_each(
              f,
              {"estimate_bytes", "estimate_transient_bytes", "held_bytes", "held_parameter_bytes",
               "held_gradient_bytes", "held_optimizer_bytes", "peak_rss_bytes"},
              "{:.0f}")
          .add_each(f, {"loss"}, "{:.6f}");
      if (of_ddp) json.add("held_of_ddp", *of_ddp, "{:.3f}");
      report.row(json.str(), {runner_name(strategy), std::to_string(ranks), fixed(f["step_ms"], 2),
                              fixed(f["exposed_ms"], 2), fixed(f["communication_ms"], 2),
                              fixed(mib(f["estimate_bytes"]), 2), fixed(mib(f["held_bytes"]), 2),
                              fixed(of_ddp, 2), fixed(mib(f["estimate_transient_bytes"]), 2),
                              fixed(mib(f["peak_rss_bytes"]), 1)});
    }
  }
  report.say(fmt::format(
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
      o.ranks.back(), cores));
  return status;
}

}  // namespace

Mode sharded_mode() {
  return describe<ShardedOptions>(
      {.name = "sharded",
       .about = "the main job's model under DDP, ZeRO-1 (ZeroRedundancyOptimizer) and FSDP's "
                "SHARD_GRAD_OP, FULL_SHARD and NO_SHARD on 2 and 4 ranks: step time, exposed and "
                "traced communication, model state per rank by the ZeRO formulas beside what the "
                "ranks held, peak resident size",
       .options = table,
       .run = run});
}

}  // namespace braid::bench
