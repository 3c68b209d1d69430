// braid-bench: braid's benchmarks, each printed beside the peers it competes with, measured
// in the same run. Every mode is described in modes/ (its options table, how it runs); this
// file lists them, prints the usage text they make and turns errors into exit codes.
#include <algorithm>
#include <iostream>
#include <new>
#include <stdexcept>
#include <string>
#include <vector>

#include <braid/core/excerpt.hpp>

#include "modes/modes.hpp"

namespace {

std::vector<braid::bench::Mode> all_modes() {
  using namespace braid::bench;
  return {
    p2p_mode(), collectives_mode(), algorithms_mode(), trace_cost_mode(), ddp_mode(),
        compute_tax_mode(), tp_mode(), pipeline_mode(), sharded_mode(), torch_backend_mode(),
        recovery_mode(),
#if BRAID_WITH_CUDA
        nccl_mode(), cuda_p2p_mode()
#endif
  };
}

std::string usage(const std::vector<braid::bench::Mode>& modes) {
  std::string text = "usage: braid-bench MODE [options]\nmodes:\n";
  for (const auto& mode : modes) text += mode.usage();
  return text;
}

}  // namespace

int main(int argc, char** argv) {
  const std::vector<braid::bench::Mode> modes = all_modes();
  if (argc < 2 || std::string(argv[1]) == "--help" || std::string(argv[1]) == "-h") {
    std::cerr << usage(modes);
    return argc < 2 ? 2 : 0;
  }
  const std::string name = argv[1];
  const std::vector<std::string> args(argv + 2, argv + argc);
  // "braid-bench MODE --help": every mode's options are in the one usage text.
  if (std::find(args.begin(), args.end(), "--help") != args.end() ||
      std::find(args.begin(), args.end(), "-h") != args.end()) {
    std::cout << usage(modes);
    return 0;
  }
  const auto mode =
      std::find_if(modes.begin(), modes.end(), [&](const auto& m) { return m.name == name; });
  if (mode == modes.end()) {
    std::cerr << "braid-bench: unknown mode '" << braid::excerpt(name)
              << "' (braid-bench --help lists them)\n";
    return 2;
  }
  try {
    return mode->run(args);
  } catch (const std::invalid_argument& e) {
    std::cerr << "braid-bench " << name << ": " << e.what() << " (braid-bench --help for usage)\n";
    return 2;
  } catch (const std::bad_alloc&) {
    std::cerr
        << "braid-bench " << name
        << ": out of memory for the buffers asked for (a smaller --max-bytes, fewer --ranks)\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "braid-bench " << name << ": " << e.what() << "\n";
    return 1;
  }
}
