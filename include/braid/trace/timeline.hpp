// A job's timeline as the analysis sees it: for every rank, its events on one time base
// (the reference rank's clock, nanoseconds from the earliest event of the job). Built
// from trace files by braid-trace (tools/braid_trace) or from this process's own
// snapshot; summary.hpp computes overlap and latencies from it.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <braid/trace/chrome_trace.hpp>
#include <braid/trace/recorder.hpp>

namespace braid::trace {

struct TimelineEvent {
  std::string name;
  std::string category;  // "compute", "comm", ... (to_string(Category)) or a foreign one
  std::uint32_t track = 0;
  std::int64_t begin_ns = 0;
  std::int64_t end_ns = 0;  // == begin_ns for instants and counters
  std::uint64_t bytes = 0;
  bool instant = false;  // an instant or a counter sample, not a span
  // Arguments other than bytes, as text ("seq" -> "12", "algorithm" -> "ring").
  std::vector<std::pair<std::string, std::string>> args;

  std::int64_t duration_ns() const noexcept { return end_ns - begin_ns; }
  std::optional<std::string> arg(std::string_view key) const;
};

struct RankTimeline {
  int rank = 0;
  std::string host;
  ClockAlignment clock;
  std::map<std::uint32_t, std::string> track_names;
  std::vector<TimelineEvent> events;  // by begin time
  // Oldest records the rank overwrote to stay within BRAID_TRACE_BUFFER_MB: its figures
  // cover only what came after.
  std::uint64_t overwritten_records = 0;
};

struct Timeline {
  int world_size = 0;
  std::vector<RankTimeline> ranks;  // by rank
};

// One rank's timeline from a snapshot of this process (times from the earliest record).
RankTimeline rank_timeline(const Snapshot& snapshot, const TraceIdentity& identity);

}  // namespace braid::trace
