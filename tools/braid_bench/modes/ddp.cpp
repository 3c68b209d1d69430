// braid-bench ddp: one model and batch trained three ways in one run -- braid's
// DistributedDataParallel (the main job's loop, braid-bench-ddp-worker), PyTorch DDP with Gloo
// (peers/ddp_torch.py) and no gradient sync at all -- with step times, the communication each
// DDP leaves exposed (its step time minus the no-sync step time), the bare all-reduce of all
// gradients, and braid's ratios to PyTorch.
// ddp --balance: the same job with a slower last rank three ways in one run -- equal batch
// shares, dp::BatchBalancer's shares and dp::CadenceBalancer's windows -- beside the ideal
// step (the global batch over the sum of the ranks' measured throughputs), each figure the
// mean over interleaved rounds.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <iostream>
#include <map>
#include <optional>
#include <stdexcept>

#include <fmt/format.h>

#include "../harness/report.hpp"
#include "../harness/results.hpp"
#include "../harness/rounds.hpp"
#include "../harness/subprocess.hpp"
#include "modes.hpp"

namespace braid::bench {
namespace {

struct DdpOptions {
  int ranks = 2;
  int hidden = 1024;
  int layers = 8;
  int batch = 0;  // 0: 32, or 128 with --balance (balancing is for compute-bound steps)
  int steps = 30;
  int rounds = 3;
  std::vector<std::string> optimizers{"sgd", "adam"};
  std::string optimizer = "sgd";  // the one being run
  double straggle_ms = 0;         // the last rank computes this much more before each backward
  bool balance = false;           // equal shares against the balancers, instead of DDP's figures
  std::string device = "cpu";     // cuda: each rank on GPU LOCAL_RANK (modulo the GPUs)
  // Both trainers' ranks on this many nodes emulated here (braid-run --emulate-nodes), each
  // link shaped to link_rate where given.
  int emulate_nodes = 0;
  std::string link_rate;
};

OptionTable table(DdpOptions& o) {
  return {count("--ranks", o.ranks, 1, 1000000000),
          count("--hidden", o.hidden, 1, 1000000000),
          count("--layers", o.layers, 1, 1000000000),
          count("--batch", o.batch, 1, 1000000000).noted("0: 32 a rank, 128 with --balance"),
          count("--steps", o.steps, 8, 1000000000),
          count("--rounds", o.rounds, 1, 1000000000),
          words("--optimizers", o.optimizers, {"sgd", "adam"}),
          words("--optimizer", o.optimizers, {"sgd", "adam"}).unlisted(),
          decimal("--straggle-ms", o.straggle_ms, 0, 1e6)
              .noted("the last rank computes that much more a step"),
          flag("--balance", o.balance)
              .noted("equal shares, BatchBalancer and CadenceBalancer beside the ideal step; "
                     "needs --straggle-ms"),
          word("--device", o.device, {"cpu", "cuda"}),
          count("--emulate-nodes", o.emulate_nodes, 0, 4096)
              .noted("N > 0: braid and PyTorch across N nodes emulated here (root)"),
          word("--link-rate", o.link_rate)
              .noted("with --emulate-nodes: each node's link shaped to this (10gbit)")};
}

// What the worker and the PyTorch peer are given alike.
std::vector<std::string> model_arguments(const DdpOptions& o) {
  DdpOptions copy = o;
  std::vector<std::string> args{"--optimizer", o.optimizer};
  for (auto& a : arguments(table(copy), {"--hidden", "--layers", "--batch", "--steps",
                                         "--straggle-ms", "--device"}))
    args.push_back(a);
  return args;
}

// braid-bench-ddp-worker --sync `sync` with `o`'s model, steps and straggler, and `extra`
// arguments: the JSON line it printed, or nullopt (its output shown on stderr).
std::optional<std::string> run_braid(const DdpOptions& o, const std::string& sync,
                                     const std::vector<std::string>& extra = {}) {
  std::vector<std::string> argv =
      under_braid_run(o.ranks, "braid-bench-ddp-worker", {"--sync", sync});
  for (auto& a : model_arguments(o)) argv.push_back(a);
  for (auto& a : extra) argv.push_back(a);
  on_emulated_nodes(argv, o.emulate_nodes, o.link_rate, o.ranks);
  return result_line(run_command(argv, std::chrono::seconds(900)), "sync", "ddp",
                     "braid-bench-ddp-worker --sync " + sync, true);
}

std::optional<std::string> run_pytorch(const DdpOptions& o,
                                       const std::vector<std::string>& extra = {}) {
  std::optional<std::vector<std::string>> argv = python_peer("braid-bench-ddp-peer.py");
  if (!argv) {
    std::cerr << "braid-bench ddp: no PyTorch peer (a python3 with torch, or "
              << sibling_program("braid-bench-ddp-peer.py") << ")\n";
    return std::nullopt;
  }
  argv->insert(argv->end(), {"--ranks", std::to_string(o.ranks)});
  for (auto& a : model_arguments(o)) argv->push_back(a);
  for (auto& a : extra) argv->push_back(a);
  if (o.emulate_nodes > 0) {
    // One process per rank under braid-run (env:// from its variables), Gloo's sockets on
    // the nodes' links.
    std::vector<std::string> launched{
        sibling_program("braid-run"), "-n", std::to_string(o.ranks), "--timeout", "850", "env",
        "GLOO_SOCKET_IFNAME=eth0"};
    on_emulated_nodes(launched, o.emulate_nodes, o.link_rate, o.ranks);
    launched.insert(launched.end(), argv->begin(), argv->end());
    *argv = std::move(launched);
  }
  // Any exit: Gloo's processes can crash in their teardown, after the line is printed.
  return result_line(run_command(*argv, std::chrono::seconds(900)), "sync", "ddp",
                     extra.empty() ? "PyTorch DDP" : "PyTorch DDP with " + extra.front(), true);
}

// One configuration's paired figures, the mean over its rounds (braid-bench-ddp-worker --sync
// paired and the PyTorch peer print the same keys), and two of its own: exposed_ci_ms, the
// 95% half-width of the mean over rounds, and runtime_cpu_ms, braid's runtime thread's CPU
// in a synchronised step less in a no_sync() one.
using Figures = std::map<std::string, double>;

Figures mean_over_rounds(const std::vector<std::string>& runs) {
  Figures f = means(runs, {"step_ms", "none_step_ms", "exposed_ms", "cpu_ms", "exposed_cpu_ms",
                           "bare_all_reduce_ms", "bare_cpu_ms", "bare_shared_all_reduce_ms",
                           "bare_shared_cpu_ms", "exposed_ms_per_step", "exposed_off_core_ms",
                           "progress_cpu_ms", "none_progress_cpu_ms"});
  double squares = 0;
  for (const std::string& run : runs)
    squares += std::pow(json_number(run, "exposed_ci_ms").value_or(0), 2);
  f["exposed_ci_ms"] = std::sqrt(squares) / static_cast<double>(runs.size());
  if (f.count("progress_cpu_ms")) {
    f["runtime_cpu_ms"] = f["progress_cpu_ms"] - figure(f, "none_progress_cpu_ms").value_or(0);
  }
  return f;
}

// One optimizer's runs and report.
int report_ddp(const DdpOptions& o) {
  // Each run pairs its steps: one synchronised, one under no_sync() (no gradient sync at
  // all), alternating, so the exposed communication is measured as paired differences
  // inside one process. Two separate runs' step times drift by tens of percent on a
  // shared VM, ten times the figure sought. Rounds interleave the configurations, so a
  // slow spell of the machine hits them alike; figures are means over rounds.
  // braid-run gives its ranks OMP_NUM_THREADS=1 (one OpenMP and one BLAS thread each);
  // the PyTorch peer's ranks get the same from here.
  if (std::getenv("OMP_NUM_THREADS") == nullptr) ::setenv("OMP_NUM_THREADS", "1", 1);
  // Four configurations: braid's default (gradients live in the buckets) and its copy mode,
  // PyTorch's default (copy mode) and PyTorch with gradient_as_bucket_view, so that each
  // braid row has a like-for-like PyTorch row beside the reference, PyTorch's
  // default.
  struct Config {
    bool braid;
    std::vector<std::string> extra;
  };
  const std::vector<Config> configs{{true, {}},
                                    {true, {"--copy-gradients"}},
                                    {false, {}},
                                    {false, {"--gradient-as-bucket-view"}}};
  const auto runs = run_rounds(o.rounds, configs, [&](const Config& c) {
    return c.braid ? run_braid(o, "paired", c.extra) : run_pytorch(o, c.extra);
  });
  const auto& [braid_runs, copy_runs, torch_runs, torch_view_runs] =
      std::tie(runs[0], runs[1], runs[2], runs[3]);
  if (braid_runs.empty()) return 1;
  Figures braid = mean_over_rounds(braid_runs);
  const double params = json_number(braid_runs.front(), "parameters").value_or(0);
  std::cout << fmt::format(
      "MLP {}x{} ({:.1f}M parameters, {:.1f} MiB of f32 gradients), batch {} per rank, {}, {} "
      "ranks on {}{}; {} steps per run, paired (a synchronised step and a no_sync() step, in "
      "alternating order, each timed on its slowest rank); means of {} interleaved rounds:\n\n",
      o.hidden, o.layers, params / 1e6, params * 4 / (1 << 20), o.batch, o.optimizer, o.ranks,
      o.device == "cuda" ? "CUDA" : "the CPU",
      o.emulate_nodes == 0 ? std::string()
                           : fmt::format(", {} emulated nodes{}", o.emulate_nodes,
                                         o.link_rate.empty() ? "" : " linked at " + o.link_rate),
      o.steps, o.rounds);
  // The step's compute depends on the BLAS libtorch calls (docs/user-guide.md, BLAS); an
  // OpenBLAS kernel choice made by hand belongs beside the figures.
  if (o.straggle_ms > 0) {
    std::cout << fmt::format(
        "(--straggle-ms {}: rank {} computes {} ms more before each backward, in every step, "
        "for braid and PyTorch alike)\n\n",
        o.straggle_ms, o.ranks - 1, o.straggle_ms);
  }
  if (const char* core = std::getenv("OPENBLAS_CORETYPE"); core != nullptr && *core != '\0') {
    std::cout << fmt::format("(OPENBLAS_CORETYPE={}, for braid and PyTorch alike)\n\n", core);
  }
  const Report report(false,
                      {"", "step ms", "no-sync ms", "exposed ms (95% CI)", "traced", "off-core",
                       "CPU ms", "comm CPU", "runtime"},
                      {-24, 9, 12, 22, 8, 9, 9, 9, 9});
  report.heading();
  // Each configuration's row; nullopt where it has no runs.
  auto row = [&](const std::string& name, const std::vector<std::string>& runs) {
    if (runs.empty()) return std::optional<Figures>();
    Figures f = mean_over_rounds(runs);
    report.say(report.line({name, fixed(f["step_ms"], 2), fixed(f["none_step_ms"], 2),
                            fmt::format("{:.2f} +- {:.2f}", f["exposed_ms"], f["exposed_ci_ms"]),
                            fixed(figure(f, "exposed_ms_per_step"), 2),
                            fixed(figure(f, "exposed_off_core_ms"), 2), fixed(f["cpu_ms"], 2),
                            fixed(f["exposed_cpu_ms"], 2), fixed(figure(f, "runtime_cpu_ms"), 2)}));
    return std::optional(f);
  };
  row("braid DDP", braid_runs);
  const std::optional<Figures> copy = row("braid DDP, copy mode", copy_runs);
  // The peer's backend: Gloo on the CPU; on GPUs NCCL where every rank has one, else Gloo.
  const bool nccl_peer =
      !torch_runs.empty() && json_number(torch_runs.front(), "nccl").value_or(0) != 0;
  std::optional<Figures> torch =
      row(nccl_peer ? "PyTorch DDP (NCCL)" : "PyTorch DDP (Gloo)", torch_runs);
  const std::optional<Figures> torch_view = row("PyTorch DDP, bucket view", torch_view_runs);
  std::cout << fmt::format(
      "\nexposed: synchronised minus no_sync() step, pair by pair; traced: what braid-trace "
      "counts as exposed;\noff-core: the same difference in the time the training thread spent "
      "off its core (the core overlap took from compute);\ncomm CPU: the same difference in "
      "process CPU time (every thread); runtime: the same in braid's runtime thread "
      "alone;\nCPU and off-core times are means over ranks.\n");
  std::cout << fmt::format(
      "\nbare all-reduce of all gradients (braid, one buffer), per rank, in the default "
      "runs: {:.2f} ms ({:.2f} ms CPU) on a plain buffer; {:.2f} ms ({:.2f} ms CPU) on memory "
      "from allocate_shared, where DDP keeps its buckets. Each configuration's ratios below "
      "use the bare all-reduce its own runs measured.\n",
      braid["bare_all_reduce_ms"], braid["bare_cpu_ms"], braid["bare_shared_all_reduce_ms"],
      braid["bare_shared_cpu_ms"]);
  // `view_peer`: for a row whose gradients live in the buckets, PyTorch's run with
  // gradient_as_bucket_view (its default, the reference above, copies as copy mode does).
  auto ratios = [&](const std::string& name, Figures f, std::optional<Figures> view_peer) {
    const double exposed = std::max(f["exposed_ms"], 0.0);
    const double bare = f["bare_all_reduce_ms"], bare_shared = f["bare_shared_all_reduce_ms"];
    std::cout << fmt::format(
        "{}: exposed / bare all-reduce {:.2f} ({:.2f} / {:.2f} ms, the bare all-reduce measured "
        "in these runs; goal <= 0.7; {:.2f} against the shared-memory one, {:.2f} ms)",
        name, bare > 0 ? exposed / bare : 0.0, exposed, bare,
        bare_shared > 0 ? exposed / bare_shared : 0.0, bare_shared);
    if (torch) {
      std::cout << fmt::format(
          "; step / PyTorch's {:.2f} (goal <= 0.9); exposed / PyTorch's {:.2f} (goal <= 0.5)",
          f["step_ms"] / (*torch)["step_ms"], exposed / std::max((*torch)["exposed_ms"], 1e-9));
    }
    if (view_peer) {
      std::cout << fmt::format(
          "; like for like, against PyTorch with gradient_as_bucket_view: step {:.2f}, exposed "
          "{:.2f}",
          f["step_ms"] / (*view_peer)["step_ms"],
          exposed / std::max((*view_peer)["exposed_ms"], 1e-9));
    }
    std::cout << "\n";
  };
  ratios("braid DDP", braid, torch_view);
  if (copy) ratios("braid DDP, copy mode", *copy, std::nullopt);
  return 0;
}

// --balance: one optimizer's runs and report.
int report_ddp_balance(const DdpOptions& run) {
  const std::vector<std::string> modes{"equal", "shares", "cadence"};
  const auto lines = run_rounds(run.rounds, modes, [&](const std::string& mode) {
    return run_braid(run, "ddp", {"--balance", mode});
  });
  std::map<std::string, Figures> figures;
  double global_batch = 0;
  for (std::size_t m = 0; m < modes.size(); ++m) {
    if (lines[m].empty()) return 1;
    figures[modes[m]] = means(
        lines[m], {"step_ms", "slowest_compute_ms", "samples_per_step", "ideal_ms", "speed_ratio"});
    global_batch = json_number(lines[m].back(), "global_batch").value_or(0);
  }
  Figures& equal = figures["equal"];
  Figures& balanced = figures["shares"];
  Figures& cadence = figures["cadence"];
  // The ideal from the balanced runs' own throughputs (a rank's throughput depends a little
  // on its batch size).
  const double ideal_ms = balanced["ideal_ms"];
  // The last round's throughputs and batch sizes.
  const auto last_text = [&](std::size_t m, const char* key) {
    return json_text(lines[m].back(), key);
  };
  std::cout << fmt::format(
      "{} ranks, the last computing {} ms more per {} samples (measured: the fastest rank "
      "{:.2f}x the slowest, samples per second of compute {}); global batch {}; steps {} to {} "
      "timed on the slowest rank; means of {} interleaved rounds:\n\n",
      run.ranks, run.straggle_ms, static_cast<int>(global_batch) / run.ranks,
      balanced["speed_ratio"], last_text(1, "throughputs"), global_batch, run.steps / 2 + 1,
      run.steps, run.rounds);
  // The last column is two spaces after the one before it, its cells unpadded.
  const Report report(
      false,
      {"", "step ms", "samples", "ms per batch", "samples/s", "compute", "/ ideal", " per rank"},
      {-30, 9, 10, 14, 11, 9, 8, 0});
  report.heading();
  auto row = [&](const std::string& name, Figures& f, const std::string& per_rank) {
    const double per_batch = f["step_ms"] * global_batch / f["samples_per_step"];
    report.say(report.line(
        {name, fixed(f["step_ms"], 2), fixed(f["samples_per_step"], 0), fixed(per_batch, 2),
         fixed(1e3 * f["samples_per_step"] / f["step_ms"], 0), fixed(f["slowest_compute_ms"], 2),
         fixed(per_batch / ideal_ms, 2), " " + per_rank}));
  };
  row("equal shares", equal, "");
  row("balanced (BatchBalancer)", balanced, "batch " + last_text(1, "counts"));
  row("cadence (CadenceBalancer)", cadence, "micro-batches " + last_text(2, "counts"));
  report.say(
      report.line({"ideal (batch / sum of rates)", fixed(ideal_ms, 2), fixed(global_batch, 0),
                   fixed(ideal_ms, 2), fixed(1e3 * global_batch / ideal_ms, 0)}));
  std::cout << fmt::format(
      "\nsamples: every rank's per step (a cadence step is a window of micro-batches); ms per "
      "batch: the time per {:.0f} samples; compute: the slowest rank's forward and backward "
      "per step (its thread's CPU time). The rest of a step is the optimizer and the exposed "
      "synchronisation, which balancing does not shrink: {:.2f} ms equal, {:.2f} ms "
      "balanced.\nbalanced / ideal {:.2f} (goal <= 1.15); its compute / the ideal {:.2f} (what "
      "the balancer decides); balanced / equal {:.2f}; cadence / ideal {:.2f}\n",
      global_batch, equal["step_ms"] - equal["slowest_compute_ms"],
      balanced["step_ms"] - balanced["slowest_compute_ms"], balanced["step_ms"] / ideal_ms,
      balanced["slowest_compute_ms"] / ideal_ms, balanced["step_ms"] / equal["step_ms"],
      cadence["step_ms"] * global_batch / cadence["samples_per_step"] / ideal_ms);
  return 0;
}

int run(DdpOptions& o) {
  if (!o.link_rate.empty() && o.emulate_nodes == 0) {
    throw std::invalid_argument("--link-rate needs --emulate-nodes");
  }
  if (o.emulate_nodes > 0 && o.ranks % o.emulate_nodes != 0) {
    throw std::invalid_argument(
        fmt::format("--ranks {} does not divide into {} nodes", o.ranks, o.emulate_nodes));
  }
  if (o.balance && !(o.straggle_ms > 0)) {
    throw std::invalid_argument("--balance needs --straggle-ms X (X > 0: a slower last rank)");
  }
  // Balancing is for jobs whose compute dominates a step: 128 samples a rank unless given.
  if (o.batch == 0) o.batch = o.balance ? 128 : 32;
  // Most users train with Adam; SGD's cheaper step leaves communication a larger share.
  int status = 0;
  for (const auto& optimizer : o.optimizers) {
    o.optimizer = optimizer;
    if (optimizer != o.optimizers.front()) std::cout << "\n";
    if (o.balance) {
      // Only braid runs here, and braid-run gives its ranks one thread each.
      std::cout << fmt::format("MLP {}x{}, {}:\n", o.hidden, o.layers, optimizer);
      status = std::max(status, report_ddp_balance(o));
    } else {
      status = std::max(status, report_ddp(o));
    }
  }
  return status;
}

}  // namespace

Mode ddp_mode() {
  return describe<DdpOptions>(
      {.name = "ddp",
       .about = "one model trained with braid DDP, PyTorch DDP (Gloo) and no sync, in one run: "
                "step time, exposed communication, bare all-reduce, ratios",
       .options = table,
       .run = run});
}

}  // namespace braid::bench
