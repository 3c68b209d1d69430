// What a timeline says about overlap, per rank and for the job. Definitions (those of
// PyTorch's Holistic Trace Analysis, so the numbers compare):
//
//   compute        the union of a rank's compute spans (every track), in time
//   communication  the union of its comm spans (collectives and point-to-point as the
//                  user called them; transport and step spans nest inside and add nothing)
//   overlap        the time both run; overlap % = overlap / communication
//   exposed        communication - overlap: the time communication ran with no compute,
//                  what a step pays for it
//   off-core       the time compute spans' threads spent without their core (argument
//                  off_core_ns, compute_span.hpp; a span nested in another on the same
//                  track counts once, one that only begins inside another counts whole):
//                  where communication takes the core the compute needs, overlap counts
//                  it as hidden, and this is at most what it cost the compute (waits of
//                  any kind count too); meant for one compute thread per track
//
// The job's figures add the ranks' times up, so its overlap % weighs ranks by their
// communication time. A sampled comm span (argument "sampled" = n, sampling.hpp) stands
// for n calls: it counts n times in count, bytes and total time, and the n - 1 calls not
// recorded add its length, and its overlap with compute, n - 1 more times to the
// communication and overlap figures (when they ran is unknown, so they are not united
// with the others; so communication can exceed wall time). Percentiles weigh each
// recorded call by the calls it stands for. Per collective (a comm span's name): count,
// bytes, latency percentiles. Per bucket (bucket spans with a "bucket" argument):
// ready-to-reduced latency. Per rank with pipeline spans: bubble % = idle time between its
// first and last pipeline span / that window.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <braid/trace/timeline.hpp>

namespace braid::trace {

struct LatencyStats {
  std::size_t count = 0;     // calls, counting each sampled span as the calls it stands for
  std::size_t recorded = 0;  // spans in the trace; below count where calls were sampled
  std::uint64_t bytes = 0;   // all occurrences together
  std::int64_t total_ns = 0;
  std::int64_t p50_ns = 0;
  std::int64_t p90_ns = 0;
  std::int64_t p99_ns = 0;
  std::int64_t max_ns = 0;

  // Whether count, bytes and percentiles are estimates from sampled spans.
  bool sampled() const noexcept { return recorded < count; }
};

// The count as the tables print it: "~" before an estimate.
std::string count_text(const LatencyStats& stats);
// What "~" means, for a table with a sampled row.
inline constexpr std::string_view kSampledNote =
    "~: small calls were recorded one in BRAID_TRACE_SAMPLE_EVERY; count, bytes and "
    "percentiles weigh each recorded one by the calls it stands for (estimates)";

struct OverlapFigures {
  std::int64_t wall_ns = 0;  // first event's begin to last event's end
  std::int64_t compute_ns = 0;
  std::int64_t communication_ns = 0;
  std::int64_t overlap_ns = 0;
  std::int64_t exposed_ns = 0;
  // Where compute spans carry off_core_ns (ComputeSpan, ComputeRegion, DDP's spans).
  std::optional<std::int64_t> compute_off_core_ns;
  // overlap / communication, in percent; nullopt without communication.
  std::optional<double> overlap_percent() const;
};

struct RankSummary {
  int rank = -1;  // -1: the whole job
  OverlapFigures figures;
  std::map<std::string, LatencyStats> collectives;  // by span name
  std::map<std::int64_t, LatencyStats> buckets;     // by bucket index
  std::optional<double> bubble_percent;             // with pipeline spans only
  std::uint64_t overwritten_records = 0;            // RankTimeline::overwritten_records
};

struct Summary {
  int world_size = 0;
  std::vector<RankSummary> ranks;
  RankSummary job;
};

// Intervals [begin, end) in nanoseconds.
struct Interval {
  std::int64_t begin = 0;
  std::int64_t end = 0;
  friend bool operator==(const Interval&, const Interval&) = default;
};

// Sorted, disjoint, merged. The building blocks of the figures, public for the HTML
// timeline (which draws the hidden part of communication) and for tests.
std::vector<Interval> union_of(std::vector<Interval> intervals);
std::vector<Interval> intersection_of(const std::vector<Interval>& a,
                                      const std::vector<Interval>& b);
std::int64_t total_length(const std::vector<Interval>& merged);
// A rank's intervals of one category (merged).
std::vector<Interval> intervals_of(const RankTimeline& rank, std::string_view category);

Summary summarize(const Timeline& timeline);

// Adds one rank's figures to the job's, as summarize() does: wall time the longest, the
// rest summed (off-core where the rank has it). For figures gathered from ranks by other
// means (a training loop's own all-gather).
void add_rank_figures(OverlapFigures& job, const OverlapFigures& rank);

// Human-readable tables; the JSON form is one object with "ranks" and "job".
std::string format_text(const Summary& summary);
std::string format_json(const Summary& summary);

}  // namespace braid::trace
