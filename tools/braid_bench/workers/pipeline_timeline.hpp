// What braid-bench's pipeline worker reads from its job's timeline (the ranks' traces,
// gathered to rank 0 on its clock): each rank's bubble per step as the simulator defines
// it, the median duration of each compute action, and the data-parallel reduction's
// exposed time.
//
// Bubble (pipeline_simulator.hpp's definition, so the two compare): a step of one pipeline
// runs from the first compute action any of its ranks begins to the last one any ends; a
// rank's bubble is the part of that window its F, B, I and W spans do not cover. A rank's
// k-th step is its k-th run of n spans, n = its spans / steps (every step runs the same
// list). braid-trace's own bubble (summary.hpp) takes each rank's first to last pipeline
// span over the whole trace instead: the time between steps counts, and a rank that starts
// late has a shorter window.
//
// Waiting inside a backward. With DDP, a stage's last backward reduces its gradients and
// waits for the reduction before it returns, inside the executor's compute span: from the
// last bucket's launch (every gradient is ready) to the write-back of the reduced
// gradients the rank only waits. That window is taken out of compute here, for the bubble
// and for the exposed time; braid-trace counts it as compute, so its exposed figure (also
// reported, as summary-style exposed) misses the wait.
//
// Cost: linear in the events, plus sorting each rank's compute spans.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <braid/trace/timeline.hpp>

namespace braid::bench {

struct PipelineTimelineFigures {
  std::vector<double> rank_bubble_percent;  // per rank, the mean over steps
  double mean_bubble_percent = 0;           // over ranks
  double pipeline_ms = 0;                   // the median step window, slowest pipeline
  std::map<std::string, double> action_ms;  // "F", "B", "I", "W": median span duration
  // Per step, the mean over ranks: the data-parallel communicator's comm spans, the part of
  // them no compute covers (the waits above taken out of compute), and the part no compute
  // span covers (braid-trace's definition).
  double dp_comm_ms = 0;
  double dp_exposed_ms = 0;
  double dp_exposed_summary_ms = 0;
};

// `pipeline_of[r]`: which pipeline (data-parallel replica) rank r belongs to;
// `dp_comm_of[r]`: the id of rank r's data-parallel communicator; `steps`: the timed steps
// the timeline holds. Throws std::runtime_error where a rank's compute spans do not divide
// into `steps` equal runs.
PipelineTimelineFigures pipeline_timeline_figures(const trace::Timeline& timeline,
                                                  const std::vector<int>& pipeline_of,
                                                  const std::vector<std::uint32_t>& dp_comm_of,
                                                  int steps);

}  // namespace braid::bench
