// braid-bench torch-backend: the same PyTorch program on the torch.distributed backends
// "gloo" and "braid" (the braid_torch module), one run: DistributedDataParallel's step time
// and exposed communication, then all_reduce's time from Python per message size. The
// program is tools/braid-torch-bench, run with a python3 that has torch and the build's
// braid_torch module on its path.
#pragma once

#include <string>
#include <vector>

namespace braid::bench {

// Entry point for `braid-bench torch-backend ...`; returns the process exit code.
int run_torch_backend(const std::vector<std::string>& args);

}  // namespace braid::bench
