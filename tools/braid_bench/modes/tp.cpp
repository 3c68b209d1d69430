// braid-bench tp: tensor-parallel transformer blocks (ParallelTransformerBlock) trained
// forward and backward at TP 1 and at TP 2 (two ranks), TP 2 again with ColumnParallelLinear's
// backward overlap off (and with sequence parallelism, on request), beside the same blocks
// in PyTorch over Gloo (Megatron-style mappings), runners taking turns: step time, exposed
// TP communication, and the speed-up against TP 1 beside the ideal.

#include <chrono>
#include <iostream>
#include <map>
#include <optional>
#include <stdexcept>

#include <fmt/format.h>

#include "../harness/report.hpp"
#include "../harness/results.hpp"
#include "../harness/rounds.hpp"
#include "../harness/subprocess.hpp"
#include "../workers/tp_shape.hpp"
#include "modes.hpp"

namespace braid::bench {
namespace {

struct TpOptions : TpShape {
  int ranks = 2;
  int rounds = 3;
  bool sequence_parallel = false;  // adds a TP-2 row with sequence parallelism
  bool json = false;
};

OptionTable table(TpOptions& o) {
  OptionTable options{count("--ranks", o.ranks, 2)};
  for (Option& option : shape_options(o)) options.push_back(std::move(option));
  options.insert(options.end(),
                 {count("--rounds", o.rounds, 1),
                  flag("--sequence-parallel", o.sequence_parallel).noted("adds a row"),
                  flag("--json", o.json)});
  return options;
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
  std::vector<std::string> argv;
  if (c.braid) {
    argv = under_braid_run(c.ranks, "braid-bench-tp-worker",
                           {"--overlap", c.overlap ? "1" : "0", "--sequence-parallel",
                            c.sequence_parallel ? "1" : "0"},
                           true);
  } else {
    const auto peer = python_peer("braid-bench-tp-peer.py");
    if (!peer) return std::nullopt;
    argv = {"env", "OPENBLAS_NUM_THREADS=1", "OMP_NUM_THREADS=1"};
    argv.insert(argv.end(), peer->begin(), peer->end());
    argv.insert(argv.end(), {"--ranks", std::to_string(c.ranks)});
  }
  for (auto& a : arguments(shape_options(o))) argv.push_back(a);
  return result_line(run_command(argv, std::chrono::seconds(600)), "tp_step", "tp", c.name);
}

int run(TpOptions& o) {
  if (o.heads % o.ranks != 0 || o.hidden % o.heads != 0 || o.seq % o.ranks != 0) {
    throw std::invalid_argument(
        fmt::format("--heads {} and --seq {} must divide by --ranks {}, and --hidden {} by --heads",
                    o.heads, o.seq, o.ranks, o.hidden));
  }
  if (!have_worker("tp", "braid-bench-tp-worker")) return 1;
  if (!torch_python()) std::cerr << "braid-bench tp: no Python with torch; no peer\n";
  const std::vector<Config> configs = configs_of(o);
  const auto lines =
      run_rounds(o.rounds, configs, [&](const Config& c) { return run_config(o, c); });
  // Each runner's medians; communication_ms is braid's alone (traced; Gloo's calls all block).
  std::map<std::string, std::map<std::string, double>> figures;
  for (std::size_t c = 0; c < configs.size(); ++c) {
    if (!lines[c].empty())
      figures[configs[c].name] = medians(lines[c], {"step_ms", "exposed_ms", "communication_ms"});
  }
  const std::string torch_tp = "torch+gloo TP " + std::to_string(o.ranks);
  const Report report(
      o.json, {"runner", "step ms", "exposed ms", "comm ms", "speed-up", "ideal", "braid/torch"},
      {-28, 9, 11, 9, 10, 7, 12});
  report.say(fmt::format(
      "tensor parallelism: {} ParallelTransformerBlock(s), hidden {}, {} heads, MLP 4x, "
      "sequence {}, batch {}, activations [s, b, h]; forward and backward of a mean-square "
      "loss, one intra-op and one BLAS thread per rank; medians over {} steps (after a "
      "warm-up), then over {} rounds taken in turns.\n\n",
      o.layers, o.hidden, o.heads, o.seq, o.batch, o.steps, o.rounds));
  report.heading();
  int status = 0;
  for (const Config& c : configs) {
    if (!figures.count(c.name)) {
      if (c.braid) status = 1;
      continue;
    }
    auto& f = figures[c.name];
    const std::string one_rank = c.braid ? "braid TP 1" : "torch+gloo TP 1";
    std::optional<double> speed_up;
    if (figures.count(one_rank)) speed_up = figures[one_rank]["step_ms"] / f["step_ms"];
    // braid's step over PyTorch's at the same degree (TP 1 rows compare the same compute).
    std::optional<double> ratio;
    const std::string peer = c.ranks == 1 ? "torch+gloo TP 1" : torch_tp;
    if (c.braid && figures.count(peer)) ratio = f["step_ms"] / figures[peer]["step_ms"];
    JsonLine json;
    json.add("runner", c.name).add("ranks", c.ranks);
    json.add_each(f, {"step_ms", "exposed_ms", "communication_ms"}, "{:.3f}");
    if (speed_up) json.add("speed_up", *speed_up, "{:.3f}").add("ideal", c.ranks);
    if (ratio) json.add("braid_over_torch", *ratio, "{:.3f}");
    report.row(json.str(), {c.name, fixed(f["step_ms"], 2), fixed(f["exposed_ms"], 2),
                            fixed(figure(f, "communication_ms"), 2), fixed(speed_up, 2, "x"),
                            fmt::format("{}.00x", c.ranks), fixed(ratio, 2)});
  }
  report.say(
      "\nexposed: braid's, TP communication no compute span covers (braid-trace's "
      "definition, from the ranks' traces), per rank and step; torch+gloo's, the time "
      "inside its all-reduces (Gloo's calls block the training thread). comm: braid's "
      "traced TP communication, hidden or not. speed-up: the runner's own TP 1 step over "
      "this one. On 2 cores, TP 2 takes both: the runtime's reductions share them with "
      "compute.\n");
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
