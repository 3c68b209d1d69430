// Data-parallel training with braid: a libtorch model wrapped in
// braid::torch::DistributedDataParallel, trained on a synthetic task (a student network
// learning a fixed random teacher), each rank on its own shard of the data. Gradients are
// all-reduced in buckets while backward is still running; the run ends with the overlap
// summary (how much of that communication backward hid, and how much of the rest was
// waiting for a later rank).
//
//   braid-run -n 2 build/examples/ddp_train                     # MLP 512x5, 100 steps
//   braid-run -n 2 build/examples/ddp_train --model transformer
//   BRAID_TRACE=traces braid-run -n 2 build/examples/ddp_train  # plus a trace per rank
//   braid-run -n 2 build/examples/ddp_train --sharding full     # FSDP FULL_SHARD (ZeRO-3)
//
// The benchmark modes (paired synchronised and no_sync() steps, a slower rank, timings as
// JSON) are braid-bench's: tools/braid_bench/workers/ddp_worker.cpp.
#include <deque>
#include <iostream>
#include <numeric>
#include <optional>
#include <string>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/torch.h>

#include <braid/braid.hpp>
#include <braid/dp/batch_balancer.hpp>
#include <braid/dp/cadence_balancer.hpp>
#include <braid/torch/data_parallel/distributed_data_parallel.hpp>

#include "braid_models/models.hpp"
#include "braid_models/restartable.hpp"
#include "braid_models/sharded_training.hpp"
#include "braid_models/training_checks.hpp"

namespace {

constexpr const char* kUsage = R"(usage: braid-run -n N ddp_train [options]

Trains a model with braid's DistributedDataParallel on synthetic data, one rank per
process, printing the loss per step, and ends with the overlap summary (BRAID_TRACE=dir
also writes the trace for braid-trace).

options:
  --model mlp|transformer  the model (default mlp)
  --hidden N               width (default 512 for the MLP, 256 for the transformer)
  --layers N               hidden layers or blocks (default 5 MLP, 4 transformer)
  --batch N                samples per rank per step (default 32)
  --seed N                 the initial weights' seed (default: a new one each run)
  --steps N                training steps (default 100 MLP, 60 transformer)
  --lr X                   learning rate (default 0.001)
  --optimizer adam|sgd     (default adam)
  --threads N              libtorch's intra-op threads per rank (default 1)
  --bucket-cap-mib X       gradient bucket cap (default 25)
  --copy-gradients         copy gradients into the buckets and back (PyTorch's default)
                           instead of keeping them in the buckets (braid's default)
  --private-buckets        buckets in private memory instead of memory the ranks share
  --device cpu|cuda        where each rank trains (default cpu); cuda: device LOCAL_RANK,
                           needing braid built against a libtorch with CUDA
  --sync ddp|none          ddp (default); none: no gradient sync, for comparison
  --sharding S             none (default): DDP; optimizer: DDP with ZeroRedundancyOptimizer
                           (ZeRO-1); grad: FSDP SHARD_GRAD_OP (ZeRO-2); full: FSDP
                           FULL_SHARD (ZeRO-3); no_shard: FSDP NO_SHARD. Each hidden layer
                           or block is a unit. Named, it also prints the model state per
                           rank, the ZeRO formulas' estimate first and what was held last
  --straggle-ms X           the last rank computes X ms more per step (at --batch samples,
                           in proportion to its batch)
  --balance                batch shares follow each rank's measured speed (the global
                           batch stays --batch x ranks; dp::BatchBalancer)
  --cadence                each step is a window of micro-batches of --batch samples: the
                           slowest rank computes an anchor of them, faster ranks more in
                           proportion, synchronising once per window (dp::CadenceBalancer)
  --uneven K               rank r stops K x r steps early (uneven inputs): the ranks
                           that run out join() and shadow the others' steps, and every
                           rank ends with the same weights
)";

struct Settings {
  example_models::ModelChoice model;
  int steps = 0;  // 0: the model's default
  double lr = 1e-3;
  example_models::TrainingChoice training;
  bool sync = true;
  example_models::Sharding sharding = example_models::Sharding::none;
  bool report_memory = false;  // --sharding named
  int uneven = 0;
  double straggle_ms = 0;  // the last rank computes this much more per step (at --batch)
  bool balance = false;    // batch shares that follow each rank's measured speed
  bool cadence = false;    // micro-batches per window that follow each rank's speed
  example_models::RestartChoice restart;  // --checkpoint-dir, --memory-every, --step-log
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
    if (s.model.parse(arg, value) || s.training.parse(arg, value) || s.restart.parse(arg, value))
      continue;
    if (arg == "--steps")
      s.steps = example_models::whole_number(arg, value(), 2);
    else if (arg == "--lr")
      s.lr = example_models::decimal_number(arg, value());
    else if (arg == "--sync") {
      const std::string sync = value();
      if (sync != "ddp" && sync != "none") throw std::invalid_argument("--sync ddp|none");
      s.sync = sync == "ddp";
    } else if (arg == "--sharding") {
      s.sharding = example_models::sharding_named(value());
      s.report_memory = true;
    } else if (arg == "--uneven")
      s.uneven = example_models::whole_number(arg, value(), 0);
    else if (arg == "--straggle-ms")
      s.straggle_ms = example_models::decimal_number(arg, value());
    else if (arg == "--balance")
      s.balance = true;
    else if (arg == "--cadence")
      s.cadence = true;
    else
      throw std::invalid_argument("unknown option " + arg);
  }
  s.model.finish();
  if (s.steps == 0) s.steps = s.model.transformer() ? 60 : 100;
  if (s.training.optimizer != "adam" && s.training.optimizer != "sgd")
    throw std::invalid_argument("--optimizer adam|sgd");
  if (s.uneven != 0 && !s.sync) throw std::invalid_argument("--uneven needs --sync ddp");
  const bool balancing = s.balance || s.cadence;
  if (s.sharding != example_models::Sharding::none && (s.uneven != 0 || !s.sync || balancing))
    throw std::invalid_argument(
        "--uneven, --sync none, --balance and --cadence need --sharding none");
  if (balancing && (s.uneven != 0 || !s.sync))
    throw std::invalid_argument("--balance and --cadence need --sync ddp and no --uneven");
  if (s.balance && s.cadence) throw std::invalid_argument("--balance or --cadence, not both");
  // Their own state (balancer shares, a rank's early stop) is not in a checkpoint.
  if (s.restart.restartable() && (s.uneven != 0 || balancing))
    throw std::invalid_argument(
        "--checkpoint-dir and --memory-every need no --uneven, --balance or --cadence");
  return s;
}

// The flags every rank must be given alike (--device and --threads may differ per rank; the
// seed, since rank 0's weights are broadcast).
std::vector<braid::collectives::AgreedValue> agreed_settings(const Settings& s) {
  std::vector<braid::collectives::AgreedValue> agreed{
      {"--model", s.model.name},
      {"--hidden", std::to_string(s.model.hidden)},
      {"--layers", std::to_string(s.model.layers)},
      {"--batch", std::to_string(s.model.batch)},
      {"--steps", std::to_string(s.steps)},
      {"--lr", fmt::format("{}", s.lr)},
      {"--optimizer", s.training.optimizer},
      {"--bucket-cap-mib", std::to_string(s.training.ddp.limits.bucket_cap_bytes)},
      {"--sync", s.sync ? "ddp" : "none"},
      {"--sharding", std::to_string(static_cast<int>(s.sharding))},
      {"--uneven", std::to_string(s.uneven)},
      {"--straggle-ms", fmt::format("{}", s.straggle_ms)},
      {"--balance", s.balance ? "on" : "off"},
      {"--cadence", s.cadence ? "on" : "off"}};
  for (auto& value : s.restart.agreed()) agreed.push_back(std::move(value));
  return agreed;
}

template <class Model>
int train(braid::transport::World& world, const Settings& s, Model model) {
  auto comm = braid::collectives::Communicator::world(world);
  // A rank started with other flags is named here, before the first step, rather than
  // deadlocking or training another model to the end.
  comm->launch(braid::collectives::expect_agreement(*comm, agreed_settings(s))).get();
  const example_models::Task task(s.model.hidden, s.model.transformer());
  const torch::Device device = example_models::device_of(model);
  // DDP, ZeRO-1 or FSDP: checks the ranks agree, broadcasts rank 0's weights.
  example_models::ShardedTraining<Model> training(model, comm, s.sharding, s.sync, s.training,
                                                  s.lr);
  const std::int64_t parameters = training.parameter_count();
  // --checkpoint-dir, --memory-every: where a restarted job picks up (a collective: every
  // rank takes the newest step all of them hold whole, in memory or on disk).
  example_models::Restartable restart(s.restart, comm, "ddp_train");
  // A step's data is split over the ranks the job first started with (its checkpoints say
  // how many). On fewer (braid-run --nnodes MIN:MAX lost a node), each rank takes several of
  // those parts in turn and accumulates their gradients, so the global batch -- and the
  // training -- stay what they were.
  int data_ranks = comm->size();
  const int first_step = restart.resume([&](const braid::torch::TrainingState& state) {
    training.restore(state);
    if (const auto found = state.blobs.find("data_ranks"); found != state.blobs.end()) {
      data_ranks = std::stoi(found->second);
    }
  });
  if (data_ranks % comm->size() != 0) {
    throw std::invalid_argument(fmt::format(
        "the job's data is split over the {} ranks of its first start, which {} rank(s) cannot "
        "share evenly: run it on a number of ranks that divides {}",
        data_ranks, comm->size(), data_ranks));
  }
  const int parts = data_ranks / comm->size();
  if (parts > 1 && (s.balance || s.cadence || s.uneven > 0)) {
    throw std::invalid_argument(
        "--balance, --cadence and --uneven set each rank's share themselves: they cannot take "
        "up a job that started on more ranks");
  }
  if (parts > 1 && comm->rank() == 0) {
    std::cout << fmt::format(
        "ddp_train: {} rank(s) take the data of the job's first {} ({} parts each, their "
        "gradients accumulated)\n",
        comm->size(), data_ranks, parts);
  }
  if (comm->rank() == 0) {
    std::cout << fmt::format(
        "ddp_train: {} with {:.2f}M parameters on {} rank(s), batch {} per rank, {} steps, "
        "gradient sync: {}\n",
        s.model.name, static_cast<double>(parameters) / 1e6, comm->size(), s.model.batch, s.steps,
        s.sync ? example_models::describe(s.sharding, s.training) : "none");
    if (s.report_memory) {
      const braid::dp::ModelStateMemory m = training.estimate(s.training.optimizer);
      std::cout << fmt::format(
          "model state per rank, estimated (ZeRO formulas, f32, {} bytes of optimizer state "
          "per parameter): parameters {}, gradients {}, optimizer state {}, total {}",
          example_models::optimizer_state_bytes_per_parameter(s.training.optimizer),
          example_models::mib(m.parameters), example_models::mib(m.gradients),
          example_models::mib(m.optimizer_state), example_models::mib(m.total()));
      if (m.transient > 0)
        std::cout << fmt::format(", and {} transient (the largest unit)",
                                 example_models::mib(m.transient));
      std::cout << "\n";
    }
  }
  // --uneven: this rank's share of the steps; the ranks that stop early join().
  const int my_steps = s.steps - s.uneven * comm->rank();
  if (const int fewest = s.steps - s.uneven * (comm->size() - 1); fewest < 2) {
    // Every rank works this out alike, so every rank stops here.
    throw std::invalid_argument(fmt::format("--uneven {} leaves rank {} {} of {} steps (>= 2)",
                                            s.uneven, comm->size() - 1, fewest, s.steps));
  }
  if (s.uneven > 0) training.ddp()->allow_uneven_inputs();
  // --balance: each rank's batch follows its measured speed; the global batch stays
  // --batch x ranks, and DDP weights each rank's gradient by its share.
  std::optional<braid::dp::BatchBalancer> balancer;
  if (s.balance) {
    balancer.emplace(comm, std::int64_t{s.model.batch} * comm->size(),
                     braid::dp::BatchBalancerOptions::from_environment());
  }
  // --cadence: each step is a window; this rank computes cadence->micro_batches() of
  // --batch samples in it, synchronising at the last.
  std::optional<braid::dp::CadenceBalancer> cadence;
  if (s.cadence) {
    cadence.emplace(comm, s.model.batch, braid::dp::CadenceOptions::from_environment());
  }
  const bool straggler = s.straggle_ms > 0 && comm->rank() == comm->size() - 1;
  std::int64_t samples = 0;  // every rank's, for the samples per second

  double first_loss = 0;
  std::deque<double> recent;  // the last 5 losses: one batch's loss is noisy
  auto mean_of_recent = [&] {
    return std::accumulate(recent.begin(), recent.end(), 0.0) / static_cast<double>(recent.size());
  };
  // The summary covers the steps from the second on (the first builds the buckets).
  std::int64_t summary_from_ns = 0;
  const auto loop_started = std::chrono::steady_clock::now();
  for (int step = first_step; step < my_steps; ++step) {
    if (step == first_step + 1) summary_from_ns = braid::trace::now_ns();
    const auto started = std::chrono::steady_clock::now();
    const int batch = balancer ? static_cast<int>(balancer->batch_size()) : s.model.batch;
    if (balancer) training.ddp()->reducer().set_batch_share(balancer->share());
    if (cadence) training.ddp()->reducer().set_batch_share(cadence->share());
    const int micro_batches = cadence ? cadence->micro_batches() : parts;
    // Every rank's samples this step (with --uneven, the ranks still training).
    samples += cadence    ? cadence->window_samples()
               : balancer ? balancer->global_batch()
                          : std::int64_t{s.model.batch} * parts *
                                std::min(comm->size(),
                                         s.uneven > 0 ? (s.steps - step + s.uneven - 1) / s.uneven
                                                      : comm->size());
    const double cpu_started = example_models::thread_cpu_seconds();
    training.zero_grad();
    torch::Tensor loss;
    auto micro_step = [&](int i) {
      // A window's micro-batches are the next steps' data (--cadence), or this step's parts.
      auto [x, y] = cadence ? task.batch(comm->rank(), step * micro_batches + i, batch)
                            : task.batch(comm->rank() * parts + i, step, batch);
      x = x.to(device);
      y = y.to(device);
      // Under --cadence each micro-batch's loss counts 1 / micro_batches, so the window's
      // gradient is the mean over its samples.
      loss = torch::mse_loss(training.forward(x), y);
      // The slower rank: --straggle-ms more per --batch samples, in proportion to its batch.
      if (straggler) example_models::compute_for(s.straggle_ms * batch / s.model.batch);
      restart.before_exchange();  // the last step's in-memory copy whole before its gradients
      // DDP's buckets all-reduce (FSDP's units reduce-scatter) while backward runs.
      (micro_batches > 1 ? loss / micro_batches : loss).backward();
    };
    example_models::run_window(training.ddp(), micro_batches, micro_step);
    // The balancers' measure: this thread's CPU time in forward and backward, not the wall
    // time, which on a faster rank includes waiting for the slower one's gradients.
    const double compute_seconds = example_models::thread_cpu_seconds() - cpu_started;
    const double window_seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    training.step();
    restart.after_step(step + 1, [&] {
      braid::torch::TrainingState state = training.state(step + 1);
      state.blobs["data_ranks"] = std::to_string(data_ranks);
      return state;
    });
    if (balancer && balancer->record_step(compute_seconds) && comm->rank() == 0) {
      std::cout << fmt::format("balance: batch sizes now [{}]\n",
                               fmt::join(balancer->batch_sizes(), ", "));
    }
    if (cadence && cadence->record_window(compute_seconds, window_seconds) && comm->rank() == 0) {
      std::cout << fmt::format(
          "cadence: micro-batches per window now [{}] (synchronisation {:.0f}% of a window)\n",
          fmt::join(cadence->counts(), ", "), 100 * cadence->overhead());
    }
    recent.push_back(loss.item<double>());
    if (recent.size() > 5) recent.pop_front();
    if (step == first_step + 4) first_loss = mean_of_recent();
    if (comm->rank() == 0 && (step % 5 == 0 || step == s.steps - 1)) {
      const double ms =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - started)
              .count();
      const int done = (step + 1) * 30 / s.steps;
      std::cout << fmt::format("step {:>4}/{} [{:<30}] loss {:.5f}  {:.1f} ms/step\n", step + 1,
                               s.steps, std::string(static_cast<std::size_t>(done), '#'),
                               recent.back(), ms)
                << std::flush;
    }
  }
  if (s.uneven > 0) {
    const auto joined = training.ddp()->join();
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
  restart.finish();  // the last save on disk before the job ends
  const std::int64_t summary_to_ns = braid::trace::now_ns();
  const int trained_steps = std::max(1, my_steps - first_step);
  const double step_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - loop_started)
          .count() /
      trained_steps;
  const double last_loss = recent.empty() ? first_loss : mean_of_recent();

  // Every rank holds the same weights after DDP (of the sharded choices, NO_SHARD's shards).
  const bool same_weights =
      example_models::ranks_hold_the_same_weights(*comm, training.replicated_parameters());
  if (s.sync && !same_weights) {
    std::cerr << "ddp_train: the ranks disagree on the weights\n";
    return 1;
  }
  // One number for the whole model's weights, the same however the job was laid out or
  // restarted: the sum of their squares (FSDP's shards summed over the ranks).
  std::vector<double> squares{0.0};
  for (const auto& p : training.held_parameters()) {
    squares[0] += p.detach().to(torch::kDouble).pow(2).sum().template item<double>();
  }
  if (example_models::is_fsdp(s.sharding) && s.sharding != example_models::Sharding::no_shard) {
    comm->launch(comm->all_reduce(braid::Buffer(squares), braid::ReduceOp::sum)).get();
  }
  // What the ranks held, the largest of each figure over the ranks.
  const example_models::HeldBytes held = training.held();
  std::vector<std::int64_t> memory{held.parameters, held.gradients, held.optimizer_state,
                                   held.total(), example_models::peak_resident_bytes()};
  if (s.report_memory)
    comm->launch(comm->all_reduce(braid::Buffer(memory), braid::ReduceOp::max)).get();
  const auto job =
      example_models::gather_steps_timeline(world, *comm, summary_from_ns, summary_to_ns);
  if (!job) return 0;  // rank 0 prints it
  // Losses are means of 5 steps: steps 1-5 against the last 5.
  std::cout << fmt::format("\nloss {:.5f} -> {:.5f} ({}), {:.1f} ms/step, {:.0f} samples/s\n",
                           first_loss, last_loss,
                           last_loss < first_loss / 3 ? "converged" : "not converged", step_ms,
                           static_cast<double>(samples) / (step_ms * trained_steps / 1e3));
  std::cout << fmt::format("parameters: sum of squares {:.9f}\n", squares[0]);
  if (s.report_memory) {
    std::cout << fmt::format(
        "model state per rank, held (the most of any rank): parameters {}, gradients {}, "
        "optimizer state {}, total {}; peak resident size (VmHWM) {}\n",
        example_models::mib(memory[0]), example_models::mib(memory[1]),
        example_models::mib(memory[2]), example_models::mib(memory[3]),
        example_models::mib(memory[4]));
  }
  std::cout << (s.sharding == example_models::Sharding::none
                    ? "\noverlap of gradient all-reduces with compute (forward, backward, "
                      "optimizer):\n"
                    : "\noverlap of the gathers and gradient reductions with compute:\n")
            << braid::trace::format_text(braid::trace::summarize(*job));
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
      std::cout << kUsage << example_models::RestartChoice::usage()
                << "  -h, --help               print this help, and exit\n";
      return 0;
    }
    return example_models::join_and_train(
        settings.model, settings.training.threads,
        [&](braid::transport::World& world, auto model) { return train(world, settings, model); },
        settings.training.device);
  } catch (const std::invalid_argument& e) {
    std::cerr << "ddp_train: " << e.what() << " (ddp_train --help for usage)\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "ddp_train: " << e.what() << "\n";
    return 1;
  }
}
