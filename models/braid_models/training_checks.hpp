// What a data-parallel training program does around its loop, shared by the main job
// (examples/ddp_train.cpp) and braid-bench's DDP worker: joining the job, and at the end
// checking that every rank holds the same weights and gathering the job's timeline of the
// training steps to rank 0.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <torch/torch.h>

#include <braid/braid.hpp>
#include <braid/torch/data_parallel/distributed_data_parallel.hpp>

#include "braid_models/models.hpp"

namespace example_models {

// Whether every rank's parameters sum to the same value (one checksum, min and max across
// the ranks): after DDP they hold the same weights to the bit. Collective.
bool ranks_hold_the_same_weights(braid::collectives::Communicator& comm,
                                 const std::vector<torch::Tensor>& parameters);

// Every rank's trace records of [from_ns, to_ns), gathered to rank 0 on rank 0's clock, so
// the summary can also tell waiting for a late rank from transfer; nullopt on the other
// ranks. Collective.
std::optional<braid::trace::Timeline> gather_steps_timeline(braid::transport::World& world,
                                                            braid::collectives::Communicator& comm,
                                                            std::int64_t from_ns,
                                                            std::int64_t to_ns);

// How the model is trained: the optimizer, libtorch's intra-op threads and DDP's options,
// as the main job and braid-bench's DDP worker take them on their command lines.
struct TrainingChoice {
  std::string optimizer = "adam";
  int threads = 1;
  std::string device = "cpu";  // or cuda: CUDA device LOCAL_RANK (modulo the devices)
  braid::torch::DistributedDataParallelOptions ddp;

  // Takes `option` (reading its value with `value()`) if it is one of these; false if not.
  template <class Value>
  bool parse(const std::string& option, Value&& value) {
    if (option == "--optimizer")
      optimizer = value();
    else if (option == "--threads")
      threads = whole_number(option, value(), 1);
    else if (option == "--bucket-cap-mib")
      ddp.limits.bucket_cap_bytes =
          static_cast<std::size_t>(decimal_number(option, value()) * (1 << 20));
    else if (option == "--copy-gradients")
      ddp.gradient_as_bucket_view = false;
    else if (option == "--private-buckets")
      ddp.shared_buckets = false;
    else if (option == "--device")
      device = value();
    else
      return false;
    return true;
  }
};

// The device rank `local_rank` trains on for `--device`: the CPU, or CUDA device
// local_rank modulo the devices libtorch sees (ranks beyond them share, as two processes
// on a one-GPU machine do).
torch::Device training_device(const std::string& device, int local_rank);

// Joins the job as the launcher's environment says, with tracing on (for the closing summary;
// BRAID_TRACE also writes files) and `threads` intra-op threads, and calls
// train(world, model) with the model `choice` names, on the `device` training_device()
// gives this rank. Returns what train returns.
template <class Train>
int join_and_train(const ModelChoice& choice, int threads, Train train,
                   const std::string& device = "cpu") {
  set_compute_threads(threads);
  braid::trace::set_enabled(true);
  braid::Runtime runtime;
  auto world = braid::transport::World::join(runtime);
  const torch::Device on = training_device(device, world->launch().local_rank);
  if (choice.transformer()) {
    auto model = choice.make_transformer();
    model->to(on);
    return train(*world, model);
  }
  auto model = choice.make_mlp();
  model->to(on);
  return train(*world, model);
}

// Where `model` lives: the device its batches go to.
template <class Model>
torch::Device device_of(const Model& model) {
  const auto parameters = model->parameters();
  return parameters.empty() ? torch::Device(torch::kCPU) : parameters.front().device();
}

}  // namespace example_models
