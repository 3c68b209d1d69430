#include "braid_models/training_checks.hpp"

#include <stdexcept>

namespace example_models {

bool ranks_hold_the_same_weights(braid::collectives::Communicator& comm,
                                 const std::vector<torch::Tensor>& parameters) {
  std::vector<double> low{0.0};
  for (const auto& p : parameters) low[0] += p.sum().item<double>();
  std::vector<double> high = low;
  comm.launch(comm.all_reduce(braid::Buffer(low), braid::ReduceOp::min)).get();
  comm.launch(comm.all_reduce(braid::Buffer(high), braid::ReduceOp::max)).get();
  return low[0] == high[0];
}

std::optional<braid::trace::Timeline> gather_steps_timeline(braid::transport::World& world,
                                                            braid::collectives::Communicator& comm,
                                                            std::int64_t from_ns,
                                                            std::int64_t to_ns) {
  braid::trace::Snapshot snapshot = braid::trace::snapshot();
  std::erase_if(snapshot.records, [&](const braid::trace::Record& r) {
    return r.begin_ns < from_ns || r.end_ns > to_ns;
  });
  const braid::trace::ClockAlignment clock = comm.launch(world.clock_alignment()).get();
  return comm.launch(braid::collectives::gather_timeline(comm, std::move(snapshot), clock)).get();
}

torch::Device training_device(const std::string& device, int local_rank) {
  if (device == "cpu") return torch::Device(torch::kCPU);
  if (device != "cuda") throw std::invalid_argument("--device cpu|cuda, not '" + device + "'");
  const auto count = static_cast<int>(torch::cuda::device_count());
  if (count == 0) {
    throw std::invalid_argument(
        "--device cuda: libtorch sees no CUDA device (no GPU here, or a CPU-only libtorch)");
  }
  return torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(local_rank % count));
}

}  // namespace example_models
