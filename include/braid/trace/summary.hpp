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
//   waiting        the part of exposed a rank spent in collectives before their last member
//                  arrived. A call is matched across ranks by its communicator's id and
//                  sequence number (arguments "comm" and "seq", the same on every member)
//                  and its span's name (the k-th such span on one rank with the k-th on the
//                  others: a staged call's chunks share a sequence number). For a call
//                  recorded on two or more ranks, the last arrival L is the latest begin
//                  among them, and rank r's wait is [begin_r, min(L, end_r)), empty on the
//                  last rank. waiting = the union of the rank's waits less its compute, as
//                  exposed is the union of its communication less compute; a sampled span's
//                  wait outside compute counts n - 1 more times, as its length does in
//                  communication
//   transfer       exposed - waiting: the exchange itself, and all the exposure of spans
//                  that match nothing (point-to-point, NCCL's calls, a call only one rank
//                  recorded, traces without "comm")
//   waited for     per late rank, the part of waiting spent in the calls it arrived last at
//                  (time two waits share goes to the one that began first): a rank's own
//                  waits; for the job, what the other ranks waited for it together
//   late calls     the calls at which the rank arrived last while another waited for it
//
// Waiting and the figures after it are braid's own (HTA has no such split). They rest on
// the ranks' begin times being on one clock: summarize() takes the Timeline's times as
// they are, and braid-trace aligns the rank files by their measured offsets, whose error
// is at most half the round trip they were measured with (the files' round_trip_ns; about
// a microsecond on one node), so skew below that is noise. A timeline of one rank (its own
// snapshot, rank_timeline()) has no peers to match: its waiting is unknown, counted as 0
// (matched_calls says which). A call that need not wait for every member (a broadcast's
// root, whose send may complete before a receiver arrives) still counts its time before
// the last arrival as waiting.
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
  // The part of exposed spent waiting for a later rank to arrive, and per late rank the
  // part spent waiting for it (the values add up to waiting_ns).
  std::int64_t waiting_ns = 0;
  std::map<int, std::int64_t> waited_for_ns;
  // Calls this rank recorded that another rank recorded too, and those at which it arrived
  // last while another waited for it (a sampled span counts as its calls). The job's are
  // sums: every rank's part in a matched call, and every call with a wait. Without matched
  // calls (one rank's own timeline, traces without "comm") waiting is unknown, and the
  // tables leave its columns out.
  std::int64_t matched_calls = 0;
  std::int64_t late_calls = 0;

  // exposed - waiting: the transfer itself.
  std::int64_t transfer_ns() const noexcept { return exposed_ns - waiting_ns; }
  // overlap / communication, in percent; nullopt without communication.
  std::optional<double> overlap_percent() const;
  // The rank waited for longest (the lower one on a tie); nullopt without waiting.
  struct LateRank {
    int rank = -1;
    std::int64_t waited_ns = 0;
  };
  std::optional<LateRank> most_waited_for() const;
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
// rest summed (off-core where the rank has it, waited-for per late rank). For figures
// gathered from ranks by other means (a training loop's own all-gather).
void add_rank_figures(OverlapFigures& job, const OverlapFigures& rank);

// Which rank the others waited for most, as the tables print it ("ranks waited 12.3 ms for
// rank 1 (41.0% of exposed), last to arrive at 480 of its 500 calls"); empty without
// waiting.
std::string waiting_text(const Summary& summary);
// What the waiting and transfer columns mean, for a table that has them (matched calls).
inline constexpr std::string_view kWaitingNote =
    "waiting, transfer: exposed time in collectives before their last rank arrived (clocks "
    "aligned to within half their measured round trip), and the rest of exposed";

// Human-readable tables; the JSON form is one object with "ranks" and "job".
std::string format_text(const Summary& summary);
std::string format_json(const Summary& summary);

}  // namespace braid::trace
