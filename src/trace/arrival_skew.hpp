// Arrival skew: for each collective call recorded on two or more ranks, how long each rank
// waited in it for the last member to arrive (summary.hpp defines "waiting" from these).
//
// A call is known on every member by its communicator's id ("comm"), its sequence number
// ("seq") and its span's name; a staged CUDA call runs its chunks one after another under
// one sequence number, so the k-th span with one such key on one rank is matched with the
// k-th on the others. Cost: one sort of the job's keyed comm spans, O(n log n).
#pragma once

#include <cstdint>
#include <vector>

#include <braid/trace/summary.hpp>
#include <braid/trace/timeline.hpp>

namespace braid::trace::detail {

// One call's wait on a rank that arrived before the last: [its begin, min(last begin, its
// end)).
struct ArrivalWait {
  Interval interval;
  int late_rank = -1;       // the rank that arrived last (RankTimeline::rank)
  std::int64_t weight = 1;  // the calls the span stands for (its "sampled")
};

// What one rank's calls show of the others' arrivals.
struct RankArrivals {
  std::vector<ArrivalWait> waits;  // by begin time
  // Calls the rank recorded that another rank recorded too, and those at which it arrived
  // last while another had arrived before it (a sampled span counts as its calls).
  std::int64_t matched_calls = 0;
  std::int64_t late_calls = 0;
};

// By position in Timeline::ranks.
std::vector<RankArrivals> arrival_skew(const Timeline& timeline);

}  // namespace braid::trace::detail
