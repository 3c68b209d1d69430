// What lower() and validate() share (pipeline_schedule.hpp): the schedule's Error with its
// grid, the structural checks both run before anything else, and the compute dependencies
// between stages.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <braid/parallel/pipeline_schedule.hpp>

namespace braid::parallel::detail {

// Error(invalid_argument) for "pipeline schedule": `detail`, then the grid with `marked`.
[[noreturn]] void throw_schedule_error(const Schedule& schedule, const std::string& detail,
                                       const std::vector<std::pair<int, int>>& marked = {});

// Refuses what no ordering can fix, naming the first offending action: counts and sizes
// out of range, an action on a rank that does not hold its stage, a stage on no rank, a
// (stage, microbatch) without exactly one F and one backward (B, or I and W), a backward
// before its F or a W before its I, a REDUCE_GRAD twice or before the stage's last
// backward. Transfers are counted by validate(), not here.
void check_structure(const Schedule& schedule);

// A compute action's completion as another stage sees it: stage `stage`'s output of
// `microbatch` (its F) or the gradient of its input (its B or I).
struct StageOutput {
  int stage = 0;
  bool gradient = false;
  int microbatch = 0;
  friend bool operator==(const StageOutput&, const StageOutput&) = default;
};
// What `action` hands to a neighbouring stage: F its output, B and I its input's gradient.
std::optional<StageOutput> output_of(const Action& action);
// What `action` needs from a neighbouring stage: the previous stage's output for an F of
// stage s > 0, the next stage's input gradient for a B or I of stage s < S-1.
std::optional<StageOutput> input_of(const Schedule& schedule, const Action& action);

}  // namespace braid::parallel::detail
