// braid-bench collectives: an nccl-tests-like table for every collective, braid beside
// OpenMPI (mpirun) and torch.distributed with Gloo, measured in the same run.
#pragma once

#include <string>
#include <vector>

namespace braid::bench {

// Entry point for `braid-bench collectives ...`; returns the process exit code.
int run_collectives(const std::vector<std::string>& args);

}  // namespace braid::bench
