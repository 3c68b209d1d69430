// A fully sharded training loop as one rank of a job under braid-run, for the process test
// of what a rank's death does to the others' gathers (parallel_process_test.cpp). Usage:
//   fsdp_probe D   every rank trains an MLP under FULL_SHARD; at step 2 rank D kills itself
//                  (SIGKILL) before its forward, so the others wait in a unit's all-gather
// A survivor whose step fails prints "rank R saw: <what>" on stderr and exits 3; one that
// never sees a failure says so and exits 1; other errors exit 2.
#include <csignal>
#include <iostream>
#include <string>

#include <torch/torch.h>

#include <braid/torch/data_parallel/fully_sharded_data_parallel.hpp>
#include <braid/transport/world.hpp>

#include "../support/probe_report.hpp"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: fsdp_probe DOOMED_RANK\n";
    return 2;
  }
  const int doomed = std::stoi(argv[1]);
  std::signal(SIGTERM, SIG_IGN);
  try {
    torch::set_num_threads(1);
    braid::Runtime runtime;
    auto world = braid::transport::World::join(runtime);
    auto comm = braid::collectives::Communicator::world(*world);
    const int rank = comm->rank();
    torch::nn::Sequential model(torch::nn::Linear(32, 64), torch::nn::Tanh(),
                                torch::nn::Linear(64, 1));
    braid::torch::FullyShardedDataParallel fsdp(comm);
    fsdp.shard(*model[0], "first");
    fsdp.shard(*model, "root");
    torch::optim::SGD opt(fsdp.parameters(), 0.01);
    return braid::testing::report_training(rank, [&] {
      for (int step = 0; step < 100; ++step) {
        if (rank == doomed && step == 2) std::raise(SIGKILL);
        opt.zero_grad();
        const torch::Tensor x = torch::randn({8, 32});
        torch::Tensor y = fsdp.run(*model, [&] {
          torch::Tensor h =
              fsdp.run(*model[0], [&] { return model[0]->as<torch::nn::Linear>()->forward(x); });
          return model[2]->as<torch::nn::Linear>()->forward(torch::tanh(h));
        });
        y.square().mean().backward();
        opt.step();
      }
    });
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 2;
  }
}
