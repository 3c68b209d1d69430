// braid-bench ddp: DDP's figures (ddp_runs.hpp says what each report runs). The runs, the
// mean over rounds of their paired figures, and the table beside PyTorch.
#include <algorithm>
#include <cmath>
#include <cstdlib>
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
#include "ddp_runs.hpp"
#include "modes.hpp"

namespace braid::bench {
namespace {

// One configuration's paired figures, the mean over its rounds (braid-bench-ddp-worker --sync
// paired and the PyTorch peer print the same fields).
struct PairedFigures {
  double step_ms = 0;
  double none_step_ms = 0;
  double exposed_ms = 0;
  double exposed_ci_ms = 0;  // 95% half-width of the mean over rounds
  double cpu_ms = 0;
  double exposed_cpu_ms = 0;
  std::optional<double> runtime_cpu_ms;  // braid's runtime thread: synchronised - no_sync()
  double bare_ms = 0;                    // a plain buffer
  double bare_cpu_ms = 0;
  double bare_shared_ms = 0;  // memory the ranks share, as DDP's buckets are
  double bare_shared_cpu_ms = 0;
  std::optional<double> traced_exposed_ms;
  // braid's: how much longer the training thread was off its core in a synchronised step
  std::optional<double> off_core_ms;
};

PairedFigures mean_over_rounds(const std::vector<std::string>& runs) {
  const auto n = static_cast<double>(runs.size());
  // The sum of `key` (through `of`) over the runs that print it, over all runs; nullopt where
  // none does.
  auto mean = [&](const std::string& key, auto&& of) -> std::optional<double> {
    std::optional<double> sum;
    for (const std::string& run : runs) {
      if (const auto value = json_number(run, key)) sum = sum.value_or(0) + of(*value);
    }
    return sum ? std::optional(*sum / n) : std::nullopt;
  };
  const auto same = [](double x) { return x; };
  auto plain = [&](const std::string& key) { return mean(key, same).value_or(0); };
  PairedFigures f{
      .step_ms = plain("step_ms"),
      .none_step_ms = plain("none_step_ms"),
      .exposed_ms = plain("exposed_ms"),
      .exposed_ci_ms =
          std::sqrt(mean("exposed_ci_ms", [](double ci) { return ci * ci; }).value_or(0) * n) / n,
      .cpu_ms = plain("cpu_ms"),
      .exposed_cpu_ms = plain("exposed_cpu_ms"),
      .bare_ms = plain("bare_all_reduce_ms"),
      .bare_cpu_ms = plain("bare_cpu_ms"),
      .bare_shared_ms = plain("bare_shared_all_reduce_ms"),
      .bare_shared_cpu_ms = plain("bare_shared_cpu_ms"),
      .traced_exposed_ms = mean("exposed_ms_per_step", same),
      .off_core_ms = mean("exposed_off_core_ms", same)};
  if (const auto with = mean("progress_cpu_ms", same)) {
    f.runtime_cpu_ms = *with - plain("none_progress_cpu_ms");
  }
  return f;
}

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
          word("--device", o.device, {"cpu", "cuda"})};
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

}  // namespace

std::optional<std::string> run_braid(const DdpOptions& o, const std::string& sync,
                                     const std::vector<std::string>& extra) {
  std::vector<std::string> argv =
      under_braid_run(o.ranks, "braid-bench-ddp-worker", {"--sync", sync});
  for (auto& a : model_arguments(o)) argv.push_back(a);
  for (auto& a : extra) argv.push_back(a);
  return result_line(run_command(argv, std::chrono::seconds(900)), "sync", "ddp",
                     "braid-bench-ddp-worker --sync " + sync, true);
}

namespace {

std::optional<std::string> run_pytorch(const DdpOptions& o,
                                       const std::vector<std::string>& extra = {}) {
  const std::string script = sibling_program("braid-bench-ddp-peer.py");
  const std::optional<std::string> python = torch_python();
  if (!python || !std::filesystem::exists(script)) {
    std::cerr << "braid-bench ddp: no PyTorch peer (a python3 with torch, or " << script << ")\n";
    return std::nullopt;
  }
  std::vector<std::string> argv{*python, script, "--ranks", std::to_string(o.ranks)};
  for (auto& a : model_arguments(o)) argv.push_back(a);
  for (auto& a : extra) argv.push_back(a);
  // Any exit: Gloo's processes can crash in their teardown, after the line is printed.
  return result_line(run_command(argv, std::chrono::seconds(900)), "sync", "ddp",
                     extra.empty() ? "PyTorch DDP" : "PyTorch DDP with " + extra.front(), true);
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
  const PairedFigures braid = mean_over_rounds(braid_runs);
  const double params = json_number(braid_runs.front(), "parameters").value_or(0);
  std::cout << fmt::format(
      "MLP {}x{} ({:.1f}M parameters, {:.1f} MiB of f32 gradients), batch {} per rank, {}, {} "
      "ranks on {}; {} steps per run, paired (a synchronised step and a no_sync() step, in "
      "alternating order, each timed on its slowest rank); means of {} interleaved rounds:\n\n",
      o.hidden, o.layers, params / 1e6, params * 4 / (1 << 20), o.batch, o.optimizer, o.ranks,
      o.device == "cuda" ? "CUDA" : "the CPU", o.steps, o.rounds);
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
  std::cout << fmt::format("{:<24} {:>9} {:>12} {:>22} {:>8} {:>9} {:>9} {:>9} {:>9}\n", "",
                           "step ms", "no-sync ms", "exposed ms (95% CI)", "traced", "off-core",
                           "CPU ms", "comm CPU", "runtime");
  auto optional_ms = [](const std::optional<double>& ms) {
    return ms ? fmt::format("{:.2f}", *ms) : std::string("-");
  };
  auto row = [&](const std::string& name, const PairedFigures& f) {
    std::cout << fmt::format(
        "{:<24} {:>9.2f} {:>12.2f} {:>22} {:>8} {:>9} {:>9.2f} {:>9.2f} {:>9}\n", name, f.step_ms,
        f.none_step_ms, fmt::format("{:.2f} +- {:.2f}", f.exposed_ms, f.exposed_ci_ms),
        optional_ms(f.traced_exposed_ms), optional_ms(f.off_core_ms), f.cpu_ms, f.exposed_cpu_ms,
        optional_ms(f.runtime_cpu_ms));
  };
  row("braid DDP", braid);
  std::optional<PairedFigures> copy;
  if (!copy_runs.empty()) row("braid DDP, copy mode", *(copy = mean_over_rounds(copy_runs)));
  std::optional<PairedFigures> torch;
  // The peer's backend: Gloo on the CPU; on GPUs NCCL where every rank has one, else Gloo.
  const bool nccl_peer =
      !torch_runs.empty() && json_number(torch_runs.front(), "nccl").value_or(0) != 0;
  if (!torch_runs.empty()) {
    row(nccl_peer ? "PyTorch DDP (NCCL)" : "PyTorch DDP (Gloo)",
        *(torch = mean_over_rounds(torch_runs)));
  }
  std::optional<PairedFigures> torch_view;
  if (!torch_view_runs.empty()) {
    row("PyTorch DDP, bucket view", *(torch_view = mean_over_rounds(torch_view_runs)));
  }
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
      braid.bare_ms, braid.bare_cpu_ms, braid.bare_shared_ms, braid.bare_shared_cpu_ms);
  // `view_peer`: for a row whose gradients live in the buckets, PyTorch's run with
  // gradient_as_bucket_view (its default, the reference above, copies as copy mode does).
  auto ratios = [&](const std::string& name, const PairedFigures& f,
                    const std::optional<PairedFigures>& view_peer) {
    const double exposed = std::max(f.exposed_ms, 0.0);
    std::cout << fmt::format(
        "{}: exposed / bare all-reduce {:.2f} ({:.2f} / {:.2f} ms, the bare all-reduce measured "
        "in these runs; goal <= 0.7; {:.2f} against the shared-memory one, {:.2f} ms)",
        name, f.bare_ms > 0 ? exposed / f.bare_ms : 0.0, exposed, f.bare_ms,
        f.bare_shared_ms > 0 ? exposed / f.bare_shared_ms : 0.0, f.bare_shared_ms);
    if (torch) {
      std::cout << fmt::format(
          "; step / PyTorch's {:.2f} (goal <= 0.9); exposed / PyTorch's {:.2f} (goal <= 0.5)",
          f.step_ms / torch->step_ms, exposed / std::max(torch->exposed_ms, 1e-9));
    }
    if (view_peer) {
      std::cout << fmt::format(
          "; like for like, against PyTorch with gradient_as_bucket_view: step {:.2f}, exposed "
          "{:.2f}",
          f.step_ms / view_peer->step_ms, exposed / std::max(view_peer->exposed_ms, 1e-9));
    }
    std::cout << "\n";
  };
  ratios("braid DDP", braid, torch_view);
  if (copy) ratios("braid DDP, copy mode", *copy, std::nullopt);
  return 0;
}

int run(DdpOptions& o) {
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
