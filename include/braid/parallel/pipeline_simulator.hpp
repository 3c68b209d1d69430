// A discrete-event simulation of a pipeline schedule (pipeline_schedule.hpp): each rank runs
// its actions in order, a compute action when its inputs have arrived, a transfer after its
// send with a latency and a bandwidth; what comes out is the step time, each rank's bubble
// and its peak activations, before anything runs. With unit costs its bubble is the
// textbook one on every rank, not only on average: (p-1)/(m+p-1) for GPipe and 1F1B (each
// rank idles (p-1)(F+B) of a step of (m+p-1)(F+B)), (p-1)/(v m + p-1) for interleaved 1F1B
// with per-chunk costs.
//
// The rules. A rank runs one action at a time: a compute action (F, B, I, W) when it is
// free and its inputs are there, REDUCE_GRAD for its cost. In a lowered schedule a RECV
// blocks its rank until max(rank free, its SEND's time + latency + bytes / bandwidth), and a
// SEND takes no rank time (it completes in the background). In a compute schedule the
// inputs are the producing stage's action (F of stage s-1 for F of s, B or I of stage s+1
// for B or I of s, I of the stage for W), plus the transfer where that stage is on another
// rank. Cost: O(actions x passes), the passes a few times the stage count.
//
//   auto schedule = braid::parallel::lower(braid::parallel::one_f_one_b(4, 8));
//   auto result = braid::parallel::simulate(schedule, braid::parallel::SimulationCosts{});
//   std::cout << result.step_time << " " << result.bubble_percent[0] << "%\n";
//   std::ofstream("plan.json") << braid::parallel::chrome_trace_json(schedule, result);
//
// Costs (durations) come in three ways: unit (F 1, B 2, I 1, W 1, transfers free; the
// default), given per kind, or measured from a braid trace of a real run (braid-plan
// --costs-from TRACE: the median duration of each compute kind's spans in category
// "pipeline", which the executor names by the action's text, "1F3", or by its kind, "F").
//
// Bubble of a rank: the time in [0, step end) its compute actions do not cover, over the
// step time; the step ends when the last rank's last action does. Waiting in a RECV and
// REDUCE_GRAD count as bubble.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
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
  double p2p_bytes = 0;                // per activation or gradient
  double p2p_bytes_per_unit = 0;       // bandwidth; 0: transfers take only the latency
  double reduce_grad = 0;              // REDUCE_GRAD's duration
  std::uint64_t activation_bytes = 0;  // per stage and microbatch, for the peak memory
};

struct SimulatedAction {
  int rank = 0;
  Action action;
  double begin = 0;
  double end = 0;
};

struct SimulationResult {
  double step_time = 0;                              // the last action's end
  std::vector<double> busy;                          // per rank: compute time
  std::vector<double> bubble_percent;                // per rank
  std::vector<int> peak_in_flight;                   // per rank (peak_in_flight())
  std::vector<std::uint64_t> peak_activation_bytes;  // per rank
  std::vector<SimulatedAction> actions;  // every action with its times, by rank then order
  // The mean over ranks of bubble_percent.
  double mean_bubble_percent() const;
};

// Throws Error(invalid_argument) for a schedule validate() refuses, or a cost that is
// negative or not finite.
SimulationResult simulate(const Schedule& schedule, const SimulationCosts& costs = {});

// The textbook bubble fraction, in percent: (p-1)/(m+p-1) for GPipe and 1F1B (and ZB-H1's
// 1F1B bound), (p-1)/(v m + p-1) for interleaved.
double textbook_bubble_percent(int ranks, int microbatches, int virtual_stages = 1);

// The textbook bubble of `schedule`'s kind, from its shape: where its backward is split
// into I and W (ZB-H1), (p-1)/(3m + p-1), its unit-cost figure with F, I and W one unit
// each (p-1 idle units a rank beside 3m of work); otherwise textbook_bubble_percent's with
// v = stages / ranks. With the formula, as text, for tables.
struct TextbookBubble {
  double percent = 0;
  std::string_view formula;  // "(p-1)/(m+p-1)", "(p-1)/(v m+p-1)" or "(p-1)/(3m+p-1)"
};
TextbookBubble textbook_bubble(const Schedule& schedule);

// The simulated run as a Chrome trace (Perfetto, chrome://tracing): one process per rank
// (named by process_name metadata), a complete ("X") span per action named by its text,
// category "pipeline", compute on thread 0 and transfers on thread 1. One unit of the costs
// is one microsecond of the trace (braid-plan gives measured costs in microseconds).
std::string chrome_trace_json(const Schedule& schedule, const SimulationResult& result);

}  // namespace braid::parallel
