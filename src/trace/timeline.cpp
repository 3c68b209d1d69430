#include <algorithm>

#include <braid/trace/timeline.hpp>

namespace braid::trace {

std::optional<std::string> TimelineEvent::arg(std::string_view key) const {
  for (const auto& [name, value] : args) {
    if (name == key) return value;
  }
  return std::nullopt;
}

RankTimeline rank_timeline(const Snapshot& snapshot, const TraceIdentity& identity) {
  RankTimeline rank;
  rank.rank = identity.rank;
  rank.host = identity.host;
  rank.clock = identity.clock;
  rank.overwritten_records = snapshot.overwritten;
  for (const TrackInfo& track : snapshot.tracks) rank.track_names[track.id] = track.name;
  const std::int64_t origin = origin_of(snapshot);
  rank.events.reserve(snapshot.records.size());
  for (const Record& record : snapshot.records) {
    TimelineEvent event;
    event.name = record.name != nullptr ? record.name : "";
    event.category = std::string(to_string(record.category));
    event.track = record.track;
    event.begin_ns = record.begin_ns - origin;
    event.end_ns = record.end_ns - origin;
    event.bytes = record.bytes;
    event.instant = record.kind == RecordKind::instant || record.kind == RecordKind::counter;
    for (std::uint8_t i = 0; i < record.arg_count; ++i) {
      event.args.emplace_back(record.args[i].key, std::to_string(record.args[i].value));
    }
    if (record.text_key != nullptr) {
      event.args.emplace_back(record.text_key, record.text != nullptr ? record.text : "");
    }
    rank.events.push_back(std::move(event));
  }
  std::stable_sort(
      rank.events.begin(), rank.events.end(),
      [](const TimelineEvent& a, const TimelineEvent& b) { return a.begin_ns < b.begin_ns; });
  return rank;
}

}  // namespace braid::trace
