// braid-bench ddp --balance: equal batch shares against the balancers (ddp_runs.hpp).

#include <iostream>
#include <map>
#include <optional>

#include <fmt/format.h>

#include "../harness/results.hpp"
#include "../harness/rounds.hpp"
#include "ddp_runs.hpp"

namespace braid::bench {
namespace {

struct ModeFigures {
  double step_ms = 0;
  double slowest_compute_ms = 0;
  double samples_per_step = 0;
  double ideal_ms = 0;
  double speed_ratio = 0;
  std::string throughputs;  // the last round's
  std::string counts;       // the last round's
  int runs = 0;
};

void add(ModeFigures& f, const std::string& line) {
  f.step_ms += json_number(line, "step_ms").value_or(0);
  f.slowest_compute_ms += json_number(line, "slowest_compute_ms").value_or(0);
  f.samples_per_step += json_number(line, "samples_per_step").value_or(0);
  f.ideal_ms += json_number(line, "ideal_ms").value_or(0);
  f.speed_ratio += json_number(line, "speed_ratio").value_or(0);
  f.throughputs = json_text(line, "throughputs");
  f.counts = json_text(line, "counts");
  ++f.runs;
}

}  // namespace

int report_ddp_balance(const DdpOptions& run) {
  const std::vector<std::string> modes{"equal", "shares", "cadence"};
  const auto lines = run_rounds(run.rounds, modes, [&](const std::string& mode) {
    return run_braid(run, "ddp", {"--balance", mode});
  });
  std::map<std::string, ModeFigures> figures;
  double global_batch = 0;
  for (std::size_t m = 0; m < modes.size(); ++m) {
    if (lines[m].empty()) return 1;
    ModeFigures& f = figures[modes[m]];
    for (const std::string& line : lines[m]) add(f, line);
    global_batch = json_number(lines[m].back(), "global_batch").value_or(0);
    for (double* x :
         {&f.step_ms, &f.slowest_compute_ms, &f.samples_per_step, &f.ideal_ms, &f.speed_ratio}) {
      *x /= f.runs;
    }
  }
  // The ideal from the balanced runs' own throughputs (a rank's throughput depends a little
  // on its batch size).
  const ModeFigures& balanced = figures["shares"];
  const double ideal_ms = balanced.ideal_ms;
  std::cout << fmt::format(
      "{} ranks, the last computing {} ms more per {} samples (measured: the fastest rank "
      "{:.2f}x the slowest, samples per second of compute {}); global batch {}; steps {} to {} "
      "timed on the slowest rank; means of {} interleaved rounds:\n\n",
      run.ranks, run.straggle_ms, static_cast<int>(global_batch) / run.ranks, balanced.speed_ratio,
      balanced.throughputs, global_batch, run.steps / 2 + 1, run.steps, run.rounds);
  std::cout << fmt::format("{:<30} {:>9} {:>10} {:>14} {:>11} {:>9} {:>8}  {}\n", "", "step ms",
                           "samples", "ms per batch", "samples/s", "compute", "/ ideal",
                           "per rank");
  auto row = [&](const std::string& name, const ModeFigures& f, const std::string& per_rank) {
    const double per_batch = f.step_ms * global_batch / f.samples_per_step;
    std::cout << fmt::format(
        "{:<30} {:>9.2f} {:>10.0f} {:>14.2f} {:>11.0f} {:>9.2f} {:>8.2f}  {}\n", name, f.step_ms,
        f.samples_per_step, per_batch, 1e3 * f.samples_per_step / f.step_ms, f.slowest_compute_ms,
        per_batch / ideal_ms, per_rank);
  };
  row("equal shares", figures["equal"], "");
  row("balanced (BatchBalancer)", balanced, "batch " + balanced.counts);
  row("cadence (CadenceBalancer)", figures["cadence"],
      "micro-batches " + figures["cadence"].counts);
  std::cout << fmt::format("{:<30} {:>9.2f} {:>10.0f} {:>14.2f} {:>11.0f}\n",
                           "ideal (batch / sum of rates)", ideal_ms, global_batch, ideal_ms,
                           1e3 * global_batch / ideal_ms);
  const ModeFigures& equal = figures["equal"];
  const ModeFigures& cadence = figures["cadence"];
  std::cout << fmt::format(
      "\nsamples: every rank's per step (a cadence step is a window of micro-batches); ms per "
      "batch: the time per {:.0f} samples; compute: the slowest rank's forward and backward "
      "per step (its thread's CPU time). The rest of a step is the optimizer and the exposed "
      "synchronisation, which balancing does not shrink: {:.2f} ms equal, {:.2f} ms "
      "balanced.\nbalanced / ideal {:.2f} (goal <= 1.15); its compute / the ideal {:.2f} (what "
      "the balancer decides); balanced / equal {:.2f}; cadence / ideal {:.2f}\n",
      global_batch, equal.step_ms - equal.slowest_compute_ms,
      balanced.step_ms - balanced.slowest_compute_ms, balanced.step_ms / ideal_ms,
      balanced.slowest_compute_ms / ideal_ms, balanced.step_ms / equal.step_ms,
      cadence.step_ms * global_batch / cadence.samples_per_step / ideal_ms);
  return 0;
}

}  // namespace braid::bench
