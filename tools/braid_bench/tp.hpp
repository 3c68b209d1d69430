// braid-bench tp: tensor-parallel transformer blocks (ParallelTransformerBlock) trained
// forward and backward at TP 1 and at TP 2 (two ranks), TP 2 again with ColumnParallelLinear's
// backward overlap off (and with sequence parallelism, on request), beside the same blocks
// in PyTorch over Gloo (Megatron-style mappings), runners taking turns: step time, exposed
// TP communication, and the speed-up against TP 1 beside the ideal.
#pragma once

#include <string>
#include <vector>

namespace braid::bench {

// Entry point for `braid-bench tp ...`; returns the process exit code.
int run_tp(const std::vector<std::string>& args);

}  // namespace braid::bench
