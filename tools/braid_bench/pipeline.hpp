// braid-bench pipeline: the 3D job's model (examples/gpt_stage.hpp) on four ranks as a
// 4-stage pipeline and as 2 stages x 2 data-parallel replicas, under each schedule (GPipe,
// 1F1B, interleaved 1F1B with two stages per rank, ZB-H1), runners taking turns: the
// measured step time and bubble beside the simulator's (braid::parallel::simulate with the
// compute costs the run measured) and the textbook formula, and for the data-parallel
// layouts the reduction's exposed time with the executor's overlap (reduced in each stage's
// last backward) and without (one all-reduce after the step's last action).
#pragma once

#include <string>
#include <vector>

namespace braid::bench {

// Entry point for `braid-bench pipeline ...`; returns the process exit code.
int run_pipeline(const std::vector<std::string>& args);

}  // namespace braid::bench
