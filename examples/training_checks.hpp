// What a data-parallel training program checks and reports at its end, shared by the main
// job (examples/ddp_train.cpp) and braid-bench's DDP worker: that every rank holds the same
// weights, and the job's timeline of the training steps, gathered to rank 0.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include <torch/torch.h>

#include <braid/braid.hpp>

namespace example_models {

// Whether every rank's parameters sum to the same value (one checksum, min and max across
// the ranks): after DDP they hold the same weights to the bit. Collective.
inline bool ranks_hold_the_same_weights(braid::collectives::Communicator& comm,
                                        const std::vector<torch::Tensor>& parameters) {
  std::vector<double> low{0.0};
  for (const auto& p : parameters) low[0] += p.sum().item<double>();
  std::vector<double> high = low;
  comm.launch(comm.all_reduce(braid::Buffer(low), braid::ReduceOp::min)).get();
  comm.launch(comm.all_reduce(braid::Buffer(high), braid::ReduceOp::max)).get();
  return low[0] == high[0];
}

// Every rank's trace records of [from_ns, to_ns), gathered to rank 0 on rank 0's clock, so
// the summary can also tell waiting for a late rank from transfer; nullopt on the other
// ranks. Collective.
inline std::optional<braid::trace::Timeline> gather_steps_timeline(
    braid::transport::World& world, braid::collectives::Communicator& comm, std::int64_t from_ns,
    std::int64_t to_ns) {
  braid::trace::Snapshot snapshot = braid::trace::snapshot();
  std::erase_if(snapshot.records, [&](const braid::trace::Record& r) {
    return r.begin_ns < from_ns || r.end_ns > to_ns;
  });
  const braid::trace::ClockAlignment clock = comm.launch(world.clock_alignment()).get();
  return comm.launch(braid::collectives::gather_timeline(comm, std::move(snapshot), clock)).get();
}

}  // namespace example_models
