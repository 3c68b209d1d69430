// braid-bench's tensor-parallel worker: a stack of ParallelTransformerBlocks trained
// forward and backward over a TP group of every rank (the grid's tp = the world), timed
// for `braid-bench tp`. Timed steps start together (a barrier left out of the trace); a
// step's time is its slowest rank's. Every TP collective is traced (no sampling), and the
// exposed TP communication per step is braid-trace's (communication no compute span
// covers), from the ranks' timelines gathered in-process. Rank 0 prints one JSON line.
//
//   braid-run -n 2 build/tools/braid-bench-tp-worker --hidden 256 --overlap 0
#include <algorithm>
#include <iostream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <torch/torch.h>

#include <braid/braid.hpp>
#include <braid/parallel/rank_grid.hpp>
#include <braid/torch/tensor_parallel/parallel_transformer_block.hpp>

#include "braid_models/models.hpp"
#include "timed_steps.hpp"
#include "tp_shape.hpp"
#include "worker_main.hpp"

namespace {

struct Settings : braid::bench::TpShape {
  int overlap = 1;
  int sequence_parallel = 0;
};

braid::bench::OptionTable table(Settings& s) {
  braid::bench::OptionTable options = shape_options(s);
  options.push_back(braid::bench::count("--overlap", s.overlap, 0, 1));
  options.push_back(braid::bench::count("--sequence-parallel", s.sequence_parallel, 0, 1));
  return options;
}

int train(const Settings& s) {
  example_models::set_compute_threads(1);
  braid::Runtime runtime;
  auto world = braid::transport::World::join(runtime);
  auto comm = braid::collectives::Communicator::world(*world);
  auto grid = runtime.spawn(braid::parallel::RankGrid::create(comm, {.tp = comm->size()})).get();
  auto tp = runtime.spawn(grid->group("tp")).get();
  const int t = tp->size();

  std::vector<braid::torch::ParallelTransformerBlock> blocks;
  std::vector<torch::Tensor> parameters, replicated;
  for (int layer = 0; layer < s.layers; ++layer) {
    blocks.emplace_back(tp, braid::torch::ParallelTransformerBlockOptions{
                                .hidden = s.hidden,
                                .heads = s.heads,
                                .sequence_parallel = s.sequence_parallel == 1,
                                .overlap_grad_reduce = s.overlap == 1,
                                .seed = static_cast<std::uint64_t>(100 * layer)});
    for (const auto& p : blocks.back()->parameters()) parameters.push_back(p);
    for (const auto& p : blocks.back()->sequence_parallel_parameters()) replicated.push_back(p);
  }
  // The same batch on every TP rank (a TP group reads one data-parallel shard); under
  // sequence parallelism each rank takes its slice of the sequence.
  torch::manual_seed(1);
  torch::Tensor x = torch::randn({s.seq, s.batch, s.hidden});
  if (s.sequence_parallel) x = x.chunk(t, 0)[tp->rank()].contiguous();

  const auto timed =
      braid::bench::time_steps(*world, *comm, s.steps, std::min(3, s.steps / 4), [&](int) {
        for (auto& p : parameters) p.mutable_grad() = torch::Tensor();
        torch::Tensor h = x;
        for (auto& block : blocks) h = block(h);
        h.square().mean().backward();
        braid::torch::tp::all_reduce_replicated_gradients(tp, replicated);
      });
  if (comm->rank() != 0) return 0;
  const auto& f = braid::trace::summarize(*timed.timeline).job.figures;
  const auto per_step_ms = [&](std::int64_t ns) { return timed.per_rank_step_ms(ns, t); };
  std::cout << fmt::format(
      "{{\"tp_step\":1,\"ranks\":{},\"overlap\":{},\"sequence_parallel\":{},\"step_ms\":{:.3f},"
      "\"exposed_ms\":{:.3f},\"communication_ms\":{:.3f},\"compute_ms\":{:.3f}}}\n",
      t, s.overlap, s.sequence_parallel, timed.median_ms(), per_step_ms(f.exposed_ns),
      per_step_ms(f.communication_ns), per_step_ms(f.compute_ns));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return braid::bench::worker_main("braid-bench-tp-worker", [&] {
    Settings s;
    braid::bench::parse_options(table(s), {argv + 1, argv + argc});
    return train(s);
  });
}
