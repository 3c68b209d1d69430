#include <algorithm>
#include <cmath>
#include <iterator>
#include <limits>

#include <fmt/format.h>

#include <braid/core/json_text.hpp>
#include <braid/trace/pipeline_bubble.hpp>
#include <braid/trace/summary.hpp>

#include "trace/arrival_skew.hpp"
#include "trace/event_args.hpp"

namespace braid::trace {
namespace {

using detail::integer_arg;
using detail::weight_of;

// A recorded duration and how many calls it stands for (a sampled span's "sampled").
struct WeightedDuration {
  std::int64_t ns = 0;
  std::int64_t weight = 1;
};

// Nearest-rank percentile of durations sorted by length, each counted `weight` times: a
// sampled span stands for its calls here too, so a name whose calls were sampled at one
// size and recorded whole at another is not read as mostly the whole ones.
std::int64_t percentile(const std::vector<WeightedDuration>& sorted, std::int64_t count, double p) {
  if (sorted.empty()) return 0;
  const auto rank =
      static_cast<std::int64_t>(std::max(1.0, std::ceil(p / 100.0 * static_cast<double>(count))));
  std::int64_t seen = 0;
  for (const WeightedDuration& d : sorted) {
    seen += d.weight;
    if (seen >= rank) return d.ns;
  }
  return sorted.back().ns;
}

struct Samples {
  std::vector<WeightedDuration> durations;
  std::int64_t count = 0;
  std::uint64_t bytes = 0;
  std::int64_t total_ns = 0;

  void add(const TimelineEvent& event) {
    const std::int64_t weight = weight_of(event);
    durations.push_back({event.duration_ns(), weight});
    count += weight;
    bytes += static_cast<std::uint64_t>(weight) * event.bytes;
    total_ns += weight * event.duration_ns();
  }
  LatencyStats stats() {
    std::sort(durations.begin(), durations.end(),
              [](const WeightedDuration& a, const WeightedDuration& b) { return a.ns < b.ns; });
    LatencyStats out;
    out.count = static_cast<std::size_t>(count);
    out.recorded = durations.size();
    out.bytes = bytes;
    out.total_ns = total_ns;
    out.p50_ns = percentile(durations, count, 50);
    out.p90_ns = percentile(durations, count, 90);
    out.p99_ns = percentile(durations, count, 99);
    out.max_ns = durations.empty() ? 0 : durations.back().ns;
    return out;
  }
};

// How much of [begin, end) the sorted, disjoint `merged` covers: a binary search and a
// walk over the intervals that meet it, so a trace of many sampled spans stays linear-ish.
std::int64_t covered_length(const std::vector<Interval>& merged, std::int64_t begin,
                            std::int64_t end) {
  auto it = std::upper_bound(merged.begin(), merged.end(), begin,
                             [](std::int64_t t, const Interval& i) { return t < i.end; });
  std::int64_t covered = 0;
  for (; it != merged.end() && it->begin < end; ++it) {
    covered += std::max<std::int64_t>(0, std::min(end, it->end) - std::max(begin, it->begin));
  }
  return covered;
}

// The part of a rank's waits outside its compute, per late rank (summary.hpp): time two
// waits share counts once, for the one that began first, as communication's union counts
// it once; the calls a sampled span stands for add its wait outside compute n - 1 times.
std::map<int, std::int64_t> exposed_waits(const std::vector<detail::ArrivalWait>& waits,
                                          const std::vector<Interval>& compute) {
  std::map<int, std::int64_t> waited_for;
  std::int64_t claimed_until = std::numeric_limits<std::int64_t>::min();  // waits by begin
  for (const detail::ArrivalWait& wait : waits) {
    const auto [begin, end] = wait.interval;
    std::int64_t exposed = (wait.weight - 1) * (end - begin - covered_length(compute, begin, end));
    const std::int64_t unclaimed = std::max(begin, claimed_until);
    if (unclaimed < end) {
      exposed += end - unclaimed - covered_length(compute, unclaimed, end);
      claimed_until = end;
    }
    if (exposed > 0) waited_for[wait.late_rank] += exposed;
  }
  return waited_for;
}

OverlapFigures figures_of(const RankTimeline& rank, const detail::RankArrivals& arrivals) {
  OverlapFigures figures;
  const auto compute = intervals_of(rank, "compute");
  const auto communication = intervals_of(rank, "comm");
  figures.compute_ns = total_length(compute);
  figures.communication_ns = total_length(communication);
  figures.overlap_ns = total_length(intersection_of(compute, communication));
  // The calls sampled spans stand for and the trace left out (summary.hpp).
  for (const TimelineEvent& event : rank.events) {
    if (event.instant || event.category != "comm") continue;
    const std::int64_t unrecorded = weight_of(event) - 1;
    if (unrecorded == 0) continue;
    figures.communication_ns += unrecorded * event.duration_ns();
    figures.overlap_ns += unrecorded * covered_length(compute, event.begin_ns, event.end_ns);
  }
  figures.exposed_ns = figures.communication_ns - figures.overlap_ns;
  figures.waited_for_ns = exposed_waits(arrivals.waits, compute);
  for (const auto& [late_rank, ns] : figures.waited_for_ns) figures.waiting_ns += ns;
  figures.matched_calls = arrivals.matched_calls;
  figures.late_calls = arrivals.late_calls;
  // Off-core time: events come by begin time, so a span that ends before the last counted
  // one on its track is nested in it, and its off-core time is already in that one's.
  std::map<std::uint32_t, std::int64_t> counted_until;
  for (const TimelineEvent& event : rank.events) {
    if (event.instant || event.category != "compute") continue;
    const std::optional<std::int64_t> off_core = integer_arg(event, "off_core_ns");
    if (!off_core || *off_core < 0) continue;  // none, or not ours
    std::int64_t& until = counted_until[event.track];
    if (event.end_ns <= until) continue;
    until = event.end_ns;
    figures.compute_off_core_ns = figures.compute_off_core_ns.value_or(0) + *off_core;
  }
  if (!rank.events.empty()) {
    std::int64_t first = rank.events.front().begin_ns;
    std::int64_t last = first;
    for (const TimelineEvent& event : rank.events) {
      first = std::min(first, event.begin_ns);
      last = std::max(last, event.end_ns);
    }
    figures.wall_ns = last - first;
  }
  return figures;
}

}  // namespace

void add_rank_figures(OverlapFigures& job, const OverlapFigures& rank) {
  job.wall_ns = std::max(job.wall_ns, rank.wall_ns);
  job.compute_ns += rank.compute_ns;
  job.communication_ns += rank.communication_ns;
  job.overlap_ns += rank.overlap_ns;
  job.exposed_ns += rank.exposed_ns;
  if (rank.compute_off_core_ns) {
    job.compute_off_core_ns = job.compute_off_core_ns.value_or(0) + *rank.compute_off_core_ns;
  }
  job.waiting_ns += rank.waiting_ns;
  for (const auto& [late_rank, ns] : rank.waited_for_ns) job.waited_for_ns[late_rank] += ns;
  job.matched_calls += rank.matched_calls;
  job.late_calls += rank.late_calls;
}

namespace {

// In the largest unit it reaches, so a column reads in one unit from 1 us on: three
// significant digits below ten of the unit, one decimal above.
std::string duration_text(std::int64_t ns) {
  const auto in = [](double value, const char* unit) {
    return value < 10 ? fmt::format("{:.2f} {}", value, unit)
                      : fmt::format("{:.1f} {}", value, unit);
  };
  if (ns >= 1'000'000'000) return in(static_cast<double>(ns) / 1e9, "s");
  if (ns >= 1'000'000) return in(static_cast<double>(ns) / 1e6, "ms");
  if (ns >= 1'000) return fmt::format("{:.1f} us", static_cast<double>(ns) / 1e3);
  return fmt::format("{} ns", ns);
}

std::string bytes_text(std::uint64_t bytes) {
  if (bytes >= (std::uint64_t{10} << 30)) return fmt::format("{} GiB", bytes >> 30);
  if (bytes >= (std::uint64_t{10} << 20)) return fmt::format("{} MiB", bytes >> 20);
  if (bytes >= (std::uint64_t{10} << 10)) return fmt::format("{} KiB", bytes >> 10);
  return fmt::format("{} B", bytes);
}

// A part of exposed time in percent of it.
double share_of_exposed(const OverlapFigures& f, std::int64_t ns) {
  return 100.0 * static_cast<double>(ns) /
         static_cast<double>(std::max<std::int64_t>(f.exposed_ns, 1));
}

std::string percent_text(std::optional<double> percent) {
  return percent ? fmt::format("{:.1f}%", *percent) : std::string("-");
}

void append_stats_json(std::string& out, const LatencyStats& s) {
  fmt::format_to(std::back_inserter(out),
                 R"({{"count":{},"recorded":{},"bytes":{},"total_ns":{},"p50_ns":{},"p90_ns":{},)"
                 R"("p99_ns":{},"max_ns":{}}})",
                 s.count, s.recorded, s.bytes, s.total_ns, s.p50_ns, s.p90_ns, s.p99_ns, s.max_ns);
}

void append_rank_json(std::string& out, const RankSummary& rank) {
  const OverlapFigures& f = rank.figures;
  out += '{';
  if (rank.rank >= 0) fmt::format_to(std::back_inserter(out), R"("rank":{},)", rank.rank);
  fmt::format_to(std::back_inserter(out),
                 R"("wall_ns":{},"compute_ns":{},"communication_ns":{},"overlap_ns":{},)"
                 R"("exposed_communication_ns":{},"overwritten_records":{},"overlap_percent":)",
                 f.wall_ns, f.compute_ns, f.communication_ns, f.overlap_ns, f.exposed_ns,
                 rank.overwritten_records);
  if (const auto p = f.overlap_percent()) {
    fmt::format_to(std::back_inserter(out), "{:.3f}", *p);
  } else {
    out += "null";
  }
  if (f.compute_off_core_ns) {
    fmt::format_to(std::back_inserter(out), R"(,"compute_off_core_ns":{})", *f.compute_off_core_ns);
  }
  fmt::format_to(std::back_inserter(out),
                 R"(,"waiting_ns":{},"transfer_ns":{},"matched_calls":{},"late_calls":{},)"
                 R"("waited_for_ns":{{)",
                 f.waiting_ns, f.transfer_ns(), f.matched_calls, f.late_calls);
  bool first_late = true;
  for (const auto& [late_rank, ns] : f.waited_for_ns) {
    fmt::format_to(std::back_inserter(out), R"({}"{}":{})", first_late ? "" : ",", late_rank, ns);
    first_late = false;
  }
  out += R"(},"most_waited_for":)";
  if (const auto most = f.most_waited_for()) {
    fmt::format_to(std::back_inserter(out),
                   R"({{"rank":{},"waited_ns":{},"exposed_percent":{:.3f}}})", most->rank,
                   most->waited_ns, share_of_exposed(f, most->waited_ns));
  } else {
    out += "null";
  }
  out += R"(,"collectives":{)";
  bool first = true;
  for (const auto& [name, stats] : rank.collectives) {
    if (!first) out += ',';
    first = false;
    append_json_string(out, name);
    out += ':';
    append_stats_json(out, stats);
  }
  out += R"(},"buckets":{)";
  first = true;
  for (const auto& [index, stats] : rank.buckets) {
    if (!first) out += ',';
    first = false;
    fmt::format_to(std::back_inserter(out), R"("{}":)", index);
    append_stats_json(out, stats);
  }
  out += R"(},"pipeline_bubble_percent":)";
  if (rank.bubble_percent) {
    fmt::format_to(std::back_inserter(out), "{:.3f}", *rank.bubble_percent);
  } else {
    out += "null";
  }
  out += '}';
}

void append_stats_table(std::string& out, std::string_view what,
                        const std::map<std::string, LatencyStats>& rows) {
  fmt::format_to(std::back_inserter(out), "  {:<22} {:>7} {:>10} {:>10} {:>10} {:>10} {:>10}\n",
                 what, "count", "bytes", "p50", "p90", "p99", "max");
  bool sampled = false;
  for (const auto& [name, s] : rows) {
    sampled = sampled || s.sampled();
    fmt::format_to(std::back_inserter(out), "  {:<22} {:>7} {:>10} {:>10} {:>10} {:>10} {:>10}\n",
                   name, count_text(s), bytes_text(s.bytes), duration_text(s.p50_ns),
                   duration_text(s.p90_ns), duration_text(s.p99_ns), duration_text(s.max_ns));
  }
  if (sampled) fmt::format_to(std::back_inserter(out), "  {}\n", kSampledNote);
}

}  // namespace

std::string count_text(const LatencyStats& stats) {
  return fmt::format("{}{}", stats.sampled() ? "~" : "", stats.count);
}

std::optional<double> OverlapFigures::overlap_percent() const {
  if (communication_ns <= 0) return std::nullopt;
  return 100.0 * static_cast<double>(overlap_ns) / static_cast<double>(communication_ns);
}

std::optional<OverlapFigures::LateRank> OverlapFigures::most_waited_for() const {
  std::optional<LateRank> most;
  for (const auto& [late_rank, ns] : waited_for_ns) {
    if (ns > 0 && (!most || ns > most->waited_ns)) most = LateRank{late_rank, ns};
  }
  return most;
}

std::string waiting_text(const Summary& summary) {
  const OverlapFigures& job = summary.job.figures;
  const std::optional<OverlapFigures::LateRank> most = job.most_waited_for();
  if (!most) return {};
  std::string text = fmt::format("ranks waited {} for rank {} ({:.1f}% of exposed)",
                                 duration_text(most->waited_ns), most->rank,
                                 share_of_exposed(job, most->waited_ns));
  const auto late = std::find_if(summary.ranks.begin(), summary.ranks.end(),
                                 [&](const RankSummary& r) { return r.rank == most->rank; });
  if (late != summary.ranks.end() && late->figures.matched_calls > 0) {
    text += fmt::format(", last to arrive at {} of its {} calls", late->figures.late_calls,
                        late->figures.matched_calls);
  }
  const std::size_t others = job.waited_for_ns.size() - 1;
  if (others > 0) {
    text += fmt::format("; {} for {} other rank{}", duration_text(job.waiting_ns - most->waited_ns),
                        others, others == 1 ? "" : "s");
  }
  return text;
}

std::vector<Interval> union_of(std::vector<Interval> intervals) {
  std::erase_if(intervals, [](const Interval& i) { return i.end <= i.begin; });
  std::sort(intervals.begin(), intervals.end(),
            [](const Interval& a, const Interval& b) { return a.begin < b.begin; });
  std::vector<Interval> merged;
  for (const Interval& i : intervals) {
    if (!merged.empty() && i.begin <= merged.back().end) {
      merged.back().end = std::max(merged.back().end, i.end);
    } else {
      merged.push_back(i);
    }
  }
  return merged;
}

std::vector<Interval> intersection_of(const std::vector<Interval>& a,
                                      const std::vector<Interval>& b) {
  std::vector<Interval> out;
  std::size_t i = 0;
  std::size_t j = 0;
  while (i < a.size() && j < b.size()) {
    const std::int64_t begin = std::max(a[i].begin, b[j].begin);
    const std::int64_t end = std::min(a[i].end, b[j].end);
    if (begin < end) out.push_back({begin, end});
    if (a[i].end < b[j].end) {
      ++i;
    } else {
      ++j;
    }
  }
  return out;
}

std::int64_t total_length(const std::vector<Interval>& merged) {
  std::int64_t total = 0;
  for (const Interval& i : merged) total += i.end - i.begin;
  return total;
}

std::vector<Interval> intervals_of(const RankTimeline& rank, std::string_view category) {
  std::vector<Interval> intervals;
  for (const TimelineEvent& event : rank.events) {
    if (!event.instant && event.category == category) {
      intervals.push_back({event.begin_ns, event.end_ns});
    }
  }
  return union_of(std::move(intervals));
}

Summary summarize(const Timeline& timeline) {
  Summary summary;
  summary.world_size = timeline.world_size;
  std::map<std::string, Samples> job_collectives;
  std::map<std::int64_t, Samples> job_buckets;
  std::vector<double> bubbles;
  const std::vector<detail::RankArrivals> arrivals = detail::arrival_skew(timeline);
  // The bubble's window (pipeline_bubble.hpp): from the job's first compute action to its
  // last. Traces do not say which ranks form a pipeline, so every rank's count, over every
  // traced step: time between steps (the optimizer, data loading) is in the bubble too.
  std::vector<std::vector<Interval>> compute_spans;
  Interval window{.begin = std::numeric_limits<std::int64_t>::max(),
                  .end = std::numeric_limits<std::int64_t>::min()};
  for (const RankTimeline& rank : timeline.ranks) {
    compute_spans.push_back(pipeline_compute_spans(rank));
    if (compute_spans.back().empty()) continue;
    window.begin = std::min(window.begin, compute_spans.back().front().begin);
    window.end = std::max(window.end, compute_spans.back().back().end);
  }
  for (std::size_t index = 0; index < timeline.ranks.size(); ++index) {
    const RankTimeline& rank = timeline.ranks[index];
    RankSummary out;
    out.rank = rank.rank;
    out.figures = figures_of(rank, arrivals[index]);
    std::map<std::string, Samples> collectives;
    std::map<std::int64_t, Samples> buckets;
    for (const TimelineEvent& event : rank.events) {
      if (event.instant) continue;
      if (event.category == "comm") {
        collectives[event.name].add(event);
        job_collectives[event.name].add(event);
      } else if (event.category == "bucket") {
        if (const auto index = integer_arg(event, "bucket")) {
          buckets[*index].add(event);
          job_buckets[*index].add(event);
        }
      }
    }
    for (auto& [name, samples] : collectives) out.collectives[name] = samples.stats();
    for (auto& [index, samples] : buckets) out.buckets[index] = samples.stats();
    if (!compute_spans[index].empty() && window.end > window.begin) {
      out.bubble_percent =
          bubble_percent(difference_of(compute_spans[index], reduction_waits(rank)), window);
    }
    out.overwritten_records = rank.overwritten_records;
    summary.job.overwritten_records += rank.overwritten_records;
    if (out.bubble_percent) bubbles.push_back(*out.bubble_percent);
    add_rank_figures(summary.job.figures, out.figures);
    summary.ranks.push_back(std::move(out));
  }
  for (auto& [name, samples] : job_collectives) summary.job.collectives[name] = samples.stats();
  for (auto& [index, samples] : job_buckets) summary.job.buckets[index] = samples.stats();
  if (!bubbles.empty()) {
    double sum = 0;
    for (const double b : bubbles) sum += b;
    summary.job.bubble_percent = sum / static_cast<double>(bubbles.size());
  }
  return summary;
}

std::string format_text(const Summary& summary) {
  std::string out;
  fmt::format_to(std::back_inserter(out), "{} rank(s)\n\n", summary.ranks.size());
  const bool off_core = summary.job.figures.compute_off_core_ns.has_value();
  // Waiting is known only where calls were matched across ranks (summary.hpp).
  const bool waiting = summary.job.figures.matched_calls > 0;
  fmt::format_to(std::back_inserter(out), "{:<6} {:>10} {:>10} {:>10} {:>10} {:>10}{} {:>9}{}\n",
                 "rank", "wall", "compute", "comm", "overlap", "exposed",
                 waiting ? fmt::format(" {:>10} {:>10}", "waiting", "transfer") : "", "overlap%",
                 off_core ? fmt::format(" {:>10}", "off-core") : "");
  auto row = [&](std::string label, const OverlapFigures& f) {
    fmt::format_to(
        std::back_inserter(out), "{:<6} {:>10} {:>10} {:>10} {:>10} {:>10}{} {:>9}{}\n", label,
        duration_text(f.wall_ns), duration_text(f.compute_ns), duration_text(f.communication_ns),
        duration_text(f.overlap_ns), duration_text(f.exposed_ns),
        waiting ? fmt::format(" {:>10} {:>10}", duration_text(f.waiting_ns),
                              duration_text(f.transfer_ns()))
                : "",
        percent_text(f.overlap_percent()),
        !off_core               ? ""
        : f.compute_off_core_ns ? fmt::format(" {:>10}", duration_text(*f.compute_off_core_ns))
                                : fmt::format(" {:>10}", "-"));
  };
  for (const RankSummary& rank : summary.ranks) row(std::to_string(rank.rank), rank.figures);
  row("all", summary.job.figures);
  if (off_core) {
    out +=
        "off-core: time the compute's threads spent without their core (another thread ran "
        "there, or they waited); overlap counts communication beside compute as hidden, and "
        "where it took the compute's core, this is at most what it cost\n";
  }
  if (waiting) fmt::format_to(std::back_inserter(out), "{}\n", kWaitingNote);
  if (const std::string late = waiting_text(summary); !late.empty()) {
    fmt::format_to(std::back_inserter(out), "waiting: {}\n", late);
  }
  for (const RankSummary& rank : summary.ranks) {
    if (rank.overwritten_records == 0) continue;
    fmt::format_to(std::back_inserter(out),
                   "rank {} overwrote its {} oldest records (BRAID_TRACE_BUFFER_MB): its "
                   "figures cover only the time after them\n",
                   rank.rank, rank.overwritten_records);
  }
  if (!summary.job.collectives.empty()) {
    out += "\ncollectives, every rank:\n";
    append_stats_table(out, "name", summary.job.collectives);
  }
  if (!summary.job.buckets.empty()) {
    out += "\nbuckets, from ready to reduced, every rank:\n";
    std::map<std::string, LatencyStats> rows;
    for (const auto& [index, stats] : summary.job.buckets) {
      rows[fmt::format("bucket {:>4}", index)] = stats;
    }
    append_stats_table(out, "bucket", rows);
  }
  if (summary.job.bubble_percent) {
    out += "\npipeline bubble:";
    for (const RankSummary& rank : summary.ranks) {
      if (rank.bubble_percent) {
        fmt::format_to(std::back_inserter(out), " rank {} {:.1f}%,", rank.rank,
                       *rank.bubble_percent);
      }
    }
    fmt::format_to(std::back_inserter(out), " mean {:.1f}%\n", *summary.job.bubble_percent);
  }
  return out;
}

std::string format_json(const Summary& summary) {
  std::string out;
  fmt::format_to(std::back_inserter(out), R"({{"world_size":{},"ranks":[)", summary.world_size);
  bool first = true;
  for (const RankSummary& rank : summary.ranks) {
    if (!first) out += ',';
    first = false;
    append_rank_json(out, rank);
  }
  out += R"(],"job":)";
  append_rank_json(out, summary.job);
  out += "}\n";
  return out;
}

}  // namespace braid::trace
