// The compute-tax worker: times one training step (zero_grad, forward, loss, backward,
// optimizer step) of the main job's models, with no communication, and prints one JSON
// line. Built twice from this file (tools/meson.build):
//
//   braid-bench-compute-plain   a plain libtorch program: no braid linked at all
//   braid-bench-compute-braid   a braid process as the main job is one: a Runtime, a World
//                               (run under braid-run), DistributedDataParallel around the
//                               model, every step under no_sync()
//
// `braid-bench compute-tax` runs both beside the same step in Python PyTorch
// (peers/compute_torch.py), so what braid's process costs a step it does not synchronise
// (its threads, its allocator policy, its hooks) shows as a ratio. Each also reports the
// minor page faults a step takes: a step whose temporaries come back from the kernel every
// time pays for them there (braid/core/heap_policy.hpp).
#include <chrono>
#include <iostream>
#include <memory>
#include <stdexcept>
#include <string>
#include <sys/resource.h>
#include <vector>

#include <fmt/format.h>
#include <torch/torch.h>

#include "../harness/results.hpp"
#include "braid_models/models.hpp"

#if BRAID_COMPUTE_WITH_BRAID
#include <braid/braid.hpp>
#include <braid/torch/data_parallel/distributed_data_parallel.hpp>
#endif

namespace {

constexpr const char* kUsage =
    "usage: braid-bench-compute-{plain,braid} [--model mlp|transformer] [--optimizer adam|sgd]\n"
    "         [--hidden N] [--layers N] [--batch N] [--steps N] [--warmup N]\n";

struct Settings {
  example_models::ModelChoice model;
  std::string optimizer = "adam";
  int steps = 40;
  int warmup = 5;
};

Settings parse(int argc, char** argv) {
  Settings s;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw std::invalid_argument(arg + " needs a value (" + kUsage + ")");
      return argv[++i];
    };
    if (s.model.parse(arg, value)) continue;
    if (arg == "--optimizer")
      s.optimizer = value();
    else if (arg == "--steps")
      s.steps = example_models::whole_number(arg, value(), 1);
    else if (arg == "--warmup")
      s.warmup = example_models::whole_number(arg, value(), 1);
    else
      throw std::invalid_argument("unknown option " + arg);
  }
  s.model.finish();
  if (s.optimizer != "adam" && s.optimizer != "sgd")
    throw std::invalid_argument("--optimizer adam|sgd");
  return s;
}

long minor_faults() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_minflt;
}

double ms_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
      .count();
}

// Times s.steps steps after s.warmup untimed ones. `forward` runs the model (through the
// DDP wrapper in the braid process), `step_scope` wraps each whole step (no_sync() there).
template <class Forward, class StepScope>
std::string time_steps(const Settings& s, torch::nn::Module& model, Forward forward,
                       StepScope step_scope, const std::string& runner) {
  auto optimizer = example_models::make_optimizer(s.optimizer, model.parameters(), 1e-3);
  const example_models::Task task(s.model.hidden, s.model.transformer());
  const auto [x, y] = task.batch(0, 0, s.model.batch);
  std::vector<double> step_ms, forward_backward_ms, optimizer_ms;
  long faults_before = 0;
  for (int step = 0; step < s.warmup + s.steps; ++step) {
    if (step == s.warmup) faults_before = minor_faults();
    const auto started = std::chrono::steady_clock::now();
    double backward_done = 0;
    step_scope([&] {
      optimizer->zero_grad(/*set_to_none=*/false);  // as the main job zeroes
      torch::mse_loss(forward(x), y).backward();
      backward_done = ms_since(started);
      optimizer->step();
    });
    if (step < s.warmup) continue;
    const double total = ms_since(started);
    step_ms.push_back(total);
    forward_backward_ms.push_back(backward_done);
    optimizer_ms.push_back(total - backward_done);
  }
  std::int64_t parameters = 0;
  for (const auto& p : model.parameters()) parameters += p.numel();
  return fmt::format(
      "{{\"compute_step\":\"{}\",\"model\":\"{}\",\"optimizer\":\"{}\",\"parameters\":{},"
      "\"batch\":{},\"steps\":{},\"step_ms\":{:.3f},\"forward_backward_ms\":{:.3f},"
      "\"optimizer_ms\":{:.3f},\"faults_per_step\":{:.1f}}}",
      runner, s.model.name, s.optimizer, parameters, s.model.batch, s.steps,
      braid::bench::median(step_ms), braid::bench::median(forward_backward_ms),
      braid::bench::median(optimizer_ms),
      static_cast<double>(minor_faults() - faults_before) / s.steps);
}

template <class Model>
std::string run(const Settings& s, Model model) {
#if BRAID_COMPUTE_WITH_BRAID
  braid::Runtime runtime;
  auto world = braid::transport::World::join(runtime);
  auto comm = braid::collectives::Communicator::world(*world);
  braid::torch::DistributedDataParallel<Model> ddp(model, comm);
  return time_steps(
      s, *model, [&](const torch::Tensor& x) { return ddp.forward(x); },
      [&](auto&& step) {
        auto local_only = ddp.no_sync();
        step();
      },
      "braid");
#else
  return time_steps(
      s, *model, [&](const torch::Tensor& x) { return model->forward(x); },
      [](auto&& step) { step(); }, "plain");
#endif
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Settings s = parse(argc, argv);
    // One intra-op thread, as braid-run gives every rank of the main job.
    example_models::set_compute_threads(1);
    std::cout << (s.model.transformer() ? run(s, s.model.make_transformer())
                                        : run(s, s.model.make_mlp()))
              << std::endl;
    return 0;
  } catch (const std::invalid_argument& e) {
    std::cerr << "compute step: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "compute step: " << e.what() << "\n";
    return 1;
  }
}
