#include <cstring>
#include <type_traits>

#include <fmt/format.h>

#include <braid/core/error.hpp>
#include <braid/trace/timeline_bytes.hpp>

namespace braid::trace {
namespace {

constexpr std::uint32_t kMagic = 0x42544c31;  // "BTL1"

class Writer {
 public:
  template <class T>
  void put(T value) {
    static_assert(std::is_trivially_copyable_v<T>);
    out_.append(reinterpret_cast<const char*>(&value), sizeof value);
  }
  void put_text(std::string_view text) {
    put(static_cast<std::uint32_t>(text.size()));
    out_.append(text);
  }
  std::string take() { return std::move(out_); }

 private:
  std::string out_;
};

class Reader {
 public:
  explicit Reader(std::string_view in) : in_(in) {}
  template <class T>
  T get() {
    T value{};
    need(sizeof value);
    std::memcpy(&value, in_.data() + at_, sizeof value);
    at_ += sizeof value;
    return value;
  }
  std::string get_text() {
    const auto size = get<std::uint32_t>();
    need(size);
    std::string text(in_.substr(at_, size));
    at_ += size;
    return text;
  }
  // A count of items each at least `least_bytes` long: more than the bytes left can hold is
  // corruption, caught before anything is reserved for it.
  std::uint32_t get_count(std::size_t least_bytes) {
    const auto count = get<std::uint32_t>();
    if (count > (in_.size() - at_) / least_bytes) fail("a count past the end");
    return count;
  }
  bool at_end() const { return at_ == in_.size(); }
  [[noreturn]] static void fail(std::string_view what) {
    throw Error(Errc::protocol_error, fmt::format("timeline bytes: {}", what));
  }

 private:
  void need(std::size_t bytes) const {
    if (in_.size() - at_ < bytes) fail("truncated");
  }
  std::string_view in_;
  std::size_t at_ = 0;
};

}  // namespace

std::string timeline_to_bytes(const RankTimeline& rank, std::int64_t origin_reference_ns) {
  Writer w;
  w.put(kMagic);
  w.put(static_cast<std::int32_t>(rank.rank));
  w.put(rank.overwritten_records);
  w.put(origin_reference_ns);
  w.put_text(rank.host);
  w.put(static_cast<std::uint32_t>(rank.track_names.size()));
  for (const auto& [id, name] : rank.track_names) {
    w.put(id);
    w.put_text(name);
  }
  w.put(static_cast<std::uint32_t>(rank.events.size()));
  for (const TimelineEvent& e : rank.events) {
    w.put_text(e.name);
    w.put_text(e.category);
    w.put(e.track);
    w.put(e.begin_ns);
    w.put(e.end_ns);
    w.put(e.bytes);
    w.put(static_cast<std::uint8_t>(e.instant));
    w.put(static_cast<std::uint32_t>(e.args.size()));
    for (const auto& [key, value] : e.args) {
      w.put_text(key);
      w.put_text(value);
    }
  }
  return w.take();
}

RankTimelineBytes timeline_from_bytes(std::string_view bytes) {
  Reader r(bytes);
  if (r.get<std::uint32_t>() != kMagic) Reader::fail("not a braid timeline (or another version)");
  RankTimelineBytes out;
  out.rank.rank = r.get<std::int32_t>();
  out.rank.overwritten_records = r.get<std::uint64_t>();
  out.origin_reference_ns = r.get<std::int64_t>();
  out.rank.host = r.get_text();
  // The least bytes an item takes: a track's id and name length; an event's fixed fields.
  constexpr std::size_t kLeastTrack = 8;
  constexpr std::size_t kLeastEvent = 4 + 4 + 4 + 8 + 8 + 8 + 1 + 4;
  for (std::uint32_t n = r.get_count(kLeastTrack); n > 0; --n) {
    const auto id = r.get<std::uint32_t>();
    out.rank.track_names[id] = r.get_text();
  }
  const std::uint32_t events = r.get_count(kLeastEvent);
  out.rank.events.reserve(events);
  for (std::uint32_t n = 0; n < events; ++n) {
    TimelineEvent e;
    e.name = r.get_text();
    e.category = r.get_text();
    e.track = r.get<std::uint32_t>();
    e.begin_ns = r.get<std::int64_t>();
    e.end_ns = r.get<std::int64_t>();
    e.bytes = r.get<std::uint64_t>();
    e.instant = r.get<std::uint8_t>() != 0;
    for (std::uint32_t a = r.get_count(8); a > 0; --a) {
      std::string key = r.get_text();
      e.args.emplace_back(std::move(key), r.get_text());
    }
    out.rank.events.push_back(std::move(e));
  }
  if (!r.at_end()) Reader::fail("bytes past the last event");
  return out;
}

}  // namespace braid::trace
