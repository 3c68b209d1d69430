// A discrete-event simulation of a pipeline schedule (pipeline_schedule.hpp): each rank runs
// its actions in order, a compute action when its inputs have arrived, a transfer after its
// send with a latency and a bandwidth; what comes out is the step time, each rank's bubble
// and its peak activations, before anything runs. With unit costs its bubble is the
// textbook one: (p-1)/(m+p-1) for GPipe and 1F1B, (p-1)/(v m + p-1) for interleaved 1F1B.
//
//   auto schedule = braid::parallel::lower(braid::parallel::one_f_one_b(4, 8));
//   auto result = braid::parallel::simulate(schedule, braid::parallel::SimulationCosts{});
//   std::cout << result.step_ns << " " << result.bubble_percent[0] << "%\n";
//   std::ofstream("plan.json") << braid::parallel::chrome_trace_json(schedule, result);
//
// Costs (durations) come in three ways: unit (F 1, B 2, I 1, W 1, transfers free; the
// default), given per kind, or measured from a braid trace of a real run (braid-plan
// --costs-from TRACE: the median duration of each action kind's pipeline spans, which the
// executor names "F", "B", "I", "W").
//
// Bubble of a rank: the time in [0, step end) its compute actions do not cover, over the
// step time; the step ends when the last rank's last action does.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <braid/parallel/pipeline_schedule.hpp>

namespace braid::parallel {

struct SimulationCosts {
  // Compute durations, in arbitrary units (ns when measured).
  double forward = 1;
  double backward = 2;
  double backward_input = 1;
  double backward_weight = 1;
  // A transfer between ranks: latency + bytes / bandwidth after its send.
  double p2p_latency = 0;
  double p2p_bytes = 0;             // per activation or gradient
  double p2p_bytes_per_unit = 0;    // bandwidth; 0: transfers take only the latency
  double reduce_grad = 0;           // REDUCE_GRAD's duration
  std::uint64_t activation_bytes = 0;  // per stage and microbatch, for the peak memory
};

struct SimulatedAction {
  int rank = 0;
  Action action;
  double begin = 0;
  double end = 0;
};

struct SimulationResult {
  double step_time = 0;                 // the last action's end
  std::vector<double> busy;             // per rank: compute time
  std::vector<double> bubble_percent;   // per rank
  std::vector<int> peak_in_flight;      // per rank (peak_in_flight())
  std::vector<std::uint64_t> peak_activation_bytes;  // per rank
  std::vector<SimulatedAction> actions;  // every action with its times, by rank then order
  // The mean over ranks of bubble_percent.
  double mean_bubble_percent() const;
};

// Throws Error(invalid_argument) for a schedule validate() refuses.
SimulationResult simulate(const Schedule& schedule, const SimulationCosts& costs = {});

// The textbook bubble fraction, in percent: (p-1)/(m+p-1) for GPipe and 1F1B (and ZB-H1's
// 1F1B bound), (p-1)/(v m + p-1) for interleaved.
double textbook_bubble_percent(int ranks, int microbatches, int virtual_stages = 1);

// The simulated run as a Chrome trace (Perfetto, chrome://tracing): one process per rank,
// a span per action, in microseconds where costs were ns, else one unit = 1 us.
std::string chrome_trace_json(const Schedule& schedule, const SimulationResult& result);

}  // namespace braid::parallel
