// braid-bench's tensor-parallel worker: a stack of ParallelTransformerBlocks trained
// forward and backward over a TP group of every rank (the grid's tp = the world), timed
// for `braid-bench tp`. Timed steps start together (a barrier left out of the trace); a
// step's time is its slowest rank's. Every TP collective is traced (no sampling), and the
// exposed TP communication per step is braid-trace's (communication no compute span
// covers), from the ranks' timelines gathered in-process. Rank 0 prints one JSON line.
//
//   braid-run -n 2 build/tools/braid-bench-tp-worker --hidden 256 --overlap 0
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <torch/torch.h>

#include <braid/braid.hpp>
#include <braid/parallel/rank_grid.hpp>
#include <braid/torch/tensor_parallel/parallel_transformer_block.hpp>

#include "median.hpp"
#include "models.hpp"
#include "training_checks.hpp"
#include "worker_main.hpp"

namespace {

constexpr const char* kUsage = R"(usage: braid-run -n T braid-bench-tp-worker [options]

options: --hidden N  --heads N  --layers N  --seq N  --batch N  --steps N (>= 4)
         --overlap 0|1  --sequence-parallel 0|1
)";

struct Settings {
  int hidden = 256;
  int heads = 8;
  int layers = 2;
  int seq = 64;
  int batch = 4;
  int steps = 20;
  bool overlap = true;
  bool sequence_parallel = false;
};

bool flag(const std::string& option, const std::string& text) {
  if (text != "0" && text != "1") throw std::invalid_argument(option + " takes 0 or 1");
  return text == "1";
}

Settings parse(int argc, char** argv) {
  using example_models::whole_number;
  Settings s;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (i + 1 >= argc) throw std::invalid_argument(arg + " needs a value\n" + kUsage);
    const std::string value = argv[++i];
    if (arg == "--hidden")
      s.hidden = whole_number(arg, value, 8);
    else if (arg == "--heads")
      s.heads = whole_number(arg, value, 1);
    else if (arg == "--layers")
      s.layers = whole_number(arg, value, 1);
    else if (arg == "--seq")
      s.seq = whole_number(arg, value, 1);
    else if (arg == "--batch")
      s.batch = whole_number(arg, value, 1);
    else if (arg == "--steps")
      s.steps = whole_number(arg, value, 4);
    else if (arg == "--overlap")
      s.overlap = flag(arg, value);
    else if (arg == "--sequence-parallel")
      s.sequence_parallel = flag(arg, value);
    else
      throw std::invalid_argument("unknown option " + arg + "\n" + kUsage);
  }
  return s;
}

int train(const Settings& s) {
  torch::set_num_threads(1);
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
                                .sequence_parallel = s.sequence_parallel,
                                .overlap_grad_reduce = s.overlap,
                                .seed = static_cast<std::uint64_t>(100 * layer)});
    for (const auto& p : blocks.back()->parameters()) parameters.push_back(p);
    for (const auto& p : blocks.back()->sequence_parallel_parameters()) replicated.push_back(p);
  }
  // The same batch on every TP rank (a TP group reads one data-parallel shard); under
  // sequence parallelism each rank takes its slice of the sequence.
  torch::manual_seed(1);
  torch::Tensor x = torch::randn({s.seq, s.batch, s.hidden});
  if (s.sequence_parallel) x = x.chunk(t, 0)[tp->rank()].contiguous();

  const int warmup = std::min(3, s.steps / 4);
  std::vector<double> timed_ms;
  std::int64_t from_ns = 0;
  for (int step = 0; step < s.steps; ++step) {
    if (step >= warmup) {
      braid::trace::set_enabled(false);
      comm->launch(comm->barrier()).get();
      braid::trace::set_enabled(true);
      if (step == warmup) from_ns = braid::trace::now_ns();
    }
    const auto started = std::chrono::steady_clock::now();
    for (auto& p : parameters) p.mutable_grad() = torch::Tensor();
    torch::Tensor h = x;
    for (auto& block : blocks) h = block(h);
    h.square().mean().backward();
    braid::torch::tp::all_reduce_replicated_gradients(tp, replicated);
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - started)
            .count();
    if (step >= warmup) timed_ms.push_back(ms);
  }
  braid::trace::set_enabled(false);
  const std::int64_t to_ns = braid::trace::now_ns();
  comm->launch(comm->all_reduce(braid::Buffer(timed_ms), braid::ReduceOp::max)).get();
  const auto job = example_models::gather_steps_timeline(*world, *comm, from_ns, to_ns);
  if (comm->rank() != 0) return 0;
  const braid::trace::Summary summary = braid::trace::summarize(*job);
  const double steps = static_cast<double>(timed_ms.size());
  const auto per_step_ms = [&](std::int64_t ns) {
    return static_cast<double>(ns) / 1e6 / t / steps;  // per rank, per step
  };
  const auto& f = summary.job.figures;
  std::cout << fmt::format(
      "{{\"tp_step\":1,\"ranks\":{},\"overlap\":{},\"sequence_parallel\":{},\"step_ms\":{:.3f},"
      "\"exposed_ms\":{:.3f},\"communication_ms\":{:.3f},\"compute_ms\":{:.3f}}}\n",
      t, s.overlap ? 1 : 0, s.sequence_parallel ? 1 : 0, braid::bench::median(timed_ms),
      per_step_ms(f.exposed_ns), per_step_ms(f.communication_ns), per_step_ms(f.compute_ns));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return braid::bench::worker_main("braid-bench-tp-worker",
                                   [&] { return train(parse(argc, argv)); });
}
