// A pipeline-parallel training loop as one rank of a job under braid-run, for the process
// test of what a rank's death does to the rest of its pipeline (parallel_process_test.cpp).
// Every rank is a stage of one pipeline (pp = the world) running 1F1B over 4 microbatches.
// Usage:
//   pipeline_probe forward D    at step 2 rank D kills itself (SIGKILL) in its first forward
//   pipeline_probe backward D   at step 2 rank D kills itself in its first backward
// A survivor whose step fails prints "rank R saw: <what>" on stderr and exits 3; one that
// never sees a failure says so and exits 1; other errors exit 2.
#include <csignal>
#include <iostream>
#include <string>

#include <torch/torch.h>

#include <braid/core/error.hpp>
#include <braid/parallel/pipeline_schedule.hpp>
#include <braid/parallel/rank_grid.hpp>
#include <braid/torch/pipeline/pipeline_executor.hpp>
#include <braid/transport/world.hpp>

#include "../support/probe_report.hpp"

int main(int argc, char** argv) {
  const std::string mode = argc == 3 ? argv[1] : "";
  if (mode != "forward" && mode != "backward") {
    std::cerr << "usage: pipeline_probe forward|backward DOOMED_RANK\n";
    return 2;
  }
  const int doomed = std::stoi(argv[2]);
  std::signal(SIGTERM, SIG_IGN);
  try {
    torch::set_num_threads(1);
    braid::Runtime runtime;
    auto world = braid::transport::World::join(runtime);
    auto comm = braid::collectives::Communicator::world(*world);
    auto grid = runtime.spawn(braid::parallel::RankGrid::create(comm, {.pp = comm->size()})).get();
    auto pipeline = runtime.spawn(grid->group(braid::parallel::Axis::pp)).get();
    const int rank = comm->rank();
    const int stages = comm->size();
    constexpr int kMicrobatches = 4;
    torch::nn::Linear linear(32, 32);
    int step = 0;
    bool forwarded = false;
    braid::torch::PipelineStage stage{
        .stage = rank,
        .forward =
            [&](const torch::Tensor& input, int) {
              if (rank == doomed && mode == "forward" && step == 2) std::raise(SIGKILL);
              torch::Tensor x = rank == 0 ? torch::randn({8, 32}) : input;
              torch::Tensor y = torch::tanh(linear(x));
              if (rank == doomed && mode == "backward" && step == 2 && !forwarded) {
                forwarded = true;
                y.register_hook([](const torch::Tensor& g) {
                  std::raise(SIGKILL);
                  return g;
                });
              }
              return rank == stages - 1 ? y.square().mean() : y;
            },
        .parameters = linear->parameters()};
    braid::torch::PipelineExecutor executor(
        pipeline, braid::parallel::lower(braid::parallel::one_f_one_b(stages, kMicrobatches)),
        {stage}, {.activation_shape = {8, 32}});
    torch::optim::SGD opt(linear->parameters(), 0.01);
    return braid::testing::report_training(rank, [&] {
      for (step = 0; step < 100; ++step) {
        opt.zero_grad();
        executor.run();
        opt.step();
      }
    });
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 2;
  }
}
