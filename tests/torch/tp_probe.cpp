// A tensor-parallel training loop as one rank of a job under braid-run, for the process
// test of what a rank's death does to its TP partners (parallel_process_test.cpp). The grid
// comes from the environment (BRAID_TP, as a launch script sets it); every rank trains a
// ParallelTransformerBlock over its TP group. Usage:
//   tp_probe forward D    at step 2 rank D kills itself (SIGKILL) before its forward: the
//                         others wait in the attention projection's forward all-reduce
//   tp_probe backward D   at step 2 rank D kills itself in the middle of backward, when the
//                         MLP's first layer's weight gradient is computed: the others wait
//                         in that layer's input-gradient all-reduce
// A survivor whose step fails prints "rank R saw: <what>" on stderr and exits 3; one that
// never sees a failure says so and exits 1; other errors exit 2.
#include <csignal>
#include <iostream>
#include <string>

#include <torch/torch.h>

#include <braid/core/error.hpp>
#include <braid/parallel/rank_grid.hpp>
#include <braid/torch/tensor_parallel/parallel_transformer_block.hpp>
#include <braid/transport/world.hpp>

#include "../support/probe_report.hpp"

int main(int argc, char** argv) {
  const std::string mode = argc == 3 ? argv[1] : "";
  if (mode != "forward" && mode != "backward") {
    std::cerr << "usage: tp_probe forward|backward DOOMED_RANK\n";
    return 2;
  }
  const int doomed = std::stoi(argv[2]);
  std::signal(SIGTERM, SIG_IGN);
  try {
    torch::set_num_threads(1);
    braid::Runtime runtime;
    auto world = braid::transport::World::join(runtime);
    auto comm = braid::collectives::Communicator::world(*world);
    auto grid = runtime.spawn(braid::parallel::RankGrid::create(comm)).get();
    auto tp = runtime.spawn(grid->group("tp")).get();
    const int rank = comm->rank();
    braid::torch::ParallelTransformerBlock block(
        tp, braid::torch::ParallelTransformerBlockOptions{.hidden = 64, .heads = 4, .seed = 1});
    torch::optim::SGD opt(block->parameters(), 0.01);
    int backward_passes = 0;
    if (rank == doomed && mode == "backward") {
      block->fc1->weight.register_hook([&](const torch::Tensor& g) {
        if (++backward_passes == 3) std::raise(SIGKILL);
        return g;
      });
    }
    return braid::testing::report_training(rank, [&] {
      for (int step = 0; step < 100; ++step) {
        if (rank == doomed && mode == "forward" && step == 2) std::raise(SIGKILL);
        opt.zero_grad();
        block(torch::randn({16, 2, 64})).square().mean().backward();
        opt.step();
      }
    });
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 2;
  }
}
