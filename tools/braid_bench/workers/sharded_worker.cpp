// braid-bench's sharded-data-parallel worker: the main job's model and loop
// (models/braid_models/sharded_training.hpp, as ddp_train --sharding trains it) under one strategy,
// timed for `braid-bench sharded`. Timed steps start together (a barrier left out of the
// trace) and a step's time is its slowest rank's; every collective is traced (no sampling)
// and the exposed communication is braid-trace's (communication no compute span covers),
// from the ranks' timelines gathered in-process. Rank 0 prints one JSON line: step time,
// exposed and traced communication, the model state per rank the ZeRO formulas estimate
// and what the ranks held (the most of any rank), and the peak resident size (VmHWM).
//
//   braid-run -n 2 build/tools/braid-bench-sharded-worker --sharding full --steps 20
#include <algorithm>
#include <iostream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <torch/torch.h>

#include <braid/braid.hpp>

#include "braid_models/sharded_training.hpp"
#include "timed_steps.hpp"
#include "worker_main.hpp"

namespace {

constexpr const char* kUsage = R"(usage: braid-run -n N braid-bench-sharded-worker [options]

options: --sharding none|optimizer|grad|full|no_shard  --model mlp|transformer  --hidden N
         --layers N  --batch N  --seed N  --steps N (>= 4)  --optimizer adam|sgd
)";

struct Settings {
  example_models::ModelChoice model;
  example_models::TrainingChoice training;
  example_models::Sharding sharding = example_models::Sharding::none;
  int steps = 20;
};

Settings parse(int argc, char** argv) {
  Settings s;
  s.model.seed = 1;  // every strategy from the same start
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw std::invalid_argument(arg + " needs a value\n" + kUsage);
      return argv[++i];
    };
    if (s.model.parse(arg, value) || s.training.parse(arg, value)) continue;
    if (arg == "--sharding")
      s.sharding = example_models::sharding_named(value());
    else if (arg == "--steps")
      s.steps = example_models::whole_number(arg, value(), 4);
    else
      throw std::invalid_argument("unknown option " + arg + "\n" + kUsage);
  }
  s.model.finish();
  return s;
}

template <class Model>
int train(braid::transport::World& world, const Settings& s, Model model) {
  auto comm = braid::collectives::Communicator::world(world);
  const example_models::Task task(s.model.hidden, s.model.transformer());
  example_models::ShardedTraining<Model> training(model, comm, s.sharding, true, s.training, 1e-3);
  double loss_value = 0;
  const auto timed =
      braid::bench::time_steps(world, *comm, s.steps, std::min(3, s.steps / 4), [&](int step) {
        auto [x, y] = task.batch(comm->rank(), step, s.model.batch);
        training.zero_grad();
        torch::Tensor loss = torch::mse_loss(training.forward(x), y);
        loss.backward();
        training.step();
        loss_value = loss.item<double>();
      });
  const example_models::HeldBytes held = training.held();
  std::vector<std::int64_t> memory{held.parameters, held.gradients, held.optimizer_state,
                                   held.total(), example_models::peak_resident_bytes()};
  comm->launch(comm->all_reduce(braid::Buffer(memory), braid::ReduceOp::max)).get();
  if (comm->rank() != 0) return 0;
  const braid::trace::Summary summary = braid::trace::summarize(*timed.timeline);
  const auto per_step_ms = [&](std::int64_t ns) {
    return timed.per_rank_step_ms(ns, comm->size());
  };
  const braid::dp::ModelStateMemory estimate = training.estimate(s.training.optimizer);
  std::cout << fmt::format(
      "{{\"sharded_step\":1,\"ranks\":{},\"parameters\":{},\"step_ms\":{:.3f},"
      "\"exposed_ms\":{:.3f},\"communication_ms\":{:.3f},\"estimate_bytes\":{},"
      "\"estimate_transient_bytes\":{},\"held_parameter_bytes\":{},\"held_gradient_bytes\":{},"
      "\"held_optimizer_bytes\":{},\"held_bytes\":{},\"peak_rss_bytes\":{},\"loss\":{:.6f}}}\n",
      comm->size(), training.parameter_count(), timed.median_ms(),
      per_step_ms(summary.job.figures.exposed_ns),
      per_step_ms(summary.job.figures.communication_ns), estimate.total(), estimate.transient,
      memory[0], memory[1], memory[2], memory[3], memory[4], loss_value);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return braid::bench::worker_main("braid-bench-sharded-worker", [&] {
    const Settings settings = parse(argc, argv);
    return example_models::join_and_train(
        settings.model, settings.training.threads,
        [&](braid::transport::World& world, auto model) { return train(world, settings, model); });
  });
}
