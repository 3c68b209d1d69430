// A DDP training loop as one rank of a job, under braid-run or started by hand, for the
// process tests of what a rank's death does to the others (ddp_process_test.cpp). It
// leaves the World with the default leave timeout, so a survivor that waited on a dead
// peer would show as a slow exit. Usage:
//   ddp_probe backward D   every rank trains; at step 2 rank D kills itself (SIGKILL) in
//                          the middle of backward, when its first layer's gradient is
//                          computed (its earlier buckets launched, the last not)
//   ddp_probe joined D     rank 0 has no batch and waits in join(); rank D (not 0) trains
//                          two steps and kills itself before the third forward
//   ddp_probe train        every rank trains 100,000 steps, rank 0 printing "step N" on
//                          stdout after each: a test kills a rank from outside, at a moment
//                          of its choosing
// A survivor whose DDP call fails prints "rank R saw: <what>" on stderr, then tries one more
// step and prints "rank R then: <what>" for the error that refuses it, and exits 3; one
// that never sees a failure says so and exits 1; other errors exit 2. Survivors ignore
// SIGTERM, so that they report what they saw before braid-run's grace runs out.
#include <csignal>
#include <iostream>
#include <string>

#include <torch/torch.h>

#include <braid/core/error.hpp>
#include <braid/torch/data_parallel/distributed_data_parallel.hpp>
#include <braid/transport/bootstrap.hpp>
#include <braid/transport/world.hpp>

namespace {

struct NetImpl : torch::nn::Module {
  NetImpl() {
    fc1 = register_module("fc1", torch::nn::Linear(64, 256));
    fc2 = register_module("fc2", torch::nn::Linear(256, 256));
    fc3 = register_module("fc3", torch::nn::Linear(256, 1));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    return fc3->forward(torch::relu(fc2->forward(torch::relu(fc1->forward(x)))));
  }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr}, fc3{nullptr};
};
TORCH_MODULE(Net);

int usage() {
  std::cerr << "usage: ddp_probe backward|joined DOOMED_RANK, or ddp_probe train\n";
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "train" ? argc != 2 : (mode != "backward" && mode != "joined") || argc != 3) {
    return usage();
  }
  const int doomed = mode == "train" ? -1 : std::stoi(argv[2]);
  std::signal(SIGTERM, SIG_IGN);
  try {
    torch::set_num_threads(1);
    braid::Runtime runtime;
    auto world = braid::transport::World::join(runtime);
    auto comm = braid::collectives::Communicator::world(*world);
    const int rank = comm->rank();
    if (mode != "train" && (doomed <= 0 || doomed >= comm->size())) return usage();
    Net net;
    braid::torch::DistributedDataParallelOptions ddp_options;
    // Small buckets: several in flight when the doomed rank dies.
    ddp_options.limits = {.first_bucket_bytes = 64 << 10, .bucket_cap_bytes = 128 << 10};
    braid::torch::DistributedDataParallel ddp(net, comm, ddp_options);
    torch::optim::SGD opt(net->parameters(), 0.01);
    if (rank == doomed && mode == "backward") {
      net->fc1->weight.register_hook([&](const torch::Tensor& g) {
        static int backward_passes = 0;
        if (++backward_passes == 3) std::raise(SIGKILL);
        return g;
      });
    }
    try {
      if (mode == "joined") ddp.allow_uneven_inputs();
      const int steps = mode == "train" ? 100'000 : mode == "joined" && rank == 0 ? 0 : 100;
      for (int step = 0; step < steps; ++step) {
        if (mode == "joined" && rank == doomed && step == 2) std::raise(SIGKILL);
        opt.zero_grad();
        torch::mse_loss(ddp.forward(torch::randn({32, 64})), torch::randn({32, 1})).backward();
        opt.step();
        if (mode == "train" && rank == 0) std::cout << "step " << step << std::endl;
      }
      if (mode == "joined") ddp.join();
    } catch (const std::exception& e) {
      std::cerr << "rank " << rank << " saw: " << e.what() << "\n";
      // Training on is refused, with the failure that ended the last iteration.
      try {
        opt.zero_grad();
        torch::mse_loss(ddp.forward(torch::randn({32, 64})), torch::randn({32, 1})).backward();
        std::cerr << "rank " << rank << " then trained another step\n";
      } catch (const std::exception& again) {
        std::cerr << "rank " << rank << " then: " << again.what() << "\n";
      }
      return 3;
    }
    std::cerr << "rank " << rank << ": training went on after a rank was killed\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 2;
  }
}
