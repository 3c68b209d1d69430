// Overlapping communication with compute, and seeing it: each step launches an
// all-reduce of a "gradient" buffer, computes while it is in flight, then waits for it;
// every few steps it waits first and computes after, so part of the communication is
// exposed. Run it with BRAID_TRACE and read the timeline:
//
//   BRAID_TRACE=traces braid-run -n 2 build/examples/overlap [steps] [KiB]
//   braid-trace summary traces
//   braid-trace html traces -o timeline.html
//
// The compute regions are trace::ComputeRegion scopes; the collectives record themselves.
#include <cmath>
#include <iostream>
#include <vector>

#include <braid/braid.hpp>
#include <braid/collectives/communicator.hpp>
#include <braid/trace/region.hpp>

#include "braid_models/whole_number.hpp"

namespace {

// Stand-in for a layer's backward: enough arithmetic to take a while, a result that is
// used so the compiler keeps it.
double compute(std::vector<double>& activations, int rounds) {
  double sum = 0;
  for (int round = 0; round < rounds; ++round) {
    for (double& a : activations) {
      a = std::sin(a) * 0.5 + 0.25;
      sum += a;
    }
  }
  return sum;
}

}  // namespace

int main(int argc, char** argv) {
  int steps = 20;
  int kib = 4096;
  try {
    if (argc > 1) steps = example_models::whole_number("steps", argv[1], 1, 1'000'000);
    // The gradients are allocated whole: at most 1 GiB.
    if (argc > 2) kib = example_models::whole_number("KiB per all-reduce", argv[2], 1, 1 << 20);
  } catch (const std::invalid_argument& e) {
    std::cerr << "overlap: " << e.what() << " (usage: overlap [steps] [KiB per all-reduce])\n";
    return 2;
  }
  try {
    braid::Runtime runtime;
    auto world = braid::transport::World::join(runtime);
    auto comm = braid::collectives::Communicator::world(*world);
    std::vector<float> gradients(static_cast<std::size_t>(kib) * 1024 / sizeof(float));
    std::vector<double> activations(1 << 14, 0.5);
    double checksum = 0;
    for (int step = 0; step < steps; ++step) {
      std::fill(gradients.begin(), gradients.end(), static_cast<float>(comm->rank() + 1));
      braid::Buffer buffer(gradients);
      const bool overlapped = step % 4 != 3;
      if (overlapped) {
        auto reduced = comm->launch(comm->all_reduce(buffer, braid::ReduceOp::sum));
        {
          braid::trace::ComputeRegion region("backward");
          region.arg("step", step);
          checksum += compute(activations, 40);
        }
        reduced.get();
      } else {
        comm->launch(comm->all_reduce(buffer, braid::ReduceOp::sum)).get();
        braid::trace::ComputeRegion region("backward");
        region.arg("step", step);
        checksum += compute(activations, 40);
      }
      const float expected = static_cast<float>(comm->size() * (comm->size() + 1) / 2);
      if (gradients.front() != expected || gradients.back() != expected) {
        std::cerr << "overlap: rank " << comm->rank() << " step " << step << ": got "
                  << gradients.front() << ", expected " << expected << "\n";
        return 1;
      }
    }
    if (comm->rank() == 0) {
      std::cout << "overlap: " << steps << " steps of a " << kib << " KiB all-reduce on "
                << comm->size() << " rank(s), results checked (checksum " << checksum << ")\n";
      if (auto file = braid::trace::output_file()) {
        std::cout << "trace: " << file->parent_path().string() << " (braid-trace summary / html)\n";
      }
    }
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "overlap: " << e.what() << "\n";
    return 1;
  }
}
