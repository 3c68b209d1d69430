// braid-bench ddp: one model and batch trained three ways in one run -- braid's
// DistributedDataParallel (the main job's loop, braid-bench-ddp-worker), PyTorch DDP with Gloo
// (peers/ddp_torch.py, /usr/bin/python3) and no gradient sync at all -- with step times, the
// communication each DDP leaves exposed (its step time minus the no-sync step time), the bare
// all-reduce of all gradients, and braid's ratios to PyTorch.
#pragma once

#include <string>
#include <vector>

namespace braid::bench {

// Entry point for `braid-bench ddp ...`; returns the process exit code.
int run_ddp(const std::vector<std::string>& args);

}  // namespace braid::bench
