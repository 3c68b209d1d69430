// braid-bench's pipeline worker: the 3D job's model (models/braid_models/gpt_stage.hpp, TP 1)
// trained over pp x dp ranks with the PipelineExecutor under one schedule, timed for `braid-bench
// pipeline`. Timed steps start together (a barrier left out of the trace); a step's time is
// its slowest rank's, from zeroing the gradients to the optimizer's step. Every collective
// is traced (no sampling); the ranks' timelines, gathered in-process to rank 0, give each
// rank's bubble, the compute actions' durations and the data-parallel reduction's exposed
// time (pipeline_timeline.hpp). Rank 0 prints one JSON line.
//
// The data-parallel reduction, two ways. --overlap-dp 1: the executor's, DDP reducing each
// stage's gradients during its last backward, while the other ranks' cool-down runs.
// --overlap-dp 0: what a pipeline without that overlap does: no DDP, and after the
// schedule's last action one all-reduce (average) of all the rank's gradients over the dp
// group, flattened into one buffer.
//
//   braid-run -n 4 build/tools/braid-bench-pipeline-worker --pp 2 --dp 2 --schedule zb
#include <algorithm>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/torch.h>

#include <braid/braid.hpp>
#include <braid/parallel/pipeline_schedule.hpp>
#include <braid/parallel/rank_grid.hpp>
#include <braid/torch/data_parallel/distributed_data_parallel.hpp>
#include <braid/torch/pipeline/pipeline_executor.hpp>
#include <braid/torch/tensor_buffer.hpp>
#include <braid/torch/tensor_parallel/tp_mappings.hpp>

#include "../harness/options.hpp"
#include "braid_models/gpt_stage.hpp"
#include "braid_models/models.hpp"
#include "pipeline_timeline.hpp"
#include "timed_steps.hpp"
#include "worker_main.hpp"

namespace {

using torch::Tensor;

struct Settings : example_models::GptOptions, example_models::ScheduleChoice {
  Settings() { microbatches = 8; }
  int pp = 4;
  int dp = 1;
  int steps = 12;
  int overlap_dp = 1;
};

braid::bench::OptionTable table(Settings& s) {
  using namespace braid::bench;
  return {count("--pp", s.pp, 1),
          count("--dp", s.dp, 1),
          word("--schedule", s.schedule),
          count("--microbatches", s.microbatches, 1),
          count("--virtual-stages", s.virtual_stages, 1),
          count("--steps", s.steps, 4),
          count("--overlap-dp", s.overlap_dp, 0, 1),
          count("--layers", s.layers, 1),
          count("--hidden", s.hidden, 2),
          count("--heads", s.heads, 1),
          count("--vocab", s.vocab, 2),
          count("--seq", s.seq, 2),
          count("--global-batch", s.global_batch, 1)};
}

// The stage's gradients averaged over the dp group in one all-reduce of one flat buffer,
// after the pipeline's step: the reduction no backward overlaps.
void average_gradients(braid::collectives::Communicator& dp,
                       const std::vector<Tensor>& parameters) {
  std::vector<Tensor> grads;
  for (const auto& p : parameters) {
    if (p.grad().defined()) grads.push_back(p.grad().flatten());
  }
  Tensor flat = torch::cat(grads);
  dp.launch(dp.all_reduce(braid::torch::as_buffer(flat), braid::ReduceOp::avg)).get();
  std::int64_t offset = 0;
  for (const auto& p : parameters) {
    if (!p.grad().defined()) continue;
    p.mutable_grad().copy_(flat.narrow(0, offset, p.grad().numel()).view_as(p.grad()));
    offset += p.grad().numel();
  }
}

int train(const Settings& s) {
  example_models::set_compute_threads(1);
  braid::Runtime runtime;
  auto world = braid::transport::World::join(runtime);
  auto comm = braid::collectives::Communicator::world(*world);
  auto grid = runtime
                  .spawn(braid::parallel::RankGrid::create(
                      comm, braid::parallel::GridOptions{.tp = 1, .dp = s.dp, .pp = s.pp}))
                  .get();
  using braid::parallel::Axis;
  auto tp = runtime.spawn(grid->group(Axis::tp)).get();
  auto dp = runtime.spawn(grid->group(Axis::dp)).get();
  auto pipeline = runtime.spawn(grid->group(Axis::pp)).get();
  auto embedding_group = runtime.spawn(grid->embedding_group()).get();
  const int dps = grid->degree(Axis::dp);
  const bool ddp = dps > 1 && s.overlap_dp;

  const auto schedule = braid::parallel::lower(
      braid::parallel::make_schedule(s.schedule, s.pp, s.microbatches, s.virtual_stages),
      {.reduce_grad = ddp});
  const int stages = schedule.stages;
  if (s.layers % stages != 0) {
    throw std::invalid_argument(
        fmt::format("--layers {} does not split evenly over {} stages", s.layers, stages));
  }
  if (s.global_batch % (dps * s.microbatches) != 0) {
    throw std::invalid_argument(
        fmt::format("--global-batch {} must divide by dp x microbatches = {}", s.global_batch,
                    dps * s.microbatches));
  }
  const int layers = s.layers / stages;
  const int micro = s.global_batch / dps / s.microbatches;  // sequences per microbatch
  const double loss_scale = 1.0 / (static_cast<double>(s.global_batch / dps) * s.seq);

  Tensor batch;
  using Stage = example_models::GptStageImpl;
  std::vector<std::shared_ptr<Stage>> modules;
  std::vector<braid::torch::PipelineStage> pipeline_stages;
  std::vector<std::unique_ptr<braid::torch::DistributedDataParallel<std::shared_ptr<Stage>>>>
      wrappers;
  std::vector<Tensor> parameters;
  for (const int stage : schedule.stages_of(grid->stage())) {
    auto module =
        std::make_shared<Stage>(s, tp, stage * layers, layers, stage == 0, stage == stages - 1);
    modules.push_back(module);
    for (const auto& p : module->parameters()) parameters.push_back(p);
    braid::torch::PipelineStage ps{.stage = stage, .parameters = module->parameters()};
    ps.forward = [&, module](const Tensor& input, int mb) {
      const int from = grid->coordinate(Axis::dp) * (s.global_batch / dps) + mb * micro;
      const Tensor window = batch.narrow(1, from, micro);
      return module->forward(input, window.narrow(0, 0, s.seq), window.narrow(0, 1, s.seq),
                             loss_scale);
    };
    if (ddp) {
      wrappers.push_back(
          std::make_unique<braid::torch::DistributedDataParallel<std::shared_ptr<Stage>>>(module,
                                                                                          dp));
      auto* wrapper = wrappers.back().get();
      ps.prepare_backward = [wrapper](bool sync) { wrapper->prepare_for_backward(sync); };
    }
    pipeline_stages.push_back(std::move(ps));
  }
  braid::torch::PipelineExecutor executor(pipeline, schedule, std::move(pipeline_stages),
                                          {.activation_shape = {s.seq, micro, s.hidden}});
  torch::optim::Adam optimizer(parameters, torch::optim::AdamOptions(3e-3));
  std::vector<Tensor> tied;  // the tied embedding's copies on this rank
  for (const auto& module : modules) {
    if (module->embed) tied.push_back(module->embed->weight);
  }

  // Every step's batch made before the loop, so that no step's time includes making it.
  std::vector<Tensor> batches;
  for (int step = 0; step < s.steps; ++step) {
    batches.push_back(example_models::gpt_global_batch(s, step));
  }
  const auto timed =
      braid::bench::time_steps(*world, *comm, s.steps, std::min(3, s.steps / 4), [&](int step) {
        batch = batches[static_cast<std::size_t>(step)];
        optimizer.zero_grad(/*set_to_none=*/false);
        executor.run();
        if (dps > 1 && !s.overlap_dp) average_gradients(*dp, parameters);
        if (embedding_group && embedding_group->size() > 1) {
          braid::torch::tp::all_reduce_replicated_gradients(embedding_group, tied);
        }
        optimizer.step();
      });
  // Rank 0 tells each rank's dp reduction from the tied embedding's by communicator id.
  std::vector<double> dp_ids(static_cast<std::size_t>(comm->size()), 0.0);
  dp_ids[static_cast<std::size_t>(comm->rank())] = dp->id();
  comm->launch(comm->all_reduce(braid::Buffer(dp_ids), braid::ReduceOp::sum)).get();
  if (comm->rank() != 0) return 0;
  const auto& job = timed.timeline;

  std::vector<int> pipeline_of;
  std::vector<std::uint32_t> dp_comm_of;
  for (int r = 0; r < comm->size(); ++r) {
    pipeline_of.push_back(grid->layout().coordinate(r, Axis::dp));
    dp_comm_of.push_back(static_cast<std::uint32_t>(dp_ids[static_cast<std::size_t>(r)]));
  }
  const auto figures = braid::bench::pipeline_timeline_figures(*job, pipeline_of, dp_comm_of,
                                                               static_cast<int>(timed.ms.size()));
  const braid::trace::Summary summary = braid::trace::summarize(*job);
  std::string actions;
  for (const auto& [name, ms] : figures.action_ms)
    actions += fmt::format(",\"{}_ms\":{:.4f}", name, ms);
  std::cout << fmt::format(
      "{{\"pipeline_step\":1,\"pp\":{},\"dp\":{},\"schedule\":\"{}\",\"virtual_stages\":{},"
      "\"microbatches\":{},\"overlap_dp\":{},\"step_ms\":{:.3f},\"pipeline_ms\":{:.3f},"
      "\"bubble_percent\":{:.2f},\"rank_bubble_percent\":[{:.2f}],"
      "\"summary_bubble_percent\":{:.2f}{},\"dp_comm_ms\":{:.3f},\"dp_exposed_ms\":{:.3f},"
      "\"dp_exposed_summary_ms\":{:.3f}}}\n",
      s.pp, dps, s.schedule, s.virtual_stages, s.microbatches, s.overlap_dp, timed.median_ms(),
      figures.pipeline_ms, figures.mean_bubble_percent, fmt::join(figures.rank_bubble_percent, ","),
      summary.job.bubble_percent.value_or(0), actions, figures.dp_comm_ms, figures.dp_exposed_ms,
      figures.dp_exposed_summary_ms);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return braid::bench::worker_main("braid-bench-pipeline-worker", [&] {
    Settings s;
    braid::bench::parse_options(table(s), {argv + 1, argv + argc});
    s.finish();
    return train(s);
  });
}
