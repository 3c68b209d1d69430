// braid-bench compute-tax: what a braid process costs a training step it does not
// synchronise. The same step (the main job's models, SGD and Adam, one fixed batch, one
// intra-op thread) is timed in a plain libtorch C++ program with no braid linked, in a braid
// process (Runtime, World, DistributedDataParallel, every step under no_sync()) and in Python
// PyTorch, taking turns, with each runner's minor page faults per step; the ratio is braid's
// step time over the fastest of the three (goal: at most 1.03).
#pragma once

#include <string>
#include <vector>

namespace braid::bench {

// Entry point for `braid-bench compute-tax ...`; returns the process exit code.
int run_compute_tax(const std::vector<std::string>& args);

}  // namespace braid::bench
