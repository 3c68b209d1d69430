// braid-bench pipeline: the 3D job's model (models/braid_models/gpt_stage.hpp) on four ranks
// as a 4-stage pipeline and as 2 stages x 2 data-parallel replicas, under each schedule
// (GPipe, 1F1B, interleaved 1F1B with two stages per rank, ZB-H1), runners taking turns: the
// measured step time and bubble beside the simulator's (braid::parallel::simulate with the
// compute costs the run measured) and the textbook formula, and for the data-parallel
// layouts the reduction's exposed time with the executor's overlap (reduced in each stage's
// last backward) and without (one all-reduce after the step's last action).
#include <chrono>
#include <map>
#include <optional>
#include <stdexcept>

#include <fmt/format.h>

#include <braid/parallel/pipeline_schedule.hpp>
#include <braid/parallel/pipeline_simulator.hpp>

#include "../harness/report.hpp"
#include "../harness/results.hpp"
#include "../harness/rounds.hpp"
#include "../harness/subprocess.hpp"
#include "modes.hpp"

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
  std::vector<std::string> layout_names{"pp4", "pp2xdp2"};
  std::vector<Layout> layouts;  // layout_names read
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
  layout.pp = whole_number("--layouts", pp.substr(2), 1, 64);
  if (cross != std::string::npos) {
    layout.dp = whole_number("--layouts", text.substr(cross + 3), 1, 64);
  }
  return layout;
}

int virtual_stages_of(const std::string& schedule) {
  return schedule == "interleaved" ? 2 : 1;
}

OptionTable table(PipelineBenchOptions& o) {
  return {count("--rounds", o.rounds, 1),
          count("--steps", o.steps, 4),
          count("--microbatches", o.microbatches, 1),
          count("--layers", o.layers, 1),
          count("--hidden", o.hidden, 8),
          count("--heads", o.heads, 1),
          count("--seq", o.seq, 2),
          count("--global-batch", o.global_batch, 1),
          words("--schedules", o.schedules),
          words("--layouts", o.layout_names),
          flag("--json", o.json)};
}

// What the table cannot check: the layouts read, and every row's shape before any runs.
void check(PipelineBenchOptions& o) {
  for (const std::string& layout : o.layout_names) o.layouts.push_back(parse_layout(layout));

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

std::optional<std::string> run_config(PipelineBenchOptions& o, const Config& c) {
  std::vector<std::string> args{"--pp",
                                std::to_string(c.layout.pp),
                                "--dp",
                                std::to_string(c.layout.dp),
                                "--schedule",
                                c.schedule,
                                "--overlap-dp",
                                c.overlap_dp ? "1" : "0",
                                "--virtual-stages",
                                std::to_string(virtual_stages_of(c.schedule))};
  for (auto& a : arguments(table(o), {"--microbatches", "--steps", "--layers", "--hidden",
                                      "--heads", "--seq", "--global-batch"}))
    args.push_back(a);
  return result_line(run_command(under_braid_run(c.layout.pp * c.layout.dp,
                                                 "braid-bench-pipeline-worker", args, true),
                                 std::chrono::seconds(300)),
                     "pipeline_step", "pipeline", c.key());
}

// A run's figures, each the median over the rounds; a key no round printed is absent.
std::map<std::string, double> figures_of(const std::vector<std::string>& lines) {
  return medians(lines, {"step_ms", "pipeline_ms", "bubble_percent", "F_ms", "B_ms", "I_ms", "W_ms",
                         "dp_comm_ms", "dp_exposed_ms", "dp_exposed_summary_ms"});
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

int run(PipelineBenchOptions& o) {
  check(o);
  if (!have_worker("pipeline", "braid-bench-pipeline-worker")) return 1;
  std::vector<Config> configs;
  for (const Layout& layout : o.layouts) {
    for (const std::string& schedule : o.schedules) {
      configs.push_back({.layout = layout, .schedule = schedule});
      if (layout.dp > 1)
        configs.push_back({.layout = layout, .schedule = schedule, .overlap_dp = false});
    }
  }
  const auto lines =
      run_rounds(o.rounds, configs, [&](const Config& c) { return run_config(o, c); });
  std::map<std::string, std::map<std::string, double>> figures;
  for (std::size_t c = 0; c < configs.size(); ++c) {
    if (!lines[c].empty()) figures[configs[c].key()] = figures_of(lines[c]);
  }

  const Report report(o.json,
                      {"layout", "schedule", "step ms", "pipe ms", "sim ms", "bubble%", "sim%",
                       "formula%", "F/B ms", "exposed\nDP ms", "no-ovl\nexp ms", "no-ovl\nstep ms"},
                      {-8, -12, 8, 8, 7, 8, 6, 8, 16, 8, 8, 8});
  report.say(fmt::format(
      "pipeline parallelism: the 3D job's model (models/braid_models/gpt_stage.hpp), {} blocks "
      "of hidden "
      "{}, {} heads, sequence {}, {} sequences per step in {} microbatches per data-parallel "
      "replica, Adam; one intra-op and one BLAS thread per rank; medians over {} steps (after "
      "a warm-up), then over {} rounds taken in turns.\n\n",
      o.layers, o.hidden, o.heads, o.seq, o.global_batch, o.microbatches, o.steps, o.rounds));
  report.heading();
  int status = 0;
  for (const Config& c : configs) {
    if (!c.overlap_dp) continue;  // its figures go on the overlapped run's row
    if (!figures.count(c.key())) {
      status = 1;
      continue;
    }
    const auto& f = figures[c.key()];
    const Config after{.layout = c.layout, .schedule = c.schedule, .overlap_dp = false};
    const std::map<std::string, double> no_overlap = c.layout.dp > 1 && figures.count(after.key())
                                                         ? figures[after.key()]
                                                         : std::map<std::string, double>();
    if (c.layout.dp > 1 && no_overlap.empty()) status = 1;
    const int v = virtual_stages_of(c.schedule);
    const parallel::SimulationResult simulated = simulate_measured(c, o.microbatches, f);
    const double formula = parallel::textbook_bubble(
                               parallel::make_schedule(c.schedule, c.layout.pp, o.microbatches, v))
                               .percent;
    JsonLine json;
    json.add("layout", c.layout.name).add("schedule", c.schedule).add("pp", c.layout.pp);
    json.add("dp", c.layout.dp).add("virtual_stages", v).add("microbatches", o.microbatches);
    json.add("step_ms", f.at("step_ms"), "{:.3f}")
        .add("pipeline_ms", f.at("pipeline_ms"), "{:.3f}")
        .add("simulated_ms", simulated.step_time, "{:.3f}")
        .add("bubble_percent", f.at("bubble_percent"), "{:.2f}")
        .add("simulated_bubble_percent", simulated.mean_bubble_percent(), "{:.2f}")
        .add("formula_bubble_percent", formula, "{:.4f}")
        .add_each(f, {"F_ms", "B_ms", "I_ms", "W_ms"}, "{:.4f}");
    if (c.layout.dp > 1)
      json.add_each(f, {"dp_comm_ms", "dp_exposed_ms", "dp_exposed_summary_ms"}, "{:.3f}");
    json.add_each(no_overlap, {"step_ms", "dp_comm_ms", "dp_exposed_ms"}, "{:.3f}", "no_overlap_");
    report.row(
        json.str(),
        {c.layout.name, c.schedule, fixed(f.at("step_ms"), 2), fixed(f.at("pipeline_ms"), 2),
         fixed(simulated.step_time, 2), fixed(f.at("bubble_percent"), 1),
         fixed(simulated.mean_bubble_percent(), 1), fixed(formula, 1), costs_text(f),
         fixed(c.layout.dp > 1 ? figure(f, "dp_exposed_ms") : std::nullopt, 2),
         fixed(figure(no_overlap, "dp_exposed_ms"), 2), fixed(figure(no_overlap, "step_ms"), 2)});
  }
  report.say(
      "\nstep: zero_grad to the optimizer's step, the slowest rank's. pipe: the step's\n"
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
      "it, and the simulator, which gives each rank a core, sees the inflated costs.\n");
  return status;
}

}  // namespace

Mode pipeline_mode() {
  return describe<PipelineBenchOptions>(
      {.name = "pipeline",
       .about = "the 3D job's model on 4 ranks (pp 4, pp 2 x dp 2) under each schedule: step time "
                "and bubble beside the simulator's (with the measured costs) and the formula, the "
                "data-parallel reduction's exposed time with and without overlap",
       .options = table,
       .run = run});
}

}  // namespace braid::bench
