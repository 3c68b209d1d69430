// braid-bench compute-tax: what a braid process costs a training step it does not
// synchronise. The same step (the main job's models, SGD and Adam, one fixed batch, one
// intra-op thread) is timed in a plain libtorch C++ program with no braid linked, in a braid
// process (Runtime, World, DistributedDataParallel, every step under no_sync()) and in Python
// PyTorch, taking turns, with each runner's minor page faults per step; the ratio is braid's
// step time over the fastest of the three (goal: at most 1.03).

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <iostream>
#include <map>
#include <optional>
#include <string_view>

#include <fmt/format.h>

#include "../harness/report.hpp"
#include "../harness/results.hpp"
#include "../harness/rounds.hpp"
#include "../harness/subprocess.hpp"
#include "modes.hpp"

namespace braid::bench {
namespace {

struct ComputeTaxOptions {
  std::vector<std::string> models{"mlp", "transformer"};
  std::vector<std::string> optimizers{"sgd", "adam"};
  int rounds = 3;
  int steps = 40;
  bool json = false;
};

OptionTable table(ComputeTaxOptions& o) {
  return {words("--models", o.models, {"mlp", "transformer"}),
          words("--optimizers", o.optimizers, {"sgd", "adam"}), count("--rounds", o.rounds, 1, 100),
          count("--steps", o.steps, 4), flag("--json", o.json)};
}

// The runners, in the order they take turns and are printed.
const std::vector<std::string_view> kRunners{"plain", "braid", "python"};

std::optional<std::string> run_runner(std::string_view runner, const std::string& model,
                                      const std::string& optimizer, int steps) {
  const std::vector<std::string> step_arguments{"--model", model,     "--optimizer",
                                                optimizer, "--steps", std::to_string(steps)};
  std::vector<std::string> argv;
  if (runner == "plain") {
    argv = {sibling_program("braid-bench-compute-plain")};
  } else if (runner == "braid") {
    // One rank under the launcher, as the main job's ranks start.
    argv = under_braid_run(1, "braid-bench-compute-braid", {});
  } else if (auto peer = python_peer("braid-bench-compute-peer.py")) {
    argv = *peer;
  } else {
    return std::nullopt;
  }
  argv.insert(argv.end(), step_arguments.begin(), step_arguments.end());
  return result_line(run_command(argv, std::chrono::seconds(600)), "compute_step", "compute-tax",
                     fmt::format("the {} runner", runner));
}

int run(ComputeTaxOptions& o) {
  if (!std::filesystem::exists(sibling_program("braid-bench-compute-plain"))) {
    std::cerr << "braid-bench compute-tax: the workers are built with libtorch only\n";
    return 1;
  }
  if (!torch_python()) std::cerr << "braid-bench compute-tax: no Python with torch; no peer\n";
  const Report report(o.json,
                      {"model", "opt", "plain ms (faults)", "braid ms (faults)",
                       "python ms (faults)", "braid/fastest", "braid/plain"},
                      {-12, -5, 20, 20, 20, 14, 10});
  report.say(fmt::format(
      "compute tax: one training step with no communication (zero_grad, forward, MSE loss, "
      "backward, optimizer step), batch 32, one intra-op thread; medians over {} steps, then "
      "over {} rounds taken in turns. plain: a libtorch C++ program without braid; braid: a "
      "braid process (Runtime, World, DistributedDataParallel under no_sync()); python: "
      "PyTorch.\n\n",
      o.steps, o.rounds));
  report.heading();
  int status = 0;
  for (const auto& model : o.models) {
    for (const auto& optimizer : o.optimizers) {
      const auto lines = run_rounds(o.rounds, kRunners, [&](std::string_view runner) {
        return run_runner(runner, model, optimizer, o.steps);
      });
      // Each runner's medians over the rounds, in kRunners's order ("braid" before "plain").
      std::map<std::string_view, std::map<std::string, double>> figures;
      for (std::size_t r = 0; r < kRunners.size(); ++r) {
        if (!lines[r].empty()) {
          figures[kRunners[r]] = medians(lines[r], {"step_ms", "optimizer_ms", "faults_per_step"});
        }
      }
      if (!figures.count("braid") || !figures.count("plain")) {
        status = 1;
        continue;
      }
      double fastest = figures["braid"]["step_ms"];
      for (auto& [runner, f] : figures) fastest = std::min(fastest, f["step_ms"]);
      const double braid_over_fastest = figures["braid"]["step_ms"] / fastest;
      const double braid_over_plain = figures["braid"]["step_ms"] / figures["plain"]["step_ms"];
      JsonLine json;
      json.add("model", model).add("optimizer", optimizer);
      for (auto& [runner, f] : figures) {
        const std::string prefix = std::string(runner) + "_";
        json.add_each(f, {"step_ms", "optimizer_ms"}, "{:.3f}", prefix)
            .add_each(f, {"faults_per_step"}, "{:.1f}", prefix);
      }
      json.add("braid_over_fastest", braid_over_fastest, "{:.3f}")
          .add("braid_over_plain", braid_over_plain, "{:.3f}");
      auto cell = [&](std::string_view runner) {
        if (!figures.count(runner)) return std::string("-");
        auto& f = figures[runner];
        return fmt::format("{:.2f} ({:.0f})", f["step_ms"], f["faults_per_step"]);
      };
      report.row(json.str(), {model, optimizer, cell("plain"), cell("braid"), cell("python"),
                              fixed(braid_over_fastest, 2, "x"), fixed(braid_over_plain, 2, "x")});
    }
  }
  report.say(
      "\nfaults: minor page faults per step (memory the step's temporaries took back "
      "from the kernel); goal: braid/fastest <= 1.03.\n");
  return status;
}

}  // namespace

Mode compute_tax_mode() {
  return describe<ComputeTaxOptions>(
      {.name = "compute-tax",
       .about = "one training step with no communication (the main job's MLP and transformer, SGD "
                "and Adam) in a plain libtorch program, a braid process and Python PyTorch, taking "
                "turns: step time, page faults, braid's ratios",
       .options = table,
       .run = run});
}

}  // namespace braid::bench
