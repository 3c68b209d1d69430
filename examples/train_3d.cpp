// 3D-parallel training with braid: a small GPT-style language model (token embedding tied
// to the output head, transformer blocks) split over tensor-parallel (--tp), pipeline
// (--pp) and data-parallel (--dp) ranks, on a synthetic next-token task whose loss falls
// to near zero: each sequence follows a fixed random permutation of the vocabulary.
//
//   braid-run -n 4 build/examples/train_3d --tp 2 --pp 2
//   braid-run -n 8 build/examples/train_3d --tp 2 --pp 2 --dp 2 --schedule zb
//   braid-run -n 2 build/examples/train_3d --pp 2 --schedule interleaved --virtual-stages 2
//
// The invariant that shows it is right: with the same --seed and --global-batch, the loss
// printed at every step is the same (to float rounding) for every layout and schedule, and
// so is the final parameter checksum. Every layer draws its weights from its own seed
// (a TP rank keeps its slice), the data depends on the step alone, each microbatch's loss
// is its share of the global batch's mean, DP averages gradients over its ranks, and the
// tied embedding's two copies (first and last stage) add their gradients before each step.
#include <iostream>
#include <map>
#include <numeric>
#include <optional>
#include <string>

#include <fmt/format.h>
#include <torch/torch.h>

#include <braid/braid.hpp>
#include <braid/parallel/pipeline_schedule.hpp>
#include <braid/parallel/pipeline_simulator.hpp>
#include <braid/parallel/rank_grid.hpp>
#include <braid/torch/data_parallel/distributed_data_parallel.hpp>
#include <braid/torch/pipeline/pipeline_executor.hpp>
#include <braid/torch/tensor_parallel/parallel_transformer_block.hpp>
#include <braid/torch/tensor_parallel/tp_mappings.hpp>

#include "braid_models/gpt_stage.hpp"
#include "braid_models/models.hpp"
#include "braid_models/restartable.hpp"
#include "braid_models/training_checks.hpp"

namespace {

using ::torch::Tensor;

constexpr const char* kUsage = R"(usage: braid-run -n TPxPPxDP train_3d [options]

Trains a small GPT-style model with tensor, pipeline and data parallelism on a synthetic
next-token task, printing the loss per step, and ends with each rank's pipeline bubble and
communication overlap.

options:
  --tp N --pp N --dp N       the grid (defaults: BRAID_TP, BRAID_PP, BRAID_DP; dp the rest)
  --schedule NAME            gpipe, 1f1b (default), interleaved, zb
  --microbatches M           per step and data-parallel rank (default 4)
  --virtual-stages V         stages per pipeline rank (interleaved; default 1, 2 there)
  --stage-layers A,B,...     blocks per stage, stated (default: --layers split evenly)
  --layers N                 transformer blocks (default 4)
  --hidden N --heads N       (default 64, 4)
  --vocab N --seq N          (default 64, 16)
  --global-batch N           sequences per step over every data-parallel rank (default 8)
  --steps N                  (default 60)
  --optimizer adam|sgd       (default adam; lr 3e-3, or 0.1 for sgd)
  --lr X
  --seed N                   weights and data (default 1)
)";

// The model's shape, batch and seed (GptOptions), and how it is trained.
struct Settings : example_models::GptOptions, example_models::ScheduleChoice {
  std::optional<int> tp, pp, dp;
  std::vector<int> stage_layers;
  int steps = 60;
  std::string optimizer = "adam";
  std::optional<double> lr;
  example_models::RestartChoice restart;  // --checkpoint-dir, --memory-every, --step-log
};

Settings parse(int argc, char** argv) {
  using example_models::whole_number;
  Settings s;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "-h" || arg == "--help") {
      std::cout << kUsage << example_models::RestartChoice::usage() << "  -h, --help\n";
      std::exit(0);
    }
    if (i + 1 >= argc) throw std::invalid_argument(arg + " needs a value");
    const std::string value = argv[++i];
    if (s.GptOptions::parse(arg, value) || s.ScheduleChoice::parse(arg, value) ||
        s.restart.parse(arg, [&] { return value; })) {
      continue;
    }
    if (arg == "--tp")
      s.tp = whole_number(arg, value, 1);
    else if (arg == "--pp")
      s.pp = whole_number(arg, value, 1);
    else if (arg == "--dp")
      s.dp = whole_number(arg, value, 1);
    else if (arg == "--steps")
      s.steps = whole_number(arg, value, 1);
    else if (arg == "--optimizer")
      s.optimizer = value;
    else if (arg == "--lr")
      s.lr = example_models::decimal_number(arg, value);
    else if (arg == "--stage-layers") {
      std::stringstream items(value);
      for (std::string item; std::getline(items, item, ',');) {
        s.stage_layers.push_back(whole_number(arg, item, 0));
      }
    } else {
      throw std::invalid_argument("unknown option " + arg + " (train_3d --help for usage)");
    }
  }
  if (s.optimizer != "adam" && s.optimizer != "sgd") {
    throw std::invalid_argument("--optimizer takes adam or sgd, not '" + s.optimizer + "'");
  }
  s.finish();
  return s;
}

// Every flag the ranks must be given alike: all of them.
std::vector<braid::collectives::AgreedValue> agreed_settings(const Settings& s) {
  const auto optional = [](const std::optional<int>& v) { return v ? std::to_string(*v) : "auto"; };
  std::string stage_layers;
  for (const int n : s.stage_layers) stage_layers += fmt::format("{},", n);
  std::vector<braid::collectives::AgreedValue> agreed{
      {"--tp", optional(s.tp)},
      {"--pp", optional(s.pp)},
      {"--dp", optional(s.dp)},
      {"--steps", std::to_string(s.steps)},
      {"--schedule", s.schedule},
      {"--microbatches", std::to_string(s.microbatches)},
      {"--virtual-stages", std::to_string(s.virtual_stages)},
      {"--stage-layers", stage_layers},
      {"--layers", std::to_string(s.layers)},
      {"--hidden", std::to_string(s.hidden)},
      {"--heads", std::to_string(s.heads)},
      {"--vocab", std::to_string(s.vocab)},
      {"--seq", std::to_string(s.seq)},
      {"--global-batch", std::to_string(s.global_batch)},
      {"--seed", std::to_string(s.seed)},
      {"--optimizer", s.optimizer},
      {"--lr", s.lr ? fmt::format("{}", *s.lr) : "default"}};
  for (auto& value : s.restart.agreed()) agreed.push_back(std::move(value));
  return agreed;
}

using StageImpl = example_models::GptStageImpl;

int train(const Settings& s) {
  example_models::set_compute_threads(1);
  braid::Runtime runtime;
  auto world = braid::transport::World::join(runtime);
  auto comm = braid::collectives::Communicator::world(*world);
  // Before the grid, which the layout flags shape: a rank started with other flags is named
  // here rather than deadlocking, or training silently on another model.
  runtime.spawn(braid::collectives::expect_agreement(*comm, agreed_settings(s))).get();
  braid::parallel::GridOptions grid_options;
  grid_options.tp = s.tp;
  grid_options.pp = s.pp;
  grid_options.dp = s.dp;
  auto grid = runtime.spawn(braid::parallel::RankGrid::create(comm, grid_options)).get();
  using braid::parallel::Axis;
  auto tp = runtime.spawn(grid->group(Axis::tp)).get();
  auto dp = runtime.spawn(grid->group(Axis::dp)).get();
  auto pipeline = runtime.spawn(grid->group(Axis::pp)).get();
  auto embedding_group = runtime.spawn(grid->embedding_group()).get();
  const int pp = grid->degree(Axis::pp), dps = grid->degree(Axis::dp);
  const bool leader = comm->rank() == 0;

  auto schedule = braid::parallel::lower(
      braid::parallel::make_schedule(s.schedule, pp, s.microbatches, s.virtual_stages),
      {.reduce_grad = dps > 1});
  const int stages = schedule.stages;
  std::vector<int> stage_layers = s.stage_layers;
  if (stage_layers.empty()) {
    if (s.layers % stages != 0) {
      throw std::invalid_argument(fmt::format(
          "--layers {} does not split evenly over {} stages: state them with --stage-layers",
          s.layers, stages));
    }
    stage_layers.assign(static_cast<std::size_t>(stages), s.layers / stages);
  } else if (static_cast<int>(stage_layers.size()) != stages) {
    throw std::invalid_argument(fmt::format("--stage-layers names {} stages; the schedule has {}",
                                            stage_layers.size(), stages));
  }
  if (s.global_batch % (dps * s.microbatches) != 0) {
    throw std::invalid_argument(
        fmt::format("--global-batch {} must divide by dp x microbatches = {}", s.global_batch,
                    dps * s.microbatches));
  }
  const int micro = s.global_batch / dps / s.microbatches;  // sequences per microbatch
  int my_layers = 0;
  for (const int stage : schedule.stages_of(grid->stage())) my_layers += stage_layers[stage];
  example_models::check_fits_in_memory(s, my_layers, grid->degree(Axis::tp), micro);
  const double loss_scale = 1.0 / (static_cast<double>(s.global_batch / dps) * s.seq);
  if (leader) {
    const auto count = [](int n, const char* one, const char* many) {
      return fmt::format("{} {}", n, n == 1 ? one : many);
    };
    std::cout << fmt::format(
        "train_3d: {}, grid {}, schedule {} ({}, {} of {} per data-parallel rank), {} of "
        "hidden {}, vocabulary {}, sequence {}\n",
        count(comm->size(), "rank", "ranks"), grid->describe(), schedule.name,
        count(stages, "stage", "stages"), count(s.microbatches, "microbatch", "microbatches"),
        count(micro, "sequence", "sequences"),
        count(std::accumulate(stage_layers.begin(), stage_layers.end(), 0), "block", "blocks"),
        s.hidden, s.vocab, s.seq);
  }

  const int me = grid->stage();
  Tensor batch;  // this step's global batch, made by the first and last stages' ranks
  std::vector<std::shared_ptr<StageImpl>> modules;
  std::vector<braid::torch::PipelineStage> pipeline_stages;
  std::vector<std::unique_ptr<braid::torch::DistributedDataParallel<std::shared_ptr<StageImpl>>>>
      wrappers;
  std::vector<Tensor> parameters;
  for (const int stage : schedule.stages_of(me)) {
    const int first_layer = std::accumulate(stage_layers.begin(), stage_layers.begin() + stage, 0);
    auto module = std::make_shared<StageImpl>(s, tp, first_layer, stage_layers[stage], stage == 0,
                                              stage == stages - 1);
    modules.push_back(module);
    for (const auto& p : module->parameters()) parameters.push_back(p);
    braid::torch::PipelineStage ps{.stage = stage, .parameters = module->parameters()};
    ps.forward = [&, module, stage](const Tensor& input, int mb) {
      const int from = grid->coordinate(Axis::dp) * (s.global_batch / dps) + mb * micro;
      const Tensor window = batch.narrow(1, from, micro);
      return module->forward(input, window.narrow(0, 0, s.seq), window.narrow(0, 1, s.seq),
                             loss_scale);
    };
    if (dps > 1) {
      wrappers.push_back(
          std::make_unique<braid::torch::DistributedDataParallel<std::shared_ptr<StageImpl>>>(
              module, dp));
      auto* ddp = wrappers.back().get();
      ps.prepare_backward = [ddp](bool sync) { ddp->prepare_for_backward(sync); };
    }
    pipeline_stages.push_back(std::move(ps));
  }
  braid::torch::PipelineExecutor executor(pipeline, schedule, std::move(pipeline_stages),
                                          {.activation_shape = {s.seq, micro, s.hidden}});
  std::unique_ptr<::torch::optim::Optimizer> optimizer;
  if (s.optimizer == "adam") {
    optimizer = std::make_unique<::torch::optim::Adam>(
        parameters, ::torch::optim::AdamOptions(s.lr.value_or(3e-3)));
  } else {
    optimizer = std::make_unique<::torch::optim::SGD>(
        parameters, ::torch::optim::SGDOptions(s.lr.value_or(0.1)).momentum(0.9));
  }
  // The tied embedding's copies on this rank (first and last stage), for the embedding
  // group's all-reduce.
  std::vector<Tensor> tied;
  for (const auto& module : modules) {
    if (module->embed) tied.push_back(module->embed->weight);
  }

  // --checkpoint-dir, --memory-every: this rank's state is its stages' parameters (its TP
  // slices), its optimizer's state and the generator; every rank resumes from the newest
  // step all hold whole, in memory or on disk.
  example_models::Restartable restart(s.restart, comm, "train_3d");
  // A job that changed size (braid-run --nnodes MIN:MAX: fewer data-parallel replicas, the
  // same tp and pp) takes this rank's state from the old grid's rank with its coordinates
  // on every axis but dp, where every replica held the same; the global batch stays, each
  // replica's share of it grows.
  const auto own_state_from = [&](int old_world) {
    braid::parallel::GridSpec old_spec = braid::parallel::GridSpec::from_options(grid_options);
    old_spec.degrees[static_cast<std::size_t>(Axis::dp)] = 0;  // what the old world leaves
    const braid::parallel::GridLayout old_layout(old_world, old_spec);
    braid::parallel::GridLayout::Coordinates at = grid->layout().coordinates(comm->rank());
    at[static_cast<std::size_t>(Axis::dp)] = 0;
    return old_layout.rank_at(at);
  };
  const int first_step = restart.resume(
      [&](const braid::torch::TrainingState& state) {
        example_models::restore_training_state(state, parameters, {}, *optimizer);
      },
      own_state_from);

  std::int64_t from_ns = 0;
  const auto started = std::chrono::steady_clock::now();
  // The pipeline bubble from step 2 on: this rank's compute, over the pipeline's step time
  // (its slowest rank's).
  double computed_ns = 0, pipeline_ns = 0;
  for (int step = first_step; step < s.steps; ++step) {
    if (step == first_step + 1) {
      braid::trace::set_enabled(true);
      from_ns = braid::trace::now_ns();
    }
    batch = example_models::gpt_global_batch(s, step);
    // The step's first transfer lets a neighbour stage go on toward its next update: the
    // last step's in-memory copy must be whole before it.
    restart.before_exchange();
    optimizer->zero_grad(/*set_to_none=*/false);  // in place: the buckets' views stay
    const std::vector<double> losses = executor.run();
    // Megatron-Core's finalize_model_grads order: DP (done in each stage's last backward),
    // then the tied embedding's copies over the embedding group.
    if (embedding_group && embedding_group->size() > 1) {
      braid::torch::tp::all_reduce_replicated_gradients(embedding_group, tied);
    }
    optimizer->step();
    restart.after_step(step + 1, [&] {
      return example_models::training_state(step + 1, parameters, {}, *optimizer);
    });
    if (step >= first_step + 1) {
      const auto times = executor.last_step();
      std::vector<double> wall{static_cast<double>(times.wall_ns)};
      pipeline->launch(pipeline->all_reduce(braid::Buffer(wall), braid::ReduceOp::max)).get();
      computed_ns += static_cast<double>(times.compute_ns);
      pipeline_ns += wall[0];
    }
    // The step's loss: the last stage's microbatch shares, one TP rank per DP rank.
    std::vector<double> loss{grid->is_last_stage() && grid->coordinate(Axis::tp) == 0
                                 ? std::accumulate(losses.begin(), losses.end(), 0.0) / dps
                                 : 0.0};
    comm->launch(comm->all_reduce(braid::Buffer(loss), braid::ReduceOp::sum)).get();
    if (leader) {
      const double seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
      std::cout << fmt::format("step {:>4}/{}  loss {:.6f}  {:.2f} s\n", step + 1, s.steps, loss[0],
                               seconds)
                << std::flush;
    }
  }
  restart.finish();  // the last save on disk before the job ends
  braid::trace::set_enabled(false);
  const std::int64_t to_ns = braid::trace::now_ns();

  // The parameters' checksum, the same for every layout: a TP-split parameter's slices
  // add up to the whole, a replicated one counts once per TP group, each DP replica
  // once, and the tied embedding's second copy not at all.
  double squares = 0;
  for (const auto& module : modules) {
    for (const auto& named : module->named_parameters()) {
      if (named.key().rfind("embed.", 0) == 0 && !module->first) continue;
      bool split = named.key().rfind("embed.", 0) == 0;
      for (const auto& block : module->blocks) {
        for (const auto& [name, dim] : block->parameter_partition_dims()) {
          if (named.key().size() > name.size() &&
              named.key().compare(named.key().size() - name.size(), name.size(), name) == 0 &&
              dim >= 0) {
            split = true;
          }
        }
      }
      const double sum = named.value().detach().square().sum().item<double>();
      squares += split ? sum : sum / tp->size();
    }
  }
  std::vector<double> checksum{squares / dps};
  comm->launch(comm->all_reduce(braid::Buffer(checksum), braid::ReduceOp::sum)).get();
  std::vector<double> bubble{pipeline_ns > 0 ? 100.0 * (1.0 - computed_ns / pipeline_ns) : 0.0};
  std::vector<double> bubbles(static_cast<std::size_t>(comm->size()));
  comm->launch(comm->all_gather(braid::Buffer(bubble), braid::Buffer(bubbles))).get();
  const auto job = example_models::gather_steps_timeline(*world, *comm, from_ns, to_ns);
  if (leader) {
    std::cout << fmt::format("parameters: sum of squares {:.6f}\n", checksum[0]);
    const braid::trace::Summary summary = braid::trace::summarize(*job);
    std::cout << fmt::format(
        "from step 2 on: bubble, the part of the pipeline's step a rank did not compute "
        "(textbook for this schedule {:.1f}%, {}); overlap, its communication hidden behind "
        "compute\n",
        braid::parallel::textbook_bubble(schedule).percent,
        braid::parallel::textbook_bubble(schedule).formula);
    std::cout << "rank  tp  pp  dp   bubble   overlap\n";
    for (const auto& rank : summary.ranks) {
      const auto overlap = rank.figures.overlap_percent();
      std::cout << fmt::format("{:>4}  {:>2}  {:>2}  {:>2}  {:>6.1f}%  {:>8}\n", rank.rank,
                               grid->layout().coordinate(rank.rank, Axis::tp),
                               grid->layout().coordinate(rank.rank, Axis::pp),
                               grid->layout().coordinate(rank.rank, Axis::dp),
                               bubbles[static_cast<std::size_t>(rank.rank)],
                               overlap ? fmt::format("{:.1f}%", *overlap) : "-");
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return train(parse(argc, argv));
  } catch (const std::invalid_argument& e) {
    std::cerr << "train_3d: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "train_3d: " << e.what() << "\n";
    return 1;
  }
}
