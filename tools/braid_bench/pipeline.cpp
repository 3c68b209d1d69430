#include "pipeline.hpp"

#include <chrono>
#include <filesystem>
#include <iostream>
#include <map>
#include <optional>
#include <sstream>
#include <stdexcept>

#include <fmt/format.h>

#include <braid/parallel/pipeline_schedule.hpp>
#include <braid/parallel/pipeline_simulator.hpp>

#include "json_fields.hpp"
#include "list_argument.hpp"
#include "median.hpp"
#include "subprocess.hpp"

namespace braid::bench {
namespace {

struct Layout {
  std::string name;  // "pp4", "pp2xdp2"
  int pp = 1;
  int dp = 1;
};

struct PipelineBenchOptions {
  int rounds = 3;
  int steps = 12;
  int microbatches = 8;
  int layers = 8;
  int hidden = 128;
  int heads = 4;
  int seq = 32;
  int global_batch = 32;
  std::vector<std::string> schedules{"gpipe", "1f1b", "interleaved", "zb"};
  std::vector<Layout> layouts;
  bool json = false;
};

// "pp4" -> pp 4, dp 1; "pp2xdp2" -> pp 2, dp 2.
Layout parse_layout(const std::string& text) {
  Layout layout{.name = text};
  const auto cross = text.find("xdp");
  const std::string pp = text.substr(0, cross);
  if (pp.rfind("pp", 0) != 0) {
    throw std::invalid_argument("--layouts takes ppP or ppPxdpD (pp4, pp2xdp2), not '" + text +
                                "'");
  }
  layout.pp = count_argument("--layouts", pp.substr(2), 1, 64);
  if (cross != std::string::npos) {
    layout.dp = count_argument("--layouts", text.substr(cross + 3), 1, 64);
  }
  return layout;
}

int virtual_stages_of(const std::string& schedule) {
  return schedule == "interleaved" ? 2 : 1;
}

PipelineBenchOptions parse_options(const std::vector<std::string>& args) {
  PipelineBenchOptions o;
  std::string layouts = "pp4,pp2xdp2";
  const CountOptions counts{{"--rounds", {&o.rounds, 1}},
                            {"--steps", {&o.steps, 4}},
                            {"--microbatches", {&o.microbatches, 1}},
                            {"--layers", {&o.layers, 1}},
                            {"--hidden", {&o.hidden, 8}},
                            {"--heads", {&o.heads, 1}},
                            {"--seq", {&o.seq, 2}},
                            {"--global-batch", {&o.global_batch, 1}}};
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--json") {
      o.json = true;
      continue;
    }
    if (i + 1 >= args.size()) throw std::invalid_argument(a + " needs a value");
    if (a == "--schedules") {
      o.schedules = split_list(args[++i]);
      continue;
    }
    if (a == "--layouts") {
      layouts = args[++i];
      continue;
    }
    if (!take_count(counts, a, args[++i])) throw std::invalid_argument("unknown option " + a);
  }
  for (const std::string& layout : split_list(layouts)) o.layouts.push_back(parse_layout(layout));
  if (o.schedules.empty() || o.layouts.empty()) {
    throw std::invalid_argument("--schedules and --layouts need at least one name");
  }
  if (o.hidden % o.heads != 0) {
    throw std::invalid_argument(
        fmt::format("--hidden {} must divide by --heads {}", o.hidden, o.heads));
  }
  // Every row's shape before any runs: the schedule (make_schedule names what it cannot
  // take), the layers over its stages and the batch over dp x microbatches.
  for (const Layout& l : o.layouts) {
    if (o.global_batch % (l.dp * o.microbatches) != 0) {
      throw std::invalid_argument(
          fmt::format("--global-batch {} must divide by dp x microbatches = {} for {}",
                      o.global_batch, l.dp * o.microbatches, l.name));
    }
    for (const std::string& schedule : o.schedules) {
      const int stages =
          parallel::make_schedule(schedule, l.pp, o.microbatches, virtual_stages_of(schedule))
              .stages;
      if (o.layers % stages != 0) {
        throw std::invalid_argument(
            fmt::format("--layers {} does not split over {}'s {} stages "
                        "under {}",
                        o.layers, l.name, stages, schedule));
      }
    }
  }
  return o;
}

// One run of the worker.
struct Config {
  Layout layout;
  std::string schedule;
  bool overlap_dp = true;
  std::string key() const {
    return layout.name + " " + schedule + (overlap_dp ? "" : " no-overlap");
  }
};

std::optional<std::string> run_config(const PipelineBenchOptions& o, const Config& c) {
  // BLAS on one thread, as libtorch's intra-op threads are (tp.cpp says why).
  const std::vector<std::string> argv{"env",
                                      "OPENBLAS_NUM_THREADS=1",
                                      "OMP_NUM_THREADS=1",
                                      sibling_program("braid-run"),
                                      "-n",
                                      std::to_string(c.layout.pp * c.layout.dp),
                                      sibling_program("braid-bench-pipeline-worker"),
                                      "--pp",
                                      std::to_string(c.layout.pp),
                                      "--dp",
                                      std::to_string(c.layout.dp),
                                      "--schedule",
                                      c.schedule,
                                      "--virtual-stages",
                                      std::to_string(virtual_stages_of(c.schedule)),
                                      "--microbatches",
                                      std::to_string(o.microbatches),
                                      "--steps",
                                      std::to_string(o.steps),
                                      "--overlap-dp",
                                      c.overlap_dp ? "1" : "0",
                                      "--layers",
                                      std::to_string(o.layers),
                                      "--hidden",
                                      std::to_string(o.hidden),
                                      "--heads",
                                      std::to_string(o.heads),
                                      "--seq",
                                      std::to_string(o.seq),
                                      "--global-batch",
                                      std::to_string(o.global_batch)};
  const CommandResult result = run_command(argv, std::chrono::seconds(300));
  std::stringstream lines(result.output);
  for (std::string line; std::getline(lines, line);) {
    const auto brace = line.find("{\"pipeline_step\"");
    if (brace != std::string::npos && result.exit_code == 0) return line.substr(brace);
  }
  std::cerr << fmt::format("braid-bench pipeline: {} printed no result (exit {}):\n{}\n", c.key(),
                           result.exit_code, result.output);
  return std::nullopt;
}

// A run's figures, each the median over the rounds; a key no round printed is absent.
std::map<std::string, double> medians(const std::vector<std::string>& lines) {
  std::map<std::string, std::vector<double>> values;
  for (const auto& line : lines) {
    for (const char* key : {"step_ms", "pipeline_ms", "bubble_percent", "F_ms", "B_ms", "I_ms",
                            "W_ms", "dp_comm_ms", "dp_exposed_ms", "dp_exposed_summary_ms"}) {
      if (auto value = json_number(line, key)) values[key].push_back(*value);
    }
  }
  std::map<std::string, double> out;
  for (const auto& [key, runs] : values) out[key] = median(runs);
  return out;
}

// The simulator's run of the schedule with the compute costs the run measured (ms);
// transfers free, the reduction free (it is not in the schedule's compute).
parallel::SimulationResult simulate_measured(const Config& c, int microbatches,
                                             const std::map<std::string, double>& f) {
  parallel::SimulationCosts costs;
  costs.forward = f.at("F_ms");
  if (f.count("B_ms")) {
    costs.backward = f.at("B_ms");
    costs.backward_input = costs.backward / 2;  // unused: nothing is split
    costs.backward_weight = costs.backward / 2;
  } else {
    costs.backward_input = f.at("I_ms");
    costs.backward_weight = f.at("W_ms");
    costs.backward = costs.backward_input + costs.backward_weight;  // unused
  }
  return parallel::simulate(
      parallel::lower(parallel::make_schedule(c.schedule, c.layout.pp, microbatches,
                                              virtual_stages_of(c.schedule))),
      costs);
}

std::string costs_text(const std::map<std::string, double>& f) {
  if (f.count("B_ms")) return fmt::format("{:.2f}/{:.2f}", f.at("F_ms"), f.at("B_ms"));
  return fmt::format("{:.2f}/{:.2f}+{:.2f}", f.at("F_ms"), f.at("I_ms"), f.at("W_ms"));
}

std::string optional_ms(const std::map<std::string, double>* figures, const char* key) {
  return figures != nullptr && figures->count(key) ? fmt::format("{:.2f}", figures->at(key))
                                                   : std::string("-");
}

}  // namespace

int run_pipeline(const std::vector<std::string>& args) {
  const PipelineBenchOptions o = parse_options(args);
  if (!std::filesystem::exists(sibling_program("braid-bench-pipeline-worker"))) {
    std::cerr << "braid-bench pipeline: the worker is built with libtorch only\n";
    return 1;
  }
  std::vector<Config> configs;
  for (const Layout& layout : o.layouts) {
    for (const std::string& schedule : o.schedules) {
      configs.push_back({.layout = layout, .schedule = schedule});
      if (layout.dp > 1)
        configs.push_back({.layout = layout, .schedule = schedule, .overlap_dp = false});
    }
  }
  std::map<std::string, std::vector<std::string>> lines;
  for (int round = 0; round < o.rounds; ++round) {
    for (const Config& c : configs) {
      wait_until_quiet();
      if (auto line = run_config(o, c)) lines[c.key()].push_back(*line);
    }
  }
  std::map<std::string, std::map<std::string, double>> figures;
  for (const auto& [key, runs] : lines) figures[key] = medians(runs);

  if (!o.json) {
    std::cout << fmt::format(
        "pipeline parallelism: the 3D job's model (examples/gpt_stage.hpp), {} blocks of hidden "
        "{}, {} heads, sequence {}, {} sequences per step in {} microbatches per data-parallel "
        "replica, Adam; one intra-op and one BLAS thread per rank; medians over {} steps (after "
        "a warm-up), then over {} rounds taken in turns.\n\n",
        o.layers, o.hidden, o.heads, o.seq, o.global_batch, o.microbatches, o.steps, o.rounds);
    std::cout << fmt::format(
        "{:<8} {:<12} {:>8} {:>8} {:>7} {:>8} {:>6} {:>8} {:>16} {:>8} {:>8} {:>8}\n", "layout",
        "schedule", "step ms", "pipe ms", "sim ms", "bubble%", "sim%", "formula%", "F/B ms",
        "exposed", "no-ovl", "no-ovl");
    std::cout << fmt::format(
        "{:<8} {:<12} {:>8} {:>8} {:>7} {:>8} {:>6} {:>8} {:>16} {:>8} {:>8} {:>8}\n", "", "", "",
        "", "", "", "", "", "", "DP ms", "exp ms", "step ms");
  }
  int status = 0;
  for (const Config& c : configs) {
    if (!c.overlap_dp) continue;  // its figures go on the overlapped run's row
    if (!figures.count(c.key())) {
      status = 1;
      continue;
    }
    const auto& f = figures[c.key()];
    const Config after{.layout = c.layout, .schedule = c.schedule, .overlap_dp = false};
    const std::map<std::string, double>* no_overlap =
        c.layout.dp > 1 && figures.count(after.key()) ? &figures[after.key()] : nullptr;
    if (c.layout.dp > 1 && no_overlap == nullptr) status = 1;
    const int v = virtual_stages_of(c.schedule);
    const parallel::SimulationResult simulated = simulate_measured(c, o.microbatches, f);
    const double formula = parallel::textbook_bubble(
                               parallel::make_schedule(c.schedule, c.layout.pp, o.microbatches, v))
                               .percent;
    if (o.json) {
      std::string line = fmt::format(
          "{{\"layout\":\"{}\",\"schedule\":\"{}\",\"pp\":{},\"dp\":{},\"virtual_stages\":{},"
          "\"microbatches\":{},\"step_ms\":{:.3f},\"pipeline_ms\":{:.3f},\"simulated_ms\":{:.3f},"
          "\"bubble_percent\":{:.2f},\"simulated_bubble_percent\":{:.2f},"
          "\"formula_bubble_percent\":{:.4f}",
          c.layout.name, c.schedule, c.layout.pp, c.layout.dp, v, o.microbatches, f.at("step_ms"),
          f.at("pipeline_ms"), simulated.step_time, f.at("bubble_percent"),
          simulated.mean_bubble_percent(), formula);
      for (const char* key : {"F_ms", "B_ms", "I_ms", "W_ms"}) {
        if (f.count(key)) line += fmt::format(",\"{}\":{:.4f}", key, f.at(key));
      }
      if (c.layout.dp > 1) {
        line += fmt::format(
            ",\"dp_comm_ms\":{:.3f},\"dp_exposed_ms\":{:.3f},"
            "\"dp_exposed_summary_ms\":{:.3f}",
            f.at("dp_comm_ms"), f.at("dp_exposed_ms"), f.at("dp_exposed_summary_ms"));
      }
      if (no_overlap != nullptr) {
        line += fmt::format(
            ",\"no_overlap_step_ms\":{:.3f},\"no_overlap_dp_comm_ms\":{:.3f},"
            "\"no_overlap_dp_exposed_ms\":{:.3f}",
            no_overlap->at("step_ms"), no_overlap->at("dp_comm_ms"),
            no_overlap->at("dp_exposed_ms"));
      }
      std::cout << line << "}" << std::endl;
      continue;
    }
    std::cout << fmt::format(
        "{:<8} {:<12} {:>8.2f} {:>8.2f} {:>7.2f} {:>8.1f} {:>6.1f} {:>8.1f} {:>16} {:>8} {:>8} "
        "{:>8}\n",
        c.layout.name, c.schedule, f.at("step_ms"), f.at("pipeline_ms"), simulated.step_time,
        f.at("bubble_percent"), simulated.mean_bubble_percent(), formula, costs_text(f),
        c.layout.dp > 1 ? fmt::format("{:.2f}", f.at("dp_exposed_ms")) : "-",
        optional_ms(no_overlap, "dp_exposed_ms"), optional_ms(no_overlap, "step_ms"));
  }
  if (!o.json) {
    std::cout << "\nstep: zero_grad to the optimizer's step, the slowest rank's. pipe: the step's\n"
                 "first to last compute action over a pipeline's ranks. bubble%: the part of\n"
                 "that window a rank's F, B, I, W spans do not cover, the ranks' mean. sim: the\n"
                 "simulator on the same schedule with the F/B (ZB: F/I+W) medians measured here,\n"
                 "transfers free. formula%: (p-1)/(m+p-1), interleaved (p-1)/(vm+p-1), ZB-H1\n"
                 "held to 1F1B's. exposed DP ms: per rank and step, the dp group's all-reduces\n"
                 "no compute covers, with the executor's overlap (DDP reducing in each stage's\n"
                 "last backward, beside the other ranks' cool-down; its wait inside that\n"
                 "backward counts as exposed). no-ovl: one flat all-reduce after the step's last\n"
                 "action instead: its exposed time and the step. Here 4 ranks share 2 cores: a\n"
                 "span's time includes waiting for a core, so measured costs and bubbles include\n"
                 "it, and the simulator, which gives each rank a core, sees the inflated costs.\n";
  }
  return status;
}

}  // namespace braid::bench
