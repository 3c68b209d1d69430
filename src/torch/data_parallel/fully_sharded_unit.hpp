// One unit of FullyShardedDataParallel (fully_sharded_data_parallel.hpp): its parameters,
// their place in the flat vector, the gathered storage and this rank's shard. Shared by the
// training code and the checkpoint code.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <torch/torch.h>

#include <braid/core/future.hpp>
#include <braid/torch/data_parallel/fully_sharded_data_parallel.hpp>
#include <braid/trace/recorder.hpp>

#include "torch/tensor_collectives.hpp"

namespace braid::torch {

struct FullyShardedDataParallel::Unit {
  const ::torch::nn::Module* module = nullptr;
  std::string name;
  // The trace instant where a gather of this unit starts, "fsdp.gather NAME", interned once.
  std::optional<trace::Name> gather_mark;
  std::vector<at::Tensor> params;
  std::vector<std::int64_t> offsets;  // of each parameter in the flat vector
  std::vector<std::vector<std::int64_t>> shapes;
  std::int64_t total = 0;   // N
  std::int64_t padded = 0;  // N rounded up to a multiple of the ranks sharding it
  std::int64_t shard_size = 0;
  at::Tensor full;   // [padded] in the compute dtype: the gathered storage, its bytes
                     // released while sharded
  at::Tensor shard;  // this rank's slice, the optimizer's parameter (f32 master under
                     // mixed precision)
  bool gathered = false;
  // An all-gather in flight into `full` (a prefetch), and the low-precision copy of the
  // shard it reads.
  std::optional<Future<void>> gathering;
  at::Tensor gathering_input;
  std::vector<std::shared_ptr<::torch::autograd::Node>> accumulators;
  std::vector<std::uintptr_t> hook_keys;
  std::size_t ready = 0;      // parameters whose gradient this backward has produced
  int pending_backwards = 0;  // forwards with grad whose backward has not ended
  std::optional<detail::TensorCollective> reducing;
  at::Tensor accumulated;  // no_sync(): the flat gradients so far, unsharded

  // The parameters as views of the gathered storage, in their own shapes.
  void point_parameters_at_full() {
    for (std::size_t i = 0; i < params.size(); ++i) {
      params[i].set_data(
          full.narrow(0, offsets[i], c10::multiply_integers(shapes[i])).view(shapes[i]));
    }
  }
};

}  // namespace braid::torch
