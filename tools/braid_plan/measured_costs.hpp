// Costs measured in a real run, for braid-plan --costs-from: the median duration of each
// compute kind's spans on the "pipeline" track of a braid Chrome trace (what BRAID_TRACE
// writes, a directory of them, or `braid-trace merge`'s output). The executor names a span
// by its action's text ("1F3"); a span named by its kind alone ("F") counts too.
//
// The median, not the mean, so one slow microbatch (a first step's allocations, another
// process taking the core) does not move the plan. Times come back in microseconds, the
// unit of the simulator's Chrome trace.
#pragma once

#include <array>
#include <cstddef>
#include <filesystem>

#include <braid/parallel/pipeline_simulator.hpp>

namespace braid::tools::plan {

struct MeasuredCosts {
  parallel::SimulationCosts costs;     // forward, backward, backward_input, backward_weight set
  std::array<std::size_t, 4> spans{};  // how many F, B, I, W spans each median came from
};

// A kind with no spans is derived where the others allow it: B as I + W, I and W as half
// of B each. Throws TraceInputError (trace_set.hpp) for a file braid-trace would refuse,
// and for a trace with no F spans or with neither B nor both I and W.
MeasuredCosts measured_costs(const std::filesystem::path& trace);

}  // namespace braid::tools::plan
