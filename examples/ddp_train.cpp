// Data-parallel training with braid: a libtorch model wrapped in
// braid::torch::DistributedDataParallel, trained on a synthetic task (a student network
// learning a fixed random teacher), each rank on its own shard of the data. Gradients are
// all-reduced in buckets while backward is still running; the run ends with the overlap
// summary (how much of that communication backward hid).
//
//   braid-run -n 2 build/examples/ddp_train                     # MLP 512x5, 100 steps
//   braid-run -n 2 build/examples/ddp_train --model transformer
//   BRAID_TRACE=traces braid-run -n 2 build/examples/ddp_train  # plus a trace per rank
//
// Options: --model mlp|transformer  --steps N  --batch B (per rank)  --hidden H
//          --layers L  --lr X  --sync ddp|none|paired (none: no gradient sync, for
//          comparison; paired: DDP steps alternating with no_sync() steps in one process,
//          so that the difference, the exposed communication, is measured in pairs)
//          --bench (time steps after a warm-up and print one JSON line on rank 0)
//          --threads T (libtorch intra-op threads per rank, default 1)
//          --optimizer adam|sgd (default adam, lr --lr; sgd: lr 0.01, momentum 0.9)
//          --bucket-cap-mib M (DDP bucket cap, default 25)
//          --copy-gradients (gradients copied into the buckets and back, as PyTorch's
//          default does, instead of living in them)
//          --private-buckets (buckets in private memory, not memory the ranks share)
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <ctime>
#include <deque>
#include <iostream>
#include <numeric>
#include <string>

#include <fmt/format.h>
#include <torch/torch.h>

#include <braid/braid.hpp>
#include <braid/torch/distributed_data_parallel.hpp>
#include <braid/torch/tensor_buffer.hpp>

#include "models.hpp"

namespace {

using example_models::Mlp;
using example_models::Task;
using example_models::Transformer;

constexpr const char* kUsage = R"(usage: braid-run -n N ddp_train [options]

Trains a model with braid's DistributedDataParallel on synthetic data, one rank per
process, printing the loss per step, and ends with the overlap summary (BRAID_TRACE=dir
also writes the trace for braid-trace).

options:
  --model mlp|transformer  the model (default mlp)
  --hidden N               width (default 512 for the MLP, 256 for the transformer)
  --layers N               hidden layers or blocks (default 5 MLP, 4 transformer)
  --batch N                samples per rank per step (default 32)
  --steps N                training steps (default 100 MLP, 60 transformer)
  --lr X                   learning rate (default 0.001)
  --optimizer adam|sgd     (default adam)
  --threads N              libtorch's intra-op threads per rank (default 1)
  --bucket-cap-mib X       gradient bucket cap (default 25)
  --copy-gradients         copy gradients into the buckets and back (PyTorch's default)
                           instead of keeping them in the buckets (braid's default)
  --private-buckets        buckets in private memory instead of memory the ranks share
  --sync ddp|none|paired   ddp (default); none: no gradient sync; paired: with --bench,
                           alternate a synchronised and a no_sync() step
  --uneven K               rank r stops K x r steps early (uneven inputs): the ranks
                           that run out join() and shadow the others' steps, and every
                           rank ends with the same weights
  --straggle-ms X          the last rank computes X ms more before each backward (a
                           slower rank), in every step alike (default 0)
  --bench                  print one JSON line of timings instead of the progress display
  -h, --help               print this help, and exit
)";

// Keeps this thread's core busy for `ms` milliseconds (a slower rank's extra compute).
void compute_for(double ms) {
  const auto until = std::chrono::steady_clock::now() +
                     std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                         std::chrono::duration<double, std::milli>(ms));
  volatile double sink = 1.0;
  while (std::chrono::steady_clock::now() < until) {
    for (int i = 0; i < 1000; ++i) sink = sink * 1.0000001 + 1e-9;
  }
}

struct Settings {
  std::string model = "mlp";
  // 0: the model's default. The MLP's (512 wide, 5 layers, 100 steps: 1.44M parameters in
  // several buckets) gives backward enough to overlap; at 256x4 its gradients filled one
  // bucket that backward finished at its very end, and the summary showed ~0% overlap.
  int steps = 0;
  int batch = 32;
  int hidden = 0;
  int layers = 0;
  double lr = 1e-3;
  std::string sync = "ddp";
  bool bench = false;
  int threads = 1;
  std::string optimizer = "adam";
  double bucket_cap_mib = 25;
  bool bucket_view = true;
  bool private_buckets = false;
  int uneven = 0;
  double straggle_ms = 0;
  bool help = false;
};

Settings parse(int argc, char** argv) {
  Settings s;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw std::invalid_argument(arg + " needs a value");
      return argv[++i];
    };
    if (arg == "-h" || arg == "--help") {
      s.help = true;
      return s;
    }
    if (arg == "--model")
      s.model = value();
    else if (arg == "--steps")
      s.steps = std::stoi(value());
    else if (arg == "--batch")
      s.batch = std::stoi(value());
    else if (arg == "--hidden")
      s.hidden = std::stoi(value());
    else if (arg == "--layers")
      s.layers = std::stoi(value());
    else if (arg == "--lr")
      s.lr = std::stod(value());
    else if (arg == "--sync")
      s.sync = value();
    else if (arg == "--threads")
      s.threads = std::stoi(value());
    else if (arg == "--optimizer")
      s.optimizer = value();
    else if (arg == "--bucket-cap-mib")
      s.bucket_cap_mib = std::stod(value());
    else if (arg == "--bench")
      s.bench = true;
    else if (arg == "--straggle-ms")
      s.straggle_ms = std::stod(value());
    else if (arg == "--copy-gradients")
      s.bucket_view = false;
    else if (arg == "--private-buckets")
      s.private_buckets = true;
    else if (arg == "--uneven")
      s.uneven = std::stoi(value());
    else
      throw std::invalid_argument("unknown option " + arg);
  }
  if (s.model != "mlp" && s.model != "transformer")
    throw std::invalid_argument("--model mlp|transformer");
  const bool mlp = s.model == "mlp";
  if (s.steps == 0) s.steps = mlp ? 100 : 60;
  if (s.hidden == 0) s.hidden = mlp ? 512 : 256;
  if (s.layers == 0) s.layers = mlp ? 5 : 4;
  if (s.sync != "ddp" && s.sync != "none" && s.sync != "paired")
    throw std::invalid_argument("--sync ddp|none|paired");
  if (s.sync == "paired" && (!s.bench || s.steps < 8))
    throw std::invalid_argument(
        "--sync paired is a benchmark mode: it needs --bench, --steps >= 8");
  if (s.uneven != 0 && (s.uneven < 0 || s.sync != "ddp" || s.bench))
    throw std::invalid_argument("--uneven K >= 0, with --sync ddp and without --bench");
  if (s.optimizer != "adam" && s.optimizer != "sgd")
    throw std::invalid_argument("--optimizer adam|sgd");
  if (!(s.straggle_ms >= 0 && s.straggle_ms <= 10000))
    throw std::invalid_argument("--straggle-ms X in [0, 10000]");
  if (s.steps < 2 || s.batch < 1 || s.hidden < 8 || s.layers < 1 || s.threads < 1) {
    throw std::invalid_argument("--steps >= 2, --batch >= 1, --hidden >= 8, --layers >= 1");
  }
  return s;
}

// CPU time of this process, every thread (the training thread and braid's runtime thread).
double cpu_ms(clockid_t clock) {
  timespec t{};
  clock_gettime(clock, &t);
  return static_cast<double>(t.tv_sec) * 1e3 + static_cast<double>(t.tv_nsec) / 1e6;
}
double process_cpu_ms() {
  return cpu_ms(CLOCK_PROCESS_CPUTIME_ID);
}
// The training thread's own (forward, backward, optimizer; not braid's runtime thread).
double thread_cpu_ms() {
  return cpu_ms(CLOCK_THREAD_CPUTIME_ID);
}

// What --bench reports of the timed steps: means of the synchronised steps and, paired,
// of the no_sync() steps, and the exposed communication as the mean of the pairs'
// differences (each pair ran back to back, so a slow spell of the machine hits both
// halves: the difference is far steadier than two runs' step times, which drift by tens
// of percent here), with its 95% confidence half-width.
struct StepFigures {
  double step_ms = 0;
  double cpu_ms = 0;
  double none_step_ms = 0;
  double none_cpu_ms = 0;
  double exposed_ms = 0;
  double exposed_ci_ms = 0;
  double exposed_cpu_ms = 0;
  double progress_cpu_ms = 0;       // braid's runtime thread, per synchronised step
  double none_progress_cpu_ms = 0;  // ... per no_sync() step
  // How much longer the training thread was off its core in a synchronised step than in
  // its no_sync() partner (step time minus the thread's CPU time): the core its compute
  // lost, mostly to braid's runtime thread reducing there.
  double exposed_off_core_ms = 0;
  int pairs = 0;
};

// Student's t for a two-sided 95% interval with `df` degrees of freedom: 1.96 would
// understate the interval of a mean over a dozen pairs.
double t95(int df) {
  static constexpr double kTable[] = {12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306,
                                      2.262,  2.228, 2.201, 2.179, 2.160, 2.145, 2.131, 2.120,
                                      2.110,  2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064,
                                      2.060,  2.056, 2.052, 2.048, 2.045, 2.042};
  if (df < 1) return 0;
  if (df <= 30) return kTable[df - 1];
  return df <= 60 ? 2.000 : df <= 120 ? 1.980 : 1.960;
}

StepFigures step_figures(const std::vector<double>& ms, const std::vector<double>& cpu_ms,
                         const std::vector<double>& progress_cpu_ms,
                         const std::vector<double>& off_core_ms, const std::vector<bool>& synced,
                         bool paired) {
  StepFigures f;
  int synced_steps = 0;
  int local_steps = 0;
  for (std::size_t i = 0; i < ms.size(); ++i) {
    if (synced[i] || !paired) {
      f.step_ms += ms[i];
      f.cpu_ms += cpu_ms[i];
      f.progress_cpu_ms += progress_cpu_ms[i];
      ++synced_steps;
    } else {
      f.none_step_ms += ms[i];
      f.none_cpu_ms += cpu_ms[i];
      f.none_progress_cpu_ms += progress_cpu_ms[i];
      ++local_steps;
    }
  }
  if (synced_steps > 0) {
    f.step_ms /= synced_steps;
    f.cpu_ms /= synced_steps;
    f.progress_cpu_ms /= synced_steps;
  }
  if (local_steps > 0) {
    f.none_step_ms /= local_steps;
    f.none_cpu_ms /= local_steps;
    f.none_progress_cpu_ms /= local_steps;
  }
  if (!paired) return f;
  std::vector<double> differences;
  for (std::size_t i = 0; i + 1 < ms.size(); i += 2) {
    const std::size_t with = synced[i] ? i : i + 1;
    const std::size_t without = synced[i] ? i + 1 : i;
    differences.push_back(ms[with] - ms[without]);
    f.exposed_cpu_ms += cpu_ms[with] - cpu_ms[without];
    f.exposed_off_core_ms += off_core_ms[with] - off_core_ms[without];
  }
  f.pairs = static_cast<int>(differences.size());
  if (f.pairs == 0) return f;
  f.exposed_ms = std::accumulate(differences.begin(), differences.end(), 0.0) / f.pairs;
  f.exposed_cpu_ms /= f.pairs;
  f.exposed_off_core_ms /= f.pairs;
  if (f.pairs > 1) {
    double squares = 0;
    for (double d : differences) squares += (d - f.exposed_ms) * (d - f.exposed_ms);
    f.exposed_ci_ms = t95(f.pairs - 1) * std::sqrt(squares / (f.pairs - 1) / f.pairs);
  }
  return f;
}

template <class Model>
int train(braid::transport::World& world, const Settings& s, Model model) {
  auto comm = braid::collectives::Communicator::world(world);
  const Task task(s.hidden, s.model == "transformer");
  std::int64_t parameters = 0;
  for (const auto& p : model->parameters()) parameters += p.numel();
  const bool paired = s.sync == "paired";
  const bool sync = s.sync != "none";
  std::optional<braid::torch::DistributedDataParallel<Model>> ddp;
  braid::torch::DistributedDataParallelOptions options;
  options.limits.bucket_cap_bytes = static_cast<std::size_t>(s.bucket_cap_mib * (1 << 20));
  options.gradient_as_bucket_view = s.bucket_view;
  options.shared_buckets = !s.private_buckets;
  if (sync) ddp.emplace(model, comm, options);  // broadcasts rank 0's initial weights
  // Adam converges on the task in a few dozen steps; SGD (lr 0.01, momentum 0.9) is the
  // cheaper step the benchmark uses, so communication is a larger share of it.
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  if (s.optimizer == "adam") {
    optimizer =
        std::make_unique<torch::optim::Adam>(model->parameters(), torch::optim::AdamOptions(s.lr));
  } else {
    optimizer = std::make_unique<torch::optim::SGD>(model->parameters(),
                                                    torch::optim::SGDOptions(0.01).momentum(0.9));
  }
  if (comm->rank() == 0 && !s.bench) {
    std::cout << fmt::format(
        "ddp_train: {} with {:.2f}M parameters on {} rank(s), batch {} per "
        "rank, {} steps, gradient sync: {}\n",
        s.model, static_cast<double>(parameters) / 1e6, comm->size(), s.batch, s.steps,
        !sync           ? "none"
        : s.bucket_view ? "braid DDP, gradients in the buckets"
                        : "braid DDP, copy mode");
  }
  // Paired steps come in pairs (2k, 2k + 1); the warm-up ends on a pair boundary.
  const int warmup = s.bench ? std::min(5, s.steps / 4) & (paired ? ~1 : ~0) : 0;
  double first_loss = 0;
  double last_loss = 0;
  std::deque<double> recent;  // the last 5 losses: one batch's loss is noisy
  // --bench: each timed step's wall time and process CPU time (every thread: training and
  // braid's runtime thread), and whether it synchronised gradients.
  std::vector<double> timed_ms;
  std::vector<double> timed_cpu_ms;
  std::vector<double> timed_progress_cpu_ms;  // braid's runtime thread alone
  std::vector<double> timed_off_core_ms;      // the training thread: wall - its CPU time
  std::vector<bool> timed_synced;
  // The summary covers the training steps from the second on (the first builds buckets).
  std::int64_t summary_from_ns = 0;
  int summarized_synced_steps = 0;
  // --uneven: this rank's share of the steps; the ranks that stop early join().
  const int my_steps = s.steps - s.uneven * comm->rank();
  if (const int fewest = s.steps - s.uneven * (comm->size() - 1); fewest < 2) {
    // Every rank works this out alike, so every rank stops here.
    throw std::invalid_argument(fmt::format("--uneven {} leaves rank {} {} of {} steps (>= 2)",
                                            s.uneven, comm->size() - 1, fewest, s.steps));
  }
  if (s.uneven > 0) ddp->allow_uneven_inputs();
  // --straggle-ms: the last rank is the slower one; it busies its core, as a slower
  // device or a heavier share of the batch would, rather than sleeping.
  const bool straggler = s.straggle_ms > 0 && comm->rank() == comm->size() - 1;
  const auto loop_started = std::chrono::steady_clock::now();
  for (int step = 0; step < my_steps; ++step) {
    // Paired: pair k syncs first when k is even, second when odd, so neither kind of step
    // always follows the other.
    const bool synced = sync && (!paired || step % 2 == (step / 2) % 2);
    if (s.bench && step >= warmup) {
      // Every timed step starts together, so its time on the slowest rank is what the job
      // waited for. The barrier is left out of the trace: it is the benchmark's, not DDP's.
      braid::trace::set_enabled(false);
      comm->launch(comm->barrier()).get();
      braid::trace::set_enabled(true);
    }
    if (step == 1) summary_from_ns = braid::trace::now_ns();
    if (step >= 1 && synced) ++summarized_synced_steps;
    const auto started = std::chrono::steady_clock::now();
    const double cpu_started = process_cpu_ms();
    const double thread_cpu_started = thread_cpu_ms();
    const auto progress_cpu_started = comm->runtime().progress_cpu_time();
    auto [x, y] = task.batch(comm->rank(), step, s.batch);
    torch::Tensor loss;
    auto train_step = [&] {
      optimizer->zero_grad();
      torch::Tensor prediction = sync ? ddp->forward(x) : model->forward(x);
      loss = torch::mse_loss(prediction, y);
      if (straggler) compute_for(s.straggle_ms);
      loss.backward();
      braid::trace::ComputeRegion region("optimizer");
      optimizer->step();
    };
    if (sync && !synced) {
      auto local_only = ddp->no_sync();
      train_step();
    } else {
      train_step();
    }
    const double value = loss.item<double>();
    recent.push_back(value);
    if (recent.size() > 5) recent.pop_front();
    if (step == 4) first_loss = std::accumulate(recent.begin(), recent.end(), 0.0) / 5;
    last_loss =
        std::accumulate(recent.begin(), recent.end(), 0.0) / static_cast<double>(recent.size());
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - started)
            .count();
    if (s.bench && step >= warmup) {
      timed_ms.push_back(ms);
      timed_cpu_ms.push_back(process_cpu_ms() - cpu_started);
      timed_progress_cpu_ms.push_back(
          std::chrono::duration<double, std::milli>(comm->runtime().progress_cpu_time() -
                                                    progress_cpu_started)
              .count());
      timed_off_core_ms.push_back(ms - (thread_cpu_ms() - thread_cpu_started));
      timed_synced.push_back(synced);
    }
    if (comm->rank() == 0 && !s.bench && (step % 5 == 0 || step == s.steps - 1)) {
      const int done = (step + 1) * 30 / s.steps;
      std::cout << fmt::format("step {:>4}/{} [{:<30}] loss {:.5f}  {:.1f} ms/step\n", step + 1,
                               s.steps, std::string(static_cast<std::size_t>(done), '#'), value, ms)
                << std::flush;
    }
  }
  if (s.uneven > 0) {
    const auto joined = ddp->join();
    std::vector<std::int64_t> said{my_steps, static_cast<std::int64_t>(joined.shadowed_forwards)};
    std::vector<std::int64_t> all(2 * static_cast<std::size_t>(comm->size()));
    comm->launch(comm->all_gather(braid::Buffer(said), braid::Buffer(all))).get();
    if (comm->rank() == 0) {
      for (int r = 0; r < comm->size(); ++r) {
        std::cout << fmt::format("rank {} trained {} steps and shadowed {} in join()\n", r,
                                 all[2 * r], all[2 * r + 1]);
      }
      std::cout << fmt::format("every rank now holds rank {}'s weights\n", joined.parameters_from);
    }
  }
  const std::int64_t summary_to_ns = braid::trace::now_ns();
  // Each timed step's time on its slowest rank; CPU times as the mean over ranks.
  comm->launch(comm->all_reduce(braid::Buffer(timed_ms), braid::ReduceOp::max)).get();
  comm->launch(comm->all_reduce(braid::Buffer(timed_cpu_ms), braid::ReduceOp::avg)).get();
  comm->launch(comm->all_reduce(braid::Buffer(timed_progress_cpu_ms), braid::ReduceOp::avg)).get();
  comm->launch(comm->all_reduce(braid::Buffer(timed_off_core_ms), braid::ReduceOp::avg)).get();
  const StepFigures figures_of_steps = step_figures(timed_ms, timed_cpu_ms, timed_progress_cpu_ms,
                                                    timed_off_core_ms, timed_synced, paired);
  const double step_ms = s.bench ? figures_of_steps.step_ms
                                 : std::chrono::duration<double, std::milli>(
                                       std::chrono::steady_clock::now() - loop_started)
                                           .count() /
                                       s.steps;
  // Every rank holds the same weights after DDP (paired runs skip synchronisation on
  // purpose): check one checksum across ranks.
  std::vector<double> checksum{0.0};
  for (const auto& p : model->parameters()) checksum[0] += p.sum().template item<double>();
  std::vector<double> low = checksum;
  std::vector<double> high = checksum;
  comm->launch(comm->all_reduce(braid::Buffer(low), braid::ReduceOp::min)).get();
  comm->launch(comm->all_reduce(braid::Buffer(high), braid::ReduceOp::max)).get();
  if (sync && !paired && low[0] != high[0]) {
    std::cerr << fmt::format("ddp_train: ranks disagree on the weights ({} vs {})\n", low[0],
                             high[0]);
    return 1;
  }

  // The overlap summary: every rank's trace of the training steps, gathered to rank 0 on
  // rank 0's clock, so the summary can also tell waiting for a late rank from transfer.
  braid::trace::Snapshot snapshot = braid::trace::snapshot();
  std::erase_if(snapshot.records, [&](const braid::trace::Record& r) {
    return r.begin_ns < summary_from_ns || r.end_ns > summary_to_ns;
  });
  const braid::trace::ClockAlignment clock = comm->launch(world.clock_alignment()).get();
  const std::optional<braid::trace::Timeline> job =
      comm->launch(braid::collectives::gather_timeline(*comm, std::move(snapshot), clock)).get();

  // The bare all-reduce of every gradient at once, for comparison with what DDP exposed.
  // Its CPU time too (the mean over ranks): on a node whose cores the training threads
  // already fill, that CPU time is what overlapping can at best hide nothing of.
  // Measured twice: on a plain buffer, as a user's own all-reduce of its gradients would
  // run, and on memory the ranks share (Communicator::allocate_shared), as DDP's buckets are.
  struct Bare {
    double ms = 0;
    double cpu_ms = 0;  // mean over ranks
  };
  auto bare_all_reduce = [&](float* data) {
    const braid::Buffer gradients(data, static_cast<std::size_t>(parameters), braid::DType::f32);
    // Two untimed calls: the first maps the arena, the second moves a plain buffer onto
    // huge pages (huge_page_advice.hpp), as a training loop's gradients are after step 2.
    for (int i = 0; i < 2; ++i)
      comm->launch(comm->all_reduce(gradients, braid::ReduceOp::sum)).get();
    constexpr int kRounds = 5;
    const auto start = std::chrono::steady_clock::now();
    const double cpu_start = process_cpu_ms();
    for (int i = 0; i < kRounds; ++i) {
      comm->launch(comm->all_reduce(gradients, braid::ReduceOp::sum)).get();
    }
    Bare bare;
    bare.ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
                  .count() /
              kRounds;
    std::vector<double> cpu{(process_cpu_ms() - cpu_start) / kRounds};
    comm->launch(comm->all_reduce(braid::Buffer(cpu), braid::ReduceOp::avg)).get();
    bare.cpu_ms = cpu[0];
    return bare;
  };
  Bare bare;
  Bare bare_shared;
  if (s.bench) {
    std::vector<float> gradients(static_cast<std::size_t>(parameters), 1.0f);
    bare = bare_all_reduce(gradients.data());
    std::shared_ptr<std::byte[]> shared =
        comm->launch(comm->allocate_shared(static_cast<std::size_t>(parameters) * sizeof(float)))
            .get();
    std::fill_n(reinterpret_cast<float*>(shared.get()), parameters, 1.0f);
    bare_shared = bare_all_reduce(reinterpret_cast<float*>(shared.get()));
  }
  if (comm->rank() != 0) return 0;
  const braid::trace::Summary summary = braid::trace::summarize(*job);
  if (s.bench) {
    // Traced exposure per synchronised step (paired runs trace their no_sync() steps too,
    // which expose nothing).
    const int traced_steps = std::max(paired ? summarized_synced_steps : s.steps - 1, 1);
    const double traced_exposed_ms =
        static_cast<double>(summary.job.figures.exposed_ns) / 1e6 / comm->size() / traced_steps;
    const StepFigures& g = figures_of_steps;
    std::string line = fmt::format(
        "{{\"sync\":\"{}\",\"model\":\"{}\",\"parameters\":{},\"ranks\":{},"
        "\"step_ms\":{:.3f},\"cpu_ms\":{:.3f},\"progress_cpu_ms\":{:.3f},"
        "\"exposed_ms_per_step\":{:.3f},"
        "\"bare_all_reduce_ms\":{:.3f},\"bare_cpu_ms\":{:.3f},"
        "\"bare_shared_all_reduce_ms\":{:.3f},\"bare_shared_cpu_ms\":{:.3f},\"loss\":{:.6f}",
        s.sync, s.model, parameters, comm->size(), step_ms, g.cpu_ms, g.progress_cpu_ms,
        traced_exposed_ms, bare.ms, bare.cpu_ms, bare_shared.ms, bare_shared.cpu_ms, last_loss);
    if (paired) {
      line += fmt::format(
          ",\"pairs\":{},\"none_step_ms\":{:.3f},\"none_cpu_ms\":{:.3f},"
          "\"none_progress_cpu_ms\":{:.3f},\"exposed_ms\":{:.3f},\"exposed_ci_ms\":{:.3f},"
          "\"exposed_cpu_ms\":{:.3f},\"exposed_off_core_ms\":{:.3f}",
          g.pairs, g.none_step_ms, g.none_cpu_ms, g.none_progress_cpu_ms, g.exposed_ms,
          g.exposed_ci_ms, g.exposed_cpu_ms, g.exposed_off_core_ms);
    }
    std::cout << line << "}\n";
    return 0;
  }
  // Losses are means of 5 steps: steps 1-5 against the last 5.
  std::cout << fmt::format("\nloss {:.5f} -> {:.5f} ({}), {:.1f} ms/step\n", first_loss, last_loss,
                           last_loss < first_loss / 3 ? "converged" : "not converged", step_ms);
  std::cout << "\noverlap of gradient all-reduces with compute (forward, backward, optimizer):\n"
            << braid::trace::format_text(summary);
  if (auto file = braid::trace::output_file()) {
    std::cout << "trace: " << file->parent_path().string() << " (braid-trace summary / html)\n";
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Settings settings = parse(argc, argv);
    if (settings.help) {
      std::cout << kUsage;
      return 0;
    }
    torch::set_num_threads(settings.threads);
    braid::trace::set_enabled(true);  // for the closing summary; BRAID_TRACE also writes files
    braid::Runtime runtime;
    auto world = braid::transport::World::join(runtime);
    if (settings.model == "mlp")
      return train(*world, settings, Mlp(settings.hidden, settings.layers));
    return train(*world, settings, Transformer(settings.hidden, settings.layers));
  } catch (const std::invalid_argument& e) {
    std::cerr << "ddp_train: " << e.what() << "\nrun 'ddp_train --help' for usage\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "ddp_train: " << e.what() << "\n";
    return 1;
  }
}
