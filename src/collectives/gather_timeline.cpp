#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include <braid/collectives/gather_timeline.hpp>
#include <braid/trace/timeline_bytes.hpp>

namespace braid::collectives {

asio::awaitable<std::optional<trace::Timeline>> gather_timeline(Communicator& comm,
                                                                trace::Snapshot snapshot,
                                                                trace::ClockAlignment clock,
                                                                int root) {
  const trace::RankTimeline mine = trace::rank_timeline(
      snapshot, {.rank = comm.rank(), .world_size = comm.size(), .clock = clock});
  std::string bytes = trace::timeline_to_bytes(mine, trace::origin_of(snapshot) + clock.offset_ns);

  const auto ranks = static_cast<std::size_t>(comm.size());
  std::vector<std::int64_t> sizes(ranks);
  sizes[static_cast<std::size_t>(comm.rank())] = static_cast<std::int64_t>(bytes.size());
  co_await comm.all_gather(Buffer(sizes));
  const auto largest = static_cast<std::size_t>(*std::max_element(sizes.begin(), sizes.end()));
  bytes.resize(largest);
  std::string gathered(comm.rank() == root ? largest * ranks : 0, '\0');
  co_await comm.gather(Buffer(bytes.data(), largest, DType::u8),
                       Buffer(gathered.data(), gathered.size(), DType::u8), root);
  if (comm.rank() != root) co_return std::nullopt;

  trace::Timeline timeline;
  timeline.world_size = comm.size();
  std::vector<std::int64_t> origins;
  for (std::size_t r = 0; r < ranks; ++r) {
    auto decoded = trace::timeline_from_bytes(
        std::string_view(gathered).substr(r * largest, static_cast<std::size_t>(sizes[r])));
    decoded.rank.rank = static_cast<int>(r);
    origins.push_back(decoded.rank.events.empty() ? std::numeric_limits<std::int64_t>::max()
                                                  : decoded.origin_reference_ns);
    timeline.ranks.push_back(std::move(decoded.rank));
  }
  const std::int64_t base = *std::min_element(origins.begin(), origins.end());
  for (std::size_t r = 0; r < ranks; ++r) {
    if (timeline.ranks[r].events.empty()) continue;
    const std::int64_t shift = origins[r] - base;
    for (trace::TimelineEvent& e : timeline.ranks[r].events) {
      e.begin_ns += shift;
      e.end_ns += shift;
    }
  }
  co_return timeline;
}

}  // namespace braid::collectives
