// braid-bench p2p: point-to-point latency and bandwidth between two processes, beside
// ucx_perftest measured in the same run.
#pragma once

#include <string>
#include <vector>

namespace braid::bench {

// Entry point for `braid-bench p2p ...`; returns the process exit code.
int run_p2p(const std::vector<std::string>& args);

}  // namespace braid::bench
