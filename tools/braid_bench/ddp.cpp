#include "ddp.hpp"

#include <algorithm>
#include <filesystem>
#include <iostream>
#include <map>
#include <optional>
#include <sstream>
#include <stdexcept>

#include <fmt/format.h>

#include "subprocess.hpp"

namespace braid::bench {
namespace {

struct DdpOptions {
  int ranks = 2;
  int hidden = 1024;
  int layers = 8;
  int batch = 32;
  int steps = 30;
  int rounds = 3;
  std::string optimizer = "sgd";
};

std::optional<double> field(const std::string& line, const std::string& key);

// The run whose step time is the median of `runs` (their JSON lines).
std::optional<std::string> median_run(std::vector<std::string> runs) {
  if (runs.empty()) return std::nullopt;
  std::sort(runs.begin(), runs.end(), [](const std::string& a, const std::string& b) {
    return field(a, "step_ms").value_or(0) < field(b, "step_ms").value_or(0);
  });
  return runs[runs.size() / 2];
}

// The number after "key": in a one-line JSON object.
std::optional<double> field(const std::string& line, const std::string& key) {
  const auto at = line.find("\"" + key + "\":");
  if (at == std::string::npos) return std::nullopt;
  return std::stod(line.substr(at + key.size() + 3));
}

std::optional<std::string> json_line(const CommandResult& result, const std::string& who) {
  std::stringstream lines(result.output);
  for (std::string line; std::getline(lines, line);) {
    const auto brace = line.find("{\"sync\"");
    if (brace != std::string::npos) return line.substr(brace);
  }
  std::cerr << "braid-bench ddp: " << who << " printed no result (exit " << result.exit_code
            << "):\n"
            << result.output << "\n";
  return std::nullopt;
}

std::vector<std::string> model_arguments(const DdpOptions& o) {
  return {"--hidden",    std::to_string(o.hidden),
          "--layers",    std::to_string(o.layers),
          "--batch",     std::to_string(o.batch),
          "--steps",     std::to_string(o.steps),
          "--optimizer", o.optimizer};
}

std::optional<std::string> run_braid(const DdpOptions& o, const std::string& sync,
                                     const std::vector<std::string>& extra = {}) {
  const std::filesystem::path tools =
      std::filesystem::path(sibling_program("braid-run")).parent_path();
  const std::string trainer = (tools.parent_path() / "examples" / "ddp_train").string();
  std::vector<std::string> argv{sibling_program("braid-run"),
                                "-n",
                                std::to_string(o.ranks),
                                trainer,
                                "--bench",
                                "--sync",
                                sync};
  for (auto& a : model_arguments(o)) argv.push_back(a);
  for (auto& a : extra) argv.push_back(a);
  return json_line(run_command(argv, std::chrono::seconds(900)), "ddp_train --sync " + sync);
}

std::optional<std::string> run_pytorch(const DdpOptions& o) {
  const std::string script = sibling_program("braid-bench-ddp-peer.py");
  const std::optional<std::string> python = torch_python();
  if (!python || !std::filesystem::exists(script)) {
    std::cerr << "braid-bench ddp: no PyTorch peer (a python3 with torch, or " << script << ")\n";
    return std::nullopt;
  }
  std::vector<std::string> argv{*python, script, "--ranks", std::to_string(o.ranks)};
  for (auto& a : model_arguments(o)) argv.push_back(a);
  return json_line(run_command(argv, std::chrono::seconds(900)), "PyTorch DDP");
}

}  // namespace

int run_ddp(const std::vector<std::string>& args) {
  DdpOptions o;
  for (std::size_t i = 0; i < args.size(); ++i) {
    auto value = [&]() {
      if (i + 1 >= args.size()) throw std::invalid_argument(args[i] + " needs a value");
      return std::stoi(args[++i]);
    };
    if (args[i] == "--ranks")
      o.ranks = value();
    else if (args[i] == "--hidden")
      o.hidden = value();
    else if (args[i] == "--layers")
      o.layers = value();
    else if (args[i] == "--batch")
      o.batch = value();
    else if (args[i] == "--steps")
      o.steps = value();
    else if (args[i] == "--rounds")
      o.rounds = value();
    else if (args[i] == "--optimizer" && i + 1 < args.size())
      o.optimizer = args[++i];
    else
      throw std::invalid_argument("unknown option " + args[i]);
  }
  if (o.steps < 8) throw std::invalid_argument("--steps must be at least 8");
  // Interleaved: none, braid, pytorch -- each once, in one run.
  // Rounds interleave the four configurations, so a slow spell of the machine hits them
  // alike; each configuration's figures come from its median-step-time run.
  std::vector<std::string> none_runs, braid_runs, view_runs, torch_runs;
  for (int round = 0; round < o.rounds; ++round) {
    if (auto r = run_braid(o, "none")) none_runs.push_back(*r);
    if (auto r = run_braid(o, "ddp")) braid_runs.push_back(*r);
    if (auto r = run_braid(o, "ddp", {"--bucket-view"})) view_runs.push_back(*r);
    if (auto r = run_pytorch(o)) torch_runs.push_back(*r);
  }
  const auto none = median_run(none_runs);
  const auto braid = median_run(braid_runs);
  const auto view = median_run(view_runs);
  const auto torch = median_run(torch_runs);
  if (!none || !braid) return 1;
  const double params = field(*braid, "parameters").value_or(0);
  const double none_ms = field(*none, "step_ms").value_or(0);
  const double braid_ms = field(*braid, "step_ms").value_or(0);
  const double bare_ms = field(*braid, "bare_all_reduce_ms").value_or(0);
  const double traced_exposed = field(*braid, "exposed_ms_per_step").value_or(0);
  std::cout << fmt::format(
      "MLP {}x{} ({:.1f}M parameters, {:.1f} MiB of f32 gradients), batch {} per rank, {}, {} "
      "ranks, {} steps (mean after warm-up, slowest rank; median of {} interleaved rounds):\n\n",
      o.hidden, o.layers, params / 1e6, params * 4 / (1 << 20), o.batch, o.optimizer, o.ranks,
      o.steps, o.rounds);
  std::cout << fmt::format("{:<22} {:>10} {:>22}\n", "", "step ms", "exposed comm ms/step");
  std::cout << fmt::format("{:<22} {:>10.2f} {:>22}\n", "no gradient sync", none_ms, "-");
  std::cout << fmt::format(
      "{:<22} {:>10.2f} {:>22}\n", "braid DDP", braid_ms,
      fmt::format("{:.2f} (trace: {:.2f})", braid_ms - none_ms, traced_exposed));
  if (view) {
    const double view_ms = field(*view, "step_ms").value_or(0);
    std::cout << fmt::format("{:<22} {:>10.2f} {:>22}\n", "braid DDP, bucket view", view_ms,
                             fmt::format("{:.2f} (trace: {:.2f})", view_ms - none_ms,
                                         field(*view, "exposed_ms_per_step").value_or(0)));
  }
  std::optional<double> torch_ms;
  if (torch) {
    torch_ms = field(*torch, "step_ms");
    std::cout << fmt::format("{:<22} {:>10.2f} {:>22.2f}\n", "PyTorch DDP (Gloo)", *torch_ms,
                             *torch_ms - none_ms);
  }
  std::cout << fmt::format("\nbare all-reduce of all gradients (braid, one buffer): {:.2f} ms\n",
                           bare_ms);
  const double braid_exposed = std::max(braid_ms - none_ms, 0.0);
  std::cout << fmt::format("braid exposed / bare all-reduce: {:.2f} (goal <= 0.7)\n",
                           bare_ms > 0 ? braid_exposed / bare_ms : 0.0);
  if (torch_ms) {
    const double torch_exposed = std::max(*torch_ms - none_ms, 1e-9);
    std::cout << fmt::format("braid / PyTorch step time: {:.2f} (goal <= 0.9)\n",
                             braid_ms / *torch_ms);
    std::cout << fmt::format("braid / PyTorch exposed communication: {:.2f} (goal <= 0.5)\n",
                             braid_exposed / torch_exposed);
  }
  return 0;
}

}  // namespace braid::bench
