#include "trace/arrival_skew.hpp"

#include <algorithm>
#include <string_view>
#include <tuple>

#include "trace/event_args.hpp"

namespace braid::trace::detail {
namespace {

// One comm span under the key its call has on every member.
struct KeyedSpan {
  std::int64_t comm = 0;
  std::int64_t seq = 0;
  std::string_view name;
  std::int64_t occurrence = 0;  // earlier spans with the same comm, seq and name on its rank
  std::size_t rank_index = 0;   // position in Timeline::ranks
  const TimelineEvent* event = nullptr;

  // What every member records for the call; with the occurrence, one span per member.
  auto call() const { return std::tie(comm, seq, name); }
  auto key() const { return std::tie(comm, seq, name, occurrence); }
};

using SpanIt = std::vector<KeyedSpan>::const_iterator;

// One call's spans on two or more ranks, [call, end), in rank order: each member's wait
// until the last one arrived.
void add_call(const Timeline& timeline, SpanIt call, SpanIt end,
              std::vector<RankArrivals>& arrivals) {
  // The last to arrive; on a tie the first in rank order, which the others waited for.
  const auto last = std::max_element(call, end, [](const KeyedSpan& a, const KeyedSpan& b) {
    return a.event->begin_ns < b.event->begin_ns;
  });
  const std::int64_t arrived = last->event->begin_ns;
  const int late_rank = timeline.ranks[last->rank_index].rank;
  bool waited = false;
  for (auto member = call; member != end; ++member) {
    RankArrivals& mine = arrivals[member->rank_index];
    const std::int64_t weight = weight_of(*member->event);
    mine.matched_calls += weight;
    const Interval wait{member->event->begin_ns, std::min(arrived, member->event->end_ns)};
    if (wait.end <= wait.begin) continue;
    waited = true;
    mine.waits.push_back({.interval = wait, .late_rank = late_rank, .weight = weight});
  }
  if (waited) arrivals[last->rank_index].late_calls += weight_of(*last->event);
}

}  // namespace

std::vector<RankArrivals> arrival_skew(const Timeline& timeline) {
  std::vector<RankArrivals> arrivals(timeline.ranks.size());
  std::vector<KeyedSpan> spans;
  for (std::size_t index = 0; index < timeline.ranks.size(); ++index) {
    const std::size_t first = spans.size();
    for (const TimelineEvent& event : timeline.ranks[index].events) {
      if (event.instant || event.category != "comm") continue;
      const std::optional<std::int64_t> comm = integer_arg(event, "comm");
      const std::optional<std::int64_t> seq = integer_arg(event, "seq");
      if (!comm || !seq) continue;  // point-to-point, NCCL, a trace from before "comm"
      spans.push_back(
          {.comm = *comm, .seq = *seq, .name = event.name, .rank_index = index, .event = &event});
    }
    // Events come by begin time: a stable sort keeps a key's spans in that order.
    const auto mine = spans.begin() + static_cast<std::ptrdiff_t>(first);
    std::stable_sort(mine, spans.end(),
                     [](const KeyedSpan& a, const KeyedSpan& b) { return a.call() < b.call(); });
    for (auto it = mine; it != spans.end(); ++it) {
      if (it != mine && it->call() == (it - 1)->call()) it->occurrence = (it - 1)->occurrence + 1;
    }
  }
  // Rank by rank, so a stable sort leaves each call's spans in rank order.
  std::stable_sort(spans.begin(), spans.end(),
                   [](const KeyedSpan& a, const KeyedSpan& b) { return a.key() < b.key(); });
  for (auto call = spans.begin(); call != spans.end();) {
    const auto end =
        std::find_if(call, spans.end(), [&](const KeyedSpan& s) { return s.key() != call->key(); });
    if (end - call >= 2) add_call(timeline, call, end, arrivals);
    call = end;
  }
  for (RankArrivals& mine : arrivals) {
    std::sort(mine.waits.begin(), mine.waits.end(), [](const ArrivalWait& a, const ArrivalWait& b) {
      return a.interval.begin < b.interval.begin;
    });
  }
  return arrivals;
}

}  // namespace braid::trace::detail
