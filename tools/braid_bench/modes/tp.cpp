// braid-bench tp: tensor-parallel transformer blocks (ParallelTransformerBlock) trained
// forward and backward at TP 1 and at TP 2 (two ranks), TP 2 again with ColumnParallelLinear's
// backward overlap off (and with sequence parallelism, on request), beside the same blocks
// in PyTorch over Gloo (Megatron-style mappings), runners taking turns: step time, exposed
// TP communication, and the speed-up against TP 1 beside the ideal.

#include <chrono>
#include <filesystem>
#include <iostream>
#include <map>
#include <optional>
#include <sstream>
#include <stdexcept>

#include <fmt/format.h>

#include "../harness/results.hpp"
#include "../harness/rounds.hpp"
#include "../harness/subprocess.hpp"
#include "modes.hpp"

namespace braid::bench {
namespace {

struct TpOptions {
  int ranks = 2;
  int hidden = 256;
  int heads = 8;
  int layers = 2;
  int seq = 64;
  int batch = 4;
  int steps = 20;
  int rounds = 3;
  bool sequence_parallel = false;  // adds a TP-2 row with sequence parallelism
  bool json = false;
};

OptionTable table(TpOptions& o) {
  return {count("--ranks", o.ranks, 2),
          count("--hidden", o.hidden, 8),
          count("--heads", o.heads, 1),
          count("--layers", o.layers, 1),
          count("--seq", o.seq, 1),
          count("--batch", o.batch, 1),
          count("--steps", o.steps, 4),
          count("--rounds", o.rounds, 1),
          flag("--sequence-parallel", o.sequence_parallel).noted("adds a row"),
          flag("--json", o.json)};
}

// One configuration of the table: who runs it and how.
struct Config {
  std::string name;
  bool braid = true;
  int ranks = 1;
  bool overlap = true;
  bool sequence_parallel = false;
};

std::vector<Config> configs_of(const TpOptions& o) {
  const std::string t = std::to_string(o.ranks);
  std::vector<Config> configs{
      {.name = "braid TP 1", .ranks = 1},
      {.name = "braid TP " + t, .ranks = o.ranks},
      {.name = "braid TP " + t + " no overlap", .ranks = o.ranks, .overlap = false},
  };
  if (o.sequence_parallel) {
    configs.push_back(
        {.name = "braid TP " + t + " seq-par", .ranks = o.ranks, .sequence_parallel = true});
  }
  configs.push_back({.name = "torch+gloo TP 1", .braid = false, .ranks = 1});
  configs.push_back({.name = "torch+gloo TP " + t, .braid = false, .ranks = o.ranks});
  return configs;
}

std::optional<std::string> run_config(TpOptions& o, const Config& c) {
  const std::vector<std::string> shape =
      arguments(table(o), {"--hidden", "--heads", "--layers", "--seq", "--batch", "--steps"});
  std::vector<std::string> argv;
  if (c.braid) {
    argv = under_braid_run(c.ranks, "braid-bench-tp-worker",
                           {"--overlap", c.overlap ? "1" : "0", "--sequence-parallel",
                            c.sequence_parallel ? "1" : "0"},
                           true);
  } else {
    const std::optional<std::string> python = torch_python();
    const std::string script = sibling_program("braid-bench-tp-peer.py");
    if (!python || !std::filesystem::exists(script)) return std::nullopt;
    argv = {"env",     "OPENBLAS_NUM_THREADS=1", "OMP_NUM_THREADS=1", *python, script,
            "--ranks", std::to_string(c.ranks)};
  }
  argv.insert(argv.end(), shape.begin(), shape.end());
  return result_line(run_command(argv, std::chrono::seconds(600)), "tp_step", "tp", c.name);
}

struct Figures {
  double step_ms = 0;
  double exposed_ms = 0;
  std::optional<double> communication_ms;  // braid's (traced); Gloo's calls all block
};

Figures figures_of(const std::vector<std::string>& lines) {
  auto f = medians(lines, {"step_ms", "exposed_ms", "communication_ms"});
  Figures figures{.step_ms = f["step_ms"], .exposed_ms = f["exposed_ms"]};
  if (f.count("communication_ms")) figures.communication_ms = f["communication_ms"];
  return figures;
}

int run(TpOptions& o) {
  if (o.heads % o.ranks != 0 || o.hidden % o.heads != 0 || o.seq % o.ranks != 0) {
    throw std::invalid_argument(
        fmt::format("--heads {} and --seq {} must divide by --ranks {}, and --hidden {} by --heads",
                    o.heads, o.seq, o.ranks, o.hidden));
  }
  if (!std::filesystem::exists(sibling_program("braid-bench-tp-worker"))) {
    std::cerr << "braid-bench tp: the worker is built with libtorch only\n";
    return 1;
  }
  if (!torch_python()) std::cerr << "braid-bench tp: no Python with torch; no peer\n";
  const std::vector<Config> configs = configs_of(o);
  const auto lines =
      run_rounds(o.rounds, configs, [&](const Config& c) { return run_config(o, c); });
  std::map<std::string, Figures> figures;
  for (std::size_t c = 0; c < configs.size(); ++c) {
    if (!lines[c].empty()) figures[configs[c].name] = figures_of(lines[c]);
  }
  const auto one_rank = [&](const Config& c) {
    return c.braid ? std::string("braid TP 1") : std::string("torch+gloo TP 1");
  };
  const std::string braid_tp = "braid TP " + std::to_string(o.ranks);
  const std::string torch_tp = "torch+gloo TP " + std::to_string(o.ranks);
  if (!o.json) {
    std::cout << fmt::format(
        "tensor parallelism: {} ParallelTransformerBlock(s), hidden {}, {} heads, MLP 4x, "
        "sequence {}, batch {}, activations [s, b, h]; forward and backward of a mean-square "
        "loss, one intra-op and one BLAS thread per rank; medians over {} steps (after a "
        "warm-up), then over {} rounds taken in turns.\n\n",
        o.layers, o.hidden, o.heads, o.seq, o.batch, o.steps, o.rounds);
    std::cout << fmt::format("{:<28} {:>9} {:>11} {:>9} {:>10} {:>7} {:>12}\n", "runner", "step ms",
                             "exposed ms", "comm ms", "speed-up", "ideal", "braid/torch");
  }
  int status = 0;
  for (const Config& c : configs) {
    if (!figures.count(c.name)) {
      if (c.braid) status = 1;
      continue;
    }
    const Figures& f = figures[c.name];
    std::optional<double> speed_up;
    if (figures.count(one_rank(c))) speed_up = figures[one_rank(c)].step_ms / f.step_ms;
    // braid's step over PyTorch's at the same degree (TP 1 rows compare the same compute).
    std::optional<double> ratio;
    const std::string peer = c.ranks == 1 ? "torch+gloo TP 1" : torch_tp;
    if (c.braid && figures.count(peer)) ratio = f.step_ms / figures[peer].step_ms;
    if (o.json) {
      std::string line =
          fmt::format("{{\"runner\":\"{}\",\"ranks\":{},\"step_ms\":{:.3f},\"exposed_ms\":{:.3f}",
                      c.name, c.ranks, f.step_ms, f.exposed_ms);
      if (f.communication_ms)
        line += fmt::format(",\"communication_ms\":{:.3f}", *f.communication_ms);
      if (speed_up) line += fmt::format(",\"speed_up\":{:.3f},\"ideal\":{}", *speed_up, c.ranks);
      if (ratio) line += fmt::format(",\"braid_over_torch\":{:.3f}", *ratio);
      std::cout << line << "}" << std::endl;
      continue;
    }
    std::cout << fmt::format(
        "{:<28} {:>9.2f} {:>11.2f} {:>9} {:>10} {:>7} {:>12}\n", c.name, f.step_ms, f.exposed_ms,
        f.communication_ms ? fmt::format("{:.2f}", *f.communication_ms) : "-",
        speed_up ? fmt::format("{:.2f}x", *speed_up) : "-", fmt::format("{}.00x", c.ranks),
        ratio ? fmt::format("{:.2f}", *ratio) : "-");
  }
  if (!o.json) {
    std::cout
        << "\nexposed: braid's, TP communication no compute span covers (braid-trace's "
           "definition, from the ranks' traces), per rank and step; torch+gloo's, the time "
           "inside its all-reduces (Gloo's calls block the training thread). comm: braid's "
           "traced TP communication, hidden or not. speed-up: the runner's own TP 1 step over "
           "this one. On 2 cores, TP 2 takes both: the runtime's reductions share them with "
           "compute.\n";
  }
  return status;
}

}  // namespace

Mode tp_mode() {
  return describe<TpOptions>(
      {.name = "tp",
       .about = "tensor-parallel transformer blocks at TP 1 and TP 2, TP 2 without the backward "
                "overlap, beside PyTorch (Megatron-style, Gloo): step time, exposed TP "
                "communication, speed-up against TP 1 beside the ideal",
       .options = table,
       .run = run});
}

}  // namespace braid::bench
