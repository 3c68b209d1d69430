// The pipeline bubble, defined once: the simulator (parallel/pipeline_simulator.hpp),
// `braid-trace summary` and `braid-bench pipeline` all call these.
//
// A rank's bubble is the percentage of a window of its pipeline's time in which it computes
// none of its actions. The window runs from the first compute action (F, B, I, W) starting
// on any rank of the pipeline to the last one ending, so a stage that waits for its first
// input (the fill) or for the last gradients (the drain) is in its bubble, as the textbook
// formula (p-1)/(m+p-1) counts it. Computing is the compute actions' time less the part
// a reducing backward spends waiting for its data-parallel reduction (from the last bucket
// launched to the write-back): that wait is communication, not compute.
#pragma once

#include <vector>

#include <braid/trace/summary.hpp>
#include <braid/trace/timeline.hpp>

namespace braid::trace {

// 100 * (window - computing) / window; 0 for an empty window.
double bubble_percent(double computing, double window);
// The same, from the rank's computing intervals (merged; parts outside the window do not
// count).
double bubble_percent(const std::vector<Interval>& computing, Interval window);

// Whether a timeline event is a compute action of a pipeline (F, B, I or W).
bool is_pipeline_compute(const TimelineEvent& event);
// The rank's compute actions, merged.
std::vector<Interval> pipeline_compute_spans(const RankTimeline& rank);
// Where the rank waited for its data-parallel reduction inside a backward: from the last
// "bucket.launched" before each "bucket.write_back" to the write-back's begin, merged.
std::vector<Interval> reduction_waits(const RankTimeline& rank);
// `intervals` (merged) less `removed` (merged): a rank's computing is
// difference_of(pipeline_compute_spans(), reduction_waits()).
std::vector<Interval> difference_of(const std::vector<Interval>& intervals,
                                    const std::vector<Interval>& removed);

}  // namespace braid::trace
