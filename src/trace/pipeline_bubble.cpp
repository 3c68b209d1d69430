#include <algorithm>
#include <utility>

#include <braid/trace/pipeline_bubble.hpp>

namespace braid::trace {

double bubble_percent(double computing, double window) {
  if (!(window > 0)) return 0;
  return 100 * (window - computing) / window;
}

double bubble_percent(const std::vector<Interval>& computing, Interval window) {
  const std::vector<Interval> inside = intersection_of(computing, {window});
  return bubble_percent(static_cast<double>(total_length(inside)),
                        static_cast<double>(window.end - window.begin));
}

bool is_pipeline_compute(const TimelineEvent& event) {
  return !event.instant && event.category == "pipeline" &&
         (event.name == "F" || event.name == "B" || event.name == "I" || event.name == "W");
}

std::vector<Interval> pipeline_compute_spans(const RankTimeline& rank) {
  std::vector<Interval> spans;
  for (const TimelineEvent& event : rank.events) {
    if (is_pipeline_compute(event)) spans.push_back({event.begin_ns, event.end_ns});
  }
  return union_of(std::move(spans));
}

std::vector<Interval> reduction_waits(const RankTimeline& rank) {
  std::vector<Interval> waits;
  std::int64_t launched = -1;                       // none since the last write-back
  for (const TimelineEvent& event : rank.events) {  // by begin time
    if (event.category != "bucket") continue;
    if (event.instant && event.name == "bucket.launched") {
      launched = event.begin_ns;
    } else if (!event.instant && event.name == "bucket.write_back" && launched >= 0) {
      waits.push_back({launched, event.begin_ns});
      launched = -1;
    }
  }
  return union_of(std::move(waits));
}

std::vector<Interval> difference_of(const std::vector<Interval>& intervals,
                                    const std::vector<Interval>& removed) {
  std::vector<Interval> out;
  auto cut = removed.begin();
  for (Interval piece : intervals) {
    while (cut != removed.end() && cut->end <= piece.begin) ++cut;
    for (auto next = cut; next != removed.end() && next->begin < piece.end; ++next) {
      if (next->begin > piece.begin) out.push_back({piece.begin, next->begin});
      piece.begin = std::max(piece.begin, next->end);
    }
    if (piece.begin < piece.end) out.push_back(piece);
  }
  return out;
}

}  // namespace braid::trace
