// braid-bench: braid's benchmarks, each printed beside the peers it competes with,
// measured in the same run.
//
//   braid-bench p2p [--json] [--no-peers] [--latency-iters N] [--bandwidth-iters N]
#include <iostream>
#include <stdexcept>
#include <string>
#include <vector>

#include "p2p.hpp"

namespace {

constexpr const char* kUsage =
    "usage: braid-bench MODE [options]\n"
    "modes:\n"
    "  p2p   8-byte latency and 4 MiB bandwidth between two processes, beside ucx_perftest\n"
    "        options: --json --no-peers --latency-iters N --bandwidth-iters N --window N\n";

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || std::string(argv[1]) == "--help" || std::string(argv[1]) == "-h") {
    std::cerr << kUsage;
    return argc < 2 ? 2 : 0;
  }
  const std::string mode = argv[1];
  const std::vector<std::string> args(argv + 2, argv + argc);
  try {
    if (mode == "p2p") return braid::bench::run_p2p(args);
    std::cerr << "braid-bench: unknown mode '" << mode << "'\n" << kUsage;
    return 2;
  } catch (const std::invalid_argument& e) {
    std::cerr << "braid-bench " << mode << ": " << e.what() << "\n" << kUsage;
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "braid-bench " << mode << ": " << e.what() << "\n";
    return 1;
  }
}
