// The timed loop every braid-bench worker runs its training step in: untimed warm-up
// steps, then timed steps that start together (a barrier left out of the trace), so a
// step's time on its slowest rank is what the job waited for; then the ranks' trace
// records of the timed steps, gathered to rank 0 on its clock, from which the workers take
// braid-trace's exposed communication.
//
// Cost: a barrier per timed step (outside the time), one all-reduce of the step times and
// one gather of the timeline after the loop.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <vector>

#include <braid/braid.hpp>

#include "../harness/results.hpp"
#include "braid_models/training_checks.hpp"

namespace braid::bench {

struct TimedSteps {
  std::vector<double> ms;                   // each timed step's time on its slowest rank
  std::vector<double> own_ms;               // ... on this rank
  std::optional<trace::Timeline> timeline;  // rank 0: every rank's records of the timed steps

  double median_ms() const { return median(ms); }
  // A job figure of the timeline (`ns` over all ranks and timed steps) per rank and step.
  double per_rank_step_ms(std::int64_t ns, int ranks) const {
    return static_cast<double>(ns) / 1e6 / ranks / static_cast<double>(ms.size());
  }
};

// `step(i)` for i in [0, steps), the steps from `warmup` on timed; the timeline covers the
// steps from `traced_from` (by default the first timed one) to the last.
template <class Step>
TimedSteps time_steps(transport::World& world, collectives::Communicator& comm, int steps,
                      int warmup, Step&& step, std::optional<int> traced_from = std::nullopt) {
  TimedSteps timed;
  std::int64_t from_ns = 0;
  for (int i = 0; i < steps; ++i) {
    if (i >= warmup) {
      trace::set_enabled(false);
      comm.launch(comm.barrier()).get();
      trace::set_enabled(true);
    }
    if (i == traced_from.value_or(warmup)) from_ns = trace::now_ns();
    const auto started = std::chrono::steady_clock::now();
    step(i);
    const std::chrono::duration<double, std::milli> took =
        std::chrono::steady_clock::now() - started;
    if (i >= warmup) timed.own_ms.push_back(took.count());
  }
  trace::set_enabled(false);
  const std::int64_t to_ns = trace::now_ns();
  timed.ms = timed.own_ms;
  comm.launch(comm.all_reduce(Buffer(timed.ms), ReduceOp::max)).get();
  timed.timeline = example_models::gather_steps_timeline(world, comm, from_ns, to_ns);
  return timed;
}

}  // namespace braid::bench
