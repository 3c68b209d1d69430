#include "pipeline_timeline.hpp"

#include <algorithm>
#include <limits>
#include <stdexcept>
#include <utility>

#include <fmt/format.h>

#include <braid/trace/pipeline_bubble.hpp>
#include <braid/trace/summary.hpp>

#include "../harness/results.hpp"

namespace braid::bench {
namespace {

using trace::Interval;

// The comm spans of communicator `id` on the rank, merged.
std::vector<Interval> communicator_spans(const trace::RankTimeline& rank, std::uint32_t id) {
  const std::string text = std::to_string(id);
  std::vector<Interval> spans;
  for (const trace::TimelineEvent& event : rank.events) {
    if (!event.instant && event.category == "comm" && event.arg("comm") == text) {
      spans.push_back({event.begin_ns, event.end_ns});
    }
  }
  return trace::union_of(std::move(spans));
}

// The length of `merged` outside `waits` (both merged).
double busy_ns(const std::vector<Interval>& merged, const std::vector<Interval>& waits) {
  return static_cast<double>(trace::total_length(trace::difference_of(merged, waits)));
}

}  // namespace

PipelineTimelineFigures pipeline_timeline_figures(const trace::Timeline& timeline,
                                                  const std::vector<int>& pipeline_of,
                                                  const std::vector<std::uint32_t>& dp_comm_of,
                                                  int steps) {
  const std::size_t ranks = timeline.ranks.size();
  if (ranks == 0 || pipeline_of.size() != ranks || dp_comm_of.size() != ranks || steps < 1) {
    throw std::invalid_argument(
        "pipeline_timeline_figures: one pipeline and communicator per rank");
  }
  PipelineTimelineFigures out;
  std::map<std::string, std::vector<double>> durations;
  // Per rank: each step's compute spans (merged), and the waits inside backwards.
  std::vector<std::vector<std::vector<Interval>>> step_spans(ranks);
  std::vector<std::vector<Interval>> waits(ranks);
  for (std::size_t r = 0; r < ranks; ++r) {
    const trace::RankTimeline& rank = timeline.ranks[r];
    std::vector<Interval> spans;
    for (const trace::TimelineEvent& event : rank.events) {
      if (!trace::is_pipeline_compute(event)) continue;
      spans.push_back({event.begin_ns, event.end_ns});
      durations[event.name].push_back(static_cast<double>(event.duration_ns()) / 1e6);
    }
    if (spans.empty() || spans.size() % static_cast<std::size_t>(steps) != 0) {
      throw std::runtime_error(fmt::format(
          "rank {} traced {} compute actions, not a multiple of its {} steps (a full trace "
          "buffer?)",
          r, spans.size(), steps));
    }
    std::sort(spans.begin(), spans.end(),
              [](const Interval& a, const Interval& b) { return a.begin < b.begin; });
    const std::size_t per_step = spans.size() / static_cast<std::size_t>(steps);
    for (int k = 0; k < steps; ++k) {
      const auto from = spans.begin() + static_cast<std::ptrdiff_t>(k * per_step);
      step_spans[r].push_back(
          trace::union_of({from, from + static_cast<std::ptrdiff_t>(per_step)}));
    }
    waits[r] = trace::reduction_waits(rank);

    const std::vector<Interval> dp = communicator_spans(rank, dp_comm_of[r]);
    const std::vector<Interval> covered =
        trace::intersection_of(dp, trace::intervals_of(rank, "compute"));
    const double communication = static_cast<double>(trace::total_length(dp));
    out.dp_comm_ms += communication;
    out.dp_exposed_summary_ms += communication - static_cast<double>(trace::total_length(covered));
    out.dp_exposed_ms += communication - busy_ns(covered, waits[r]);
  }
  const double per_rank_step_ms = 1e6 * static_cast<double>(ranks) * steps;
  out.dp_comm_ms /= per_rank_step_ms;
  out.dp_exposed_ms /= per_rank_step_ms;
  out.dp_exposed_summary_ms /= per_rank_step_ms;
  for (auto& [name, values] : durations) out.action_ms[name] = median(values);

  const int pipelines = *std::max_element(pipeline_of.begin(), pipeline_of.end()) + 1;
  out.rank_bubble_percent.assign(ranks, 0.0);
  std::vector<double> windows_ms;
  for (int k = 0; k < steps; ++k) {
    double slowest = 0;
    for (int pipeline = 0; pipeline < pipelines; ++pipeline) {
      std::int64_t begin = std::numeric_limits<std::int64_t>::max();
      std::int64_t end = std::numeric_limits<std::int64_t>::min();
      for (std::size_t r = 0; r < ranks; ++r) {
        if (pipeline_of[r] != pipeline) continue;
        begin = std::min(begin, step_spans[r][k].front().begin);
        end = std::max(end, step_spans[r][k].back().end);
      }
      if (end <= begin) continue;
      const double window = static_cast<double>(end - begin);
      for (std::size_t r = 0; r < ranks; ++r) {
        if (pipeline_of[r] != pipeline) continue;
        out.rank_bubble_percent[r] +=
            trace::bubble_percent(busy_ns(step_spans[r][k], waits[r]), window);
      }
      slowest = std::max(slowest, window / 1e6);
    }
    windows_ms.push_back(slowest);
  }
  for (double& bubble : out.rank_bubble_percent) bubble /= steps;
  for (const double bubble : out.rank_bubble_percent) out.mean_bubble_percent += bubble;
  out.mean_bubble_percent /= static_cast<double>(ranks);
  out.pipeline_ms = median(windows_ms);
  return out;
}

}  // namespace braid::bench
