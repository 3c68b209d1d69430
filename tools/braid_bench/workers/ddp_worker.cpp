// braid-bench's DDP worker: the main job's training loop (examples/ddp_train.cpp) timed
// for `braid-bench ddp`. Steps after a warm-up start together (a barrier left out of the
// trace) and are timed on their slowest rank; `--sync paired` alternates a synchronised step
// with a no_sync() step, so the exposed communication is a difference measured in pairs
// inside one process; `--straggle-ms X` makes the last rank compute X ms more before each
// backward. `--balance shares|cadence` times the balancers instead (the second half of the
// steps, after they have settled): the straggler's extra time grows with its batch, as a
// slower device's would. Rank 0 prints one JSON line (the fields tools/braid_bench/modes/ddp.cpp
// reads).
//
//   braid-run -n 2 build/tools/braid-bench-ddp-worker --sync paired --steps 30
#include <algorithm>
#include <chrono>
#include <cmath>
#include <ctime>
#include <deque>
#include <iostream>
#include <numeric>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/torch.h>

#include <braid/braid.hpp>
#include <braid/dp/batch_balancer.hpp>
#include <braid/dp/cadence_balancer.hpp>
#include <braid/torch/data_parallel/distributed_data_parallel.hpp>

#include "timed_steps.hpp"

namespace {

constexpr const char* kUsage = R"(usage: braid-run -n N braid-bench-ddp-worker [options]

options: --model mlp|transformer  --hidden N  --layers N  --batch N  --steps N (>= 8)
         --optimizer adam|sgd  --threads N  --bucket-cap-mib X  --copy-gradients
         --private-buckets  --sync ddp|none|paired  --straggle-ms X
         --balance equal|shares|cadence  --device cpu|cuda
)";

struct Settings {
  example_models::ModelChoice model;
  int steps = 30;
  example_models::TrainingChoice training{.optimizer = "sgd"};
  std::string sync = "ddp";
  double straggle_ms = 0;
  std::string balance;  // equal, shares or cadence: time balancing; empty: DDP's figures
};

Settings parse(int argc, char** argv) {
  Settings s;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw std::invalid_argument(arg + " needs a value");
      return argv[++i];
    };
    if (s.model.parse(arg, value) || s.training.parse(arg, value)) continue;
    if (arg == "--steps")
      s.steps = example_models::whole_number(arg, value(), 8);
    else if (arg == "--sync")
      s.sync = value();
    else if (arg == "--straggle-ms")
      s.straggle_ms = std::stod(value());
    else if (arg == "--balance")
      s.balance = value();
    else
      throw std::invalid_argument("unknown option " + arg + "\n" + kUsage);
  }
  s.model.finish();
  if (s.sync != "ddp" && s.sync != "none" && s.sync != "paired")
    throw std::invalid_argument("--sync ddp|none|paired");
  if (!s.balance.empty() && s.balance != "equal" && s.balance != "shares" && s.balance != "cadence")
    throw std::invalid_argument("--balance equal|shares|cadence");
  if (!s.balance.empty() && s.sync != "ddp")
    throw std::invalid_argument("--balance needs --sync ddp");
  if (!(s.straggle_ms >= 0 && s.straggle_ms <= 10000))
    throw std::invalid_argument("--straggle-ms X in [0, 10000]");
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
  // The mean of `values` over the synchronised steps (every step unpaired), or the others.
  auto mean_of = [&](const std::vector<double>& values, bool synchronised) {
    double sum = 0;
    int steps = 0;
    for (std::size_t i = 0; i < values.size(); ++i) {
      if ((synced[i] || !paired) != synchronised) continue;
      sum += values[i];
      ++steps;
    }
    return steps > 0 ? sum / steps : 0.0;
  };
  f.step_ms = mean_of(ms, true);
  f.cpu_ms = mean_of(cpu_ms, true);
  f.progress_cpu_ms = mean_of(progress_cpu_ms, true);
  f.none_step_ms = mean_of(ms, false);
  f.none_cpu_ms = mean_of(cpu_ms, false);
  f.none_progress_cpu_ms = mean_of(progress_cpu_ms, false);
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

// --balance: equal shares, BatchBalancer's or CadenceBalancer's, timed over the second half
// of the steps. Prints the mean step time on the slowest rank, the samples every rank
// computed per step, and each rank's throughput (its samples per second of its own compute:
// the training thread's CPU time in forward and backward) over the timed steps, from which
// the ideal step (the global batch over the sum of throughputs) follows.
template <class Model>
int train_balanced(braid::transport::World& world, const Settings& s, Model model) {
  auto comm = braid::collectives::Communicator::world(world);
  const example_models::Task task(s.model.hidden, s.model.transformer());
  braid::torch::DistributedDataParallel<Model> ddp(model, comm, s.training.ddp);
  auto optimizer = example_models::make_optimizer(s.training.optimizer, model->parameters(), 1e-3);
  const torch::Device device = example_models::device_of(model);
  const std::int64_t global_batch = std::int64_t{s.model.batch} * comm->size();
  std::optional<braid::dp::BatchBalancer> shares;
  if (s.balance == "shares") {
    shares.emplace(comm, global_batch, braid::dp::BatchBalancerOptions::from_environment());
  }
  std::optional<braid::dp::CadenceBalancer> cadence;
  if (s.balance == "cadence") {
    cadence.emplace(comm, s.model.batch, braid::dp::CadenceOptions::from_environment());
  }
  const bool straggler = s.straggle_ms > 0 && comm->rank() == comm->size() - 1;
  const int timed_from = s.steps / 2;
  double timed_ms = 0;
  double timed_samples = 0;  // every rank's
  double my_samples = 0;     // this rank's
  double my_compute_seconds = 0;
  for (int step = 0; step < s.steps; ++step) {
    if (step >= timed_from) comm->launch(comm->barrier()).get();
    const auto started = std::chrono::steady_clock::now();
    const int batch = shares ? static_cast<int>(shares->batch_size()) : s.model.batch;
    const int micro_batches = cadence ? cadence->micro_batches() : 1;
    if (shares) ddp.reducer().set_batch_share(shares->share());
    if (cadence) ddp.reducer().set_batch_share(cadence->share());
    const double step_samples =
        static_cast<double>(cadence ? cadence->window_samples() : global_batch);
    const double cpu_started = thread_cpu_ms();
    optimizer->zero_grad(/*set_to_none=*/false);  // in place, as PyTorch's peer zeroes
    auto micro_step = [&](int i) {
      auto [x, y] = task.batch(comm->rank(), step * micro_batches + i, batch);
      torch::Tensor loss = torch::mse_loss(ddp.forward(x.to(device)), y.to(device)) / micro_batches;
      if (straggler) example_models::compute_for(s.straggle_ms * batch / s.model.batch);
      loss.backward();
    };
    example_models::run_window(&ddp, micro_batches, micro_step);
    const double compute_seconds = (thread_cpu_ms() - cpu_started) / 1e3;
    const double window_seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    optimizer->step();
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - started)
            .count();
    if (step >= timed_from) {
      timed_ms += ms;
      timed_samples += step_samples;
      my_samples += batch * micro_batches;
      my_compute_seconds += compute_seconds;
    }
    if (shares) shares->record_step(compute_seconds);
    if (cadence) cadence->record_window(compute_seconds, window_seconds);
  }
  // The slowest rank's time and compute; every rank's throughput.
  const int timed = s.steps - timed_from;
  std::vector<double> slowest{timed_ms / timed, my_compute_seconds * 1e3 / timed};
  comm->launch(comm->all_reduce(braid::Buffer(slowest), braid::ReduceOp::max)).get();
  std::vector<double> throughput(static_cast<std::size_t>(comm->size()), 0.0);
  throughput[static_cast<std::size_t>(comm->rank())] = my_samples / my_compute_seconds;
  comm->launch(comm->all_reduce(braid::Buffer(throughput), braid::ReduceOp::sum)).get();
  if (!example_models::ranks_hold_the_same_weights(*comm, model->parameters())) {
    std::cerr << "braid-bench-ddp-worker: the ranks disagree on the weights\n";
    return 1;
  }
  if (comm->rank() != 0) return 0;
  const auto [least, most] = std::minmax_element(throughput.begin(), throughput.end());
  const double total = std::accumulate(throughput.begin(), throughput.end(), 0.0);
  std::string counts;
  if (shares) counts = fmt::format("{}", fmt::join(shares->batch_sizes(), " "));
  if (cadence) counts = fmt::format("{}", fmt::join(cadence->counts(), " "));
  std::cout << fmt::format(
      "{{\"sync\":\"balance\",\"balance\":\"{}\",\"step_ms\":{:.3f},"
      "\"slowest_compute_ms\":{:.3f},\"samples_per_step\":{:.1f},\"global_batch\":{},"
      "\"ideal_ms\":{:.3f},\"speed_ratio\":{:.3f},\"throughputs\":\"{:.0f}\","
      "\"counts\":\"{}\"}}\n",
      s.balance, slowest[0], slowest[1], timed_samples / timed, global_batch,
      1e3 * static_cast<double>(global_batch) / total, *most / *least, fmt::join(throughput, " "),
      counts);
  return 0;
}

template <class Model>
int train(braid::transport::World& world, const Settings& s, Model model) {
  if (!s.balance.empty()) return train_balanced(world, s, model);
  auto comm = braid::collectives::Communicator::world(world);
  const example_models::Task task(s.model.hidden, s.model.transformer());
  std::int64_t parameters = 0;
  for (const auto& p : model->parameters()) parameters += p.numel();
  const bool paired = s.sync == "paired";
  const bool sync = s.sync != "none";
  // On CUDA, loss.item() below waits for the step's kernels, the optimizer's included, so
  // the step times are the GPU's as well.
  const torch::Device device = example_models::device_of(model);
  std::optional<braid::torch::DistributedDataParallel<Model>> ddp;
  if (sync) ddp.emplace(model, comm, s.training.ddp);
  auto optimizer = example_models::make_optimizer(s.training.optimizer, model->parameters(), 1e-3);
  // Paired steps come in pairs (2k, 2k + 1); the warm-up ends on a pair boundary.
  const int warmup = std::min(5, s.steps / 4) & (paired ? ~1 : ~0);
  double last_loss = 0;
  std::deque<double> recent;  // the last 5 losses: one batch's loss is noisy
  // Each timed step's process CPU time (every thread: training and braid's runtime thread),
  // and whether it synchronised gradients.
  std::vector<double> timed_cpu_ms;
  std::vector<double> timed_progress_cpu_ms;  // braid's runtime thread alone
  std::vector<double> timed_thread_cpu_ms;    // the training thread alone
  std::vector<bool> timed_synced;
  // The summary covers the training steps from the second on (the first builds buckets).
  int summarized_synced_steps = 0;
  // --straggle-ms: the last rank is the slower one; it busies its core, as a slower
  // device or a heavier share of the batch would, rather than sleeping.
  const bool straggler = s.straggle_ms > 0 && comm->rank() == comm->size() - 1;
  auto train_one = [&](int step) {
    // Paired: pair k syncs first when k is even, second when odd, so neither kind of step
    // always follows the other.
    const bool synced = sync && (!paired || step % 2 == (step / 2) % 2);
    if (step >= 1 && synced) ++summarized_synced_steps;
    const double cpu_started = process_cpu_ms();
    const double thread_cpu_started = thread_cpu_ms();
    const auto progress_cpu_started = comm->runtime().progress_cpu_time();
    auto [x, y] = task.batch(comm->rank(), step, s.model.batch);
    x = x.to(device);
    y = y.to(device);
    torch::Tensor loss;
    auto train_step = [&] {
      optimizer->zero_grad(/*set_to_none=*/false);
      torch::Tensor prediction = sync ? ddp->forward(x) : model->forward(x);
      loss = torch::mse_loss(prediction, y);
      if (straggler) example_models::compute_for(s.straggle_ms);
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
    last_loss =
        std::accumulate(recent.begin(), recent.end(), 0.0) / static_cast<double>(recent.size());
    if (step >= warmup) {
      timed_cpu_ms.push_back(process_cpu_ms() - cpu_started);
      timed_progress_cpu_ms.push_back(
          std::chrono::duration<double, std::milli>(comm->runtime().progress_cpu_time() -
                                                    progress_cpu_started)
              .count());
      timed_thread_cpu_ms.push_back(thread_cpu_ms() - thread_cpu_started);
      timed_synced.push_back(synced);
    }
  };
  const auto timed = braid::bench::time_steps(world, *comm, s.steps, warmup, train_one, 1);
  // The training thread's time off its core: its step's wall time less its CPU time.
  std::vector<double> timed_off_core_ms;
  for (std::size_t i = 0; i < timed_thread_cpu_ms.size(); ++i) {
    timed_off_core_ms.push_back(timed.own_ms[i] - timed_thread_cpu_ms[i]);
  }
  // Each timed step's time is its slowest rank's (timed.ms); CPU times the mean over ranks.
  comm->launch(comm->all_reduce(braid::Buffer(timed_cpu_ms), braid::ReduceOp::avg)).get();
  comm->launch(comm->all_reduce(braid::Buffer(timed_progress_cpu_ms), braid::ReduceOp::avg)).get();
  comm->launch(comm->all_reduce(braid::Buffer(timed_off_core_ms), braid::ReduceOp::avg)).get();
  const StepFigures figures_of_steps = step_figures(timed.ms, timed_cpu_ms, timed_progress_cpu_ms,
                                                    timed_off_core_ms, timed_synced, paired);
  const double step_ms = figures_of_steps.step_ms;
  // Every rank holds the same weights after DDP (paired runs skip synchronisation on
  // purpose).
  const bool same_weights = example_models::ranks_hold_the_same_weights(*comm, model->parameters());
  if (sync && !paired && !same_weights) {
    std::cerr << "braid-bench-ddp-worker: the ranks disagree on the weights\n";
    return 1;
  }

  // The bare all-reduce of every gradient at once, for comparison with what DDP exposed.
  // Its CPU time too (the mean over ranks): on a node whose cores the training threads
  // already fill, that CPU time is what overlapping can at best hide nothing of.
  // Measured twice: on a plain buffer, as a user's own all-reduce of its gradients would
  // run, and on memory the ranks share (Communicator::allocate_shared), as DDP's buckets are.
  struct Bare {
    double ms = 0;
    double cpu_ms = 0;  // mean over ranks
  };
  auto bare_all_reduce = [&](float* data, int cuda_device) {
    const braid::Buffer gradients(
        data, static_cast<std::size_t>(parameters), braid::DType::f32,
        cuda_device >= 0 ? braid::MemoryKind::cuda : braid::MemoryKind::host, cuda_device);
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
  if (device.is_cuda()) {
    // On the device, as DDP's buckets are there; nothing is shared between processes.
    torch::Tensor gradients = torch::ones({parameters}, torch::TensorOptions().device(device));
    bare = bare_all_reduce(gradients.data_ptr<float>(), device.index());
    bare_shared = bare;
  } else {
    std::vector<float> gradients(static_cast<std::size_t>(parameters), 1.0f);
    bare = bare_all_reduce(gradients.data(), -1);
    std::shared_ptr<std::byte[]> shared =
        comm->launch(comm->allocate_shared(static_cast<std::size_t>(parameters) * sizeof(float)))
            .get();
    std::fill_n(reinterpret_cast<float*>(shared.get()), parameters, 1.0f);
    bare_shared = bare_all_reduce(reinterpret_cast<float*>(shared.get()), -1);
  }
  if (comm->rank() != 0) return 0;
  const braid::trace::Summary summary = braid::trace::summarize(*timed.timeline);
  {
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
        s.sync, s.model.name, parameters, comm->size(), step_ms, g.cpu_ms, g.progress_cpu_ms,
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
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Settings settings = parse(argc, argv);
    return example_models::join_and_train(
        settings.model, settings.training.threads,
        [&](braid::transport::World& world, auto model) { return train(world, settings, model); },
        settings.training.device);
  } catch (const std::invalid_argument& e) {
    std::cerr << "braid-bench-ddp-worker: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "braid-bench-ddp-worker: " << e.what() << "\n";
    return 1;
  }
}
