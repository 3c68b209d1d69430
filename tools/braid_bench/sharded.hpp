// braid-bench sharded: the main job's model trained under DDP, DDP with
// ZeroRedundancyOptimizer (ZeRO-1) and FullyShardedDataParallel's SHARD_GRAD_OP (ZeRO-2),
// FULL_SHARD (ZeRO-3) and NO_SHARD, on 2 and 4 ranks, runners taking turns: step time, exposed
// and traced communication, the model state per rank the ZeRO formulas estimate beside what
// the ranks held, and the peak resident size.
#pragma once

#include <string>
#include <vector>

namespace braid::bench {

// Entry point for `braid-bench sharded ...`; returns the process exit code.
int run_sharded(const std::vector<std::string>& args);

}  // namespace braid::bench
