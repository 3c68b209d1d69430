// DDP on a device, checked against one process: every rank of a braid-run job trains a
// small net under DistributedDataParallel on `--device` (as the main job places its ranks:
// example_models::training_device), and rank 0 also trains the same net alone on every rank's batch
// concatenated. After the steps rank 0's parameters must match the lone net's, and every
// rank's must be rank 0's. On a one-GPU machine `braid-run -n 1` takes the NCCL path and
// `braid-run -n 2` the staged one (two ranks share the GPU). Prints "ddp_device_probe: OK"
// and exits 0, or names what differs and exits 1; 2 for bad arguments, 77 (skipped) for
// --device cuda where libtorch sees no device.
//
//   braid-run -n 2 ddp_device_probe --device cuda [--copy-gradients] [--compress]
#include <cstdlib>
#include <iostream>
#include <stdexcept>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <torch/torch.h>

#include <braid/core/error.hpp>
#include <braid/dp/comm_hook.hpp>
#include <braid/torch/data_parallel/distributed_data_parallel.hpp>
#include <braid/transport/bootstrap.hpp>
#include <braid/transport/world.hpp>

#include "braid_models/training_checks.hpp"

namespace {

struct NetImpl : torch::nn::Module {
  NetImpl() {
    fc1 = register_module("fc1", torch::nn::Linear(32, 512));
    fc2 = register_module("fc2", torch::nn::Linear(512, 512));
    fc3 = register_module("fc3", torch::nn::Linear(512, 1));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    return fc3->forward(torch::relu(fc2->forward(torch::relu(fc1->forward(x)))));
  }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr}, fc3{nullptr};
};
TORCH_MODULE(Net);

Net make_net(const torch::Device& device) {
  torch::manual_seed(7);
  Net net;
  net->to(device);
  return net;
}

// Rank r's batch at `step`, the same wherever it is drawn (on the CPU, then moved).
std::pair<torch::Tensor, torch::Tensor> batch(int rank, int step, const torch::Device& device) {
  torch::manual_seed(100 * step + rank + 1);
  torch::Tensor x = torch::randn({16, 32});
  torch::Tensor y = torch::randn({16, 1});
  return {x.to(device), y.to(device)};
}

}  // namespace

int main(int argc, char** argv) {
  std::string device_name = "cpu";
  braid::torch::DistributedDataParallelOptions options;
  options.limits = {.first_bucket_bytes = 4096, .bucket_cap_bytes = 256 << 10};
  bool compress = false;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--device" && i + 1 < argc) {
      device_name = argv[++i];
    } else if (arg == "--copy-gradients") {
      options.gradient_as_bucket_view = false;
    } else if (arg == "--compress") {
      compress = true;
    } else {
      std::cerr << "usage: ddp_device_probe [--device cpu|cuda] [--copy-gradients] "
                   "[--compress]\n";
      return 2;
    }
  }
  // No device to run on: skipped (77, which meson and ctest count as a skip), as the
  // GPU-labelled tests skip themselves, before any rank joins.
  if (device_name == "cuda" && torch::cuda::device_count() == 0) {
    std::cerr << "ddp_device_probe: --device cuda: no CUDA device here; skipped\n";
    return 77;
  }
  try {
    torch::set_num_threads(1);
    braid::Runtime runtime;
    auto world = braid::transport::World::join(runtime);
    auto comm = braid::collectives::Communicator::world(*world);
    torch::Device device(torch::kCPU);
    try {
      device = example_models::training_device(device_name, world->launch().local_rank);
    } catch (const std::invalid_argument& e) {
      std::cerr << "ddp_device_probe: " << e.what() << "\n";
      return 2;
    }
    constexpr int kSteps = 5;
    const int ranks = comm->size();
    const int rank = comm->rank();
    Net net = make_net(device);
    braid::torch::DistributedDataParallel ddp(net, comm, options);
    if (compress) ddp.reducer().set_comm_hook(braid::dp::compress_hook(braid::DType::bf16));
    torch::optim::SGD optimizer(net->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
    for (int step = 0; step < kSteps; ++step) {
      auto [x, y] = batch(rank, step, device);
      optimizer.zero_grad();
      torch::mse_loss(ddp.forward(x), y).backward();
      optimizer.step();
    }
    // Every rank holds rank 0's parameters (the sum over ranks of each one's sum).
    double mine = 0;
    for (const auto& p : net->parameters()) mine += p.sum().item<double>();
    std::vector<double> low{mine};
    std::vector<double> high{mine};
    comm->launch(comm->all_reduce(braid::Buffer(low), braid::ReduceOp::min)).get();
    comm->launch(comm->all_reduce(braid::Buffer(high), braid::ReduceOp::max)).get();
    if (low[0] != high[0]) {
      std::cerr << fmt::format(
          "ddp_device_probe: rank {}: the ranks' parameters differ "
          "(sums from {} to {})\n",
          rank, low[0], high[0]);
      return 1;
    }
    if (rank != 0) return 0;
    // One process, every rank's batch concatenated (the mean loss over the global batch is
    // the mean of the ranks' mean losses at equal batches).
    Net alone = make_net(device);
    torch::optim::SGD alone_optimizer(alone->parameters(),
                                      torch::optim::SGDOptions(0.05).momentum(0.9));
    for (int step = 0; step < kSteps; ++step) {
      std::vector<torch::Tensor> xs;
      std::vector<torch::Tensor> ys;
      for (int r = 0; r < ranks; ++r) {
        auto [x, y] = batch(r, step, device);
        xs.push_back(x);
        ys.push_back(y);
      }
      alone_optimizer.zero_grad();
      torch::mse_loss(alone->forward(torch::cat(xs)), torch::cat(ys)).backward();
      alone_optimizer.step();
    }
    // bf16 on the wire rounds each bucket's sum to 8 bits of mantissa.
    const double rtol = compress ? 2e-2 : 1e-4;
    const double atol = compress ? 2e-3 : 1e-5;
    const auto ours = net->parameters();
    const auto theirs = alone->parameters();
    for (std::size_t i = 0; i < ours.size(); ++i) {
      if (!torch::allclose(ours[i].cpu(), theirs[i].cpu(), rtol, atol)) {
        std::cerr << fmt::format(
            "ddp_device_probe: parameter {} differs from one process's on the concatenated "
            "batch by up to {}\n",
            i, (ours[i] - theirs[i]).abs().max().item<double>());
        return 1;
      }
    }
    std::cout << fmt::format("ddp_device_probe: OK ({} ranks on {}, {}{})\n", ranks, device.str(),
                             options.gradient_as_bucket_view ? "bucket views" : "copy mode",
                             compress ? ", bf16 compression" : "");
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "ddp_device_probe: " << e.what() << "\n";
    return 1;
  }
}
