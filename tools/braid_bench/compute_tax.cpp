#include "compute_tax.hpp"

#include <algorithm>
#include <array>
#include <chrono>
#include <filesystem>
#include <iostream>
#include <map>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string_view>

#include <fmt/format.h>

#include "json_fields.hpp"
#include "list_argument.hpp"
#include "median.hpp"
#include "subprocess.hpp"

namespace braid::bench {
namespace {

struct ComputeTaxOptions {
  std::vector<std::string> models{"mlp", "transformer"};
  std::vector<std::string> optimizers{"sgd", "adam"};
  int rounds = 3;
  int steps = 40;
  bool json = false;
};

ComputeTaxOptions parse_options(const std::vector<std::string>& args) {
  ComputeTaxOptions o;
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--json") {
      o.json = true;
      continue;
    }
    if (i + 1 >= args.size()) throw std::invalid_argument(a + " needs a value");
    const std::string& value = args[++i];
    if (a == "--models") {
      o.models = split_list(value);
      for (const auto& m : o.models) {
        if (m != "mlp" && m != "transformer")
          throw std::invalid_argument("--models takes mlp,transformer, not '" + m + "'");
      }
    } else if (a == "--optimizers") {
      o.optimizers = split_list(value);
      for (const auto& m : o.optimizers) {
        if (m != "sgd" && m != "adam")
          throw std::invalid_argument("--optimizers takes sgd,adam, not '" + m + "'");
      }
    } else if (a == "--rounds") {
      o.rounds = count_argument(a, value, 1, 100);
    } else if (a == "--steps") {
      o.steps = count_argument(a, value, 4, 100000);
    } else {
      throw std::invalid_argument("unknown option " + a);
    }
  }
  if (o.models.empty() || o.optimizers.empty())
    throw std::invalid_argument("--models and --optimizers need at least one entry");
  return o;
}

// The runners, in the order they take turns and are printed.
constexpr std::array<std::string_view, 3> kRunners{"plain", "braid", "python"};

// The worker's JSON line (braid-run prefixes the braid worker's with "[0] ").
std::optional<std::string> result_line(const CommandResult& result, std::string_view runner) {
  std::stringstream lines(result.output);
  for (std::string line; std::getline(lines, line);) {
    const auto brace = line.find("{\"compute_step\"");
    if (brace != std::string::npos && result.exit_code == 0) return line.substr(brace);
  }
  std::cerr << fmt::format(
      "braid-bench compute-tax: the {} runner printed no result (exit {}):\n{}\n", runner,
      result.exit_code, result.output);
  return std::nullopt;
}

std::optional<std::string> run_runner(std::string_view runner, const std::string& model,
                                      const std::string& optimizer, int steps) {
  const std::vector<std::string> step_arguments{"--model", model,     "--optimizer",
                                                optimizer, "--steps", std::to_string(steps)};
  std::vector<std::string> argv;
  if (runner == "plain") {
    argv = {sibling_program("braid-bench-compute-plain")};
  } else if (runner == "braid") {
    // One rank under the launcher, as the main job's ranks start.
    argv = {sibling_program("braid-run"), "-n", "1", sibling_program("braid-bench-compute-braid")};
  } else {
    const std::optional<std::string> python = torch_python();
    const std::string script = sibling_program("braid-bench-compute-peer.py");
    if (!python || !std::filesystem::exists(script)) return std::nullopt;
    argv = {*python, script};
  }
  argv.insert(argv.end(), step_arguments.begin(), step_arguments.end());
  return result_line(run_command(argv, std::chrono::seconds(600)), runner);
}

struct RunnerFigures {
  double step_ms = 0;
  double optimizer_ms = 0;
  double faults_per_step = 0;
};

RunnerFigures medians(const std::vector<std::string>& lines) {
  std::vector<double> step, optimizer, faults;
  for (const auto& line : lines) {
    step.push_back(json_number(line, "step_ms").value_or(0));
    optimizer.push_back(json_number(line, "optimizer_ms").value_or(0));
    faults.push_back(json_number(line, "faults_per_step").value_or(0));
  }
  return {median(step), median(optimizer), median(faults)};
}

}  // namespace

int run_compute_tax(const std::vector<std::string>& args) {
  const ComputeTaxOptions o = parse_options(args);
  if (!std::filesystem::exists(sibling_program("braid-bench-compute-plain"))) {
    std::cerr << "braid-bench compute-tax: the workers are built with libtorch only\n";
    return 1;
  }
  if (!torch_python()) std::cerr << "braid-bench compute-tax: no Python with torch; no peer\n";
  if (!o.json) {
    std::cout << fmt::format(
        "compute tax: one training step with no communication (zero_grad, forward, MSE loss, "
        "backward, optimizer step), batch 32, one intra-op thread; medians over {} steps, then "
        "over {} rounds taken in turns. plain: a libtorch C++ program without braid; braid: a "
        "braid process (Runtime, World, DistributedDataParallel under no_sync()); python: "
        "PyTorch.\n\n",
        o.steps, o.rounds);
    std::cout << fmt::format("{:<12} {:<5} {:>20} {:>20} {:>20} {:>14} {:>10}\n", "model", "opt",
                             "plain ms (faults)", "braid ms (faults)", "python ms (faults)",
                             "braid/fastest", "braid/plain");
  }
  int status = 0;
  for (const auto& model : o.models) {
    for (const auto& optimizer : o.optimizers) {
      std::map<std::string_view, std::vector<std::string>> lines;
      for (int round = 0; round < o.rounds; ++round) {
        for (const std::string_view runner : kRunners) {
          wait_until_quiet();
          if (auto line = run_runner(runner, model, optimizer, o.steps)) {
            lines[runner].push_back(*line);
          }
        }
      }
      if (lines["braid"].empty() || lines["plain"].empty()) {
        status = 1;
        continue;
      }
      std::map<std::string_view, RunnerFigures> figures;
      for (const auto& [runner, runs] : lines) {
        if (!runs.empty()) figures[runner] = medians(runs);
      }
      double fastest = figures["braid"].step_ms;
      for (const auto& [runner, f] : figures) fastest = std::min(fastest, f.step_ms);
      const double braid_over_fastest = figures["braid"].step_ms / fastest;
      const double braid_over_plain = figures["braid"].step_ms / figures["plain"].step_ms;
      if (o.json) {
        std::string line = fmt::format("{{\"model\":\"{}\",\"optimizer\":\"{}\"", model, optimizer);
        for (const auto& [runner, f] : figures) {
          line += fmt::format(
              ",\"{0}_step_ms\":{1:.3f},\"{0}_optimizer_ms\":{2:.3f},\"{0}_faults_per_step\":{3:."
              "1f}",
              runner, f.step_ms, f.optimizer_ms, f.faults_per_step);
        }
        line += fmt::format(",\"braid_over_fastest\":{:.3f},\"braid_over_plain\":{:.3f}}}",
                            braid_over_fastest, braid_over_plain);
        std::cout << line << std::endl;
        continue;
      }
      auto cell = [&](std::string_view runner) {
        if (!figures.count(runner)) return std::string("-");
        const RunnerFigures& f = figures[runner];
        return fmt::format("{:.2f} ({:.0f})", f.step_ms, f.faults_per_step);
      };
      std::cout << fmt::format("{:<12} {:<5} {:>20} {:>20} {:>20} {:>14} {:>10}\n", model,
                               optimizer, cell("plain"), cell("braid"), cell("python"),
                               fmt::format("{:.2f}x", braid_over_fastest),
                               fmt::format("{:.2f}x", braid_over_plain))
                << std::flush;
    }
  }
  if (!o.json) {
    std::cout << "\nfaults: minor page faults per step (memory the step's temporaries took back "
                 "from the kernel); goal: braid/fastest <= 1.03.\n";
  }
  return status;
}

}  // namespace braid::bench
