#include "trace_set.hpp"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <map>
#include <set>
#include <sstream>
#include <tuple>

#include <fmt/format.h>

namespace braid::tools::trace_tool {
namespace {

using nlohmann::json;

[[noreturn]] void bad(const std::filesystem::path& file, std::string_view what) {
  throw TraceInputError(fmt::format("{}: {}", file.string(), what));
}

// The largest time or duration a trace may give, in microseconds: 3e15 us is 95 years,
// past any steady clock's or epoch timestamp (Chrome and PyTorch traces count from the Unix
// epoch, 1.7e15 us now), and small enough that nanoseconds, a clock shift of up to 1e18 ns
// and the differences between them stay inside 64 bits.
constexpr double kMostMicroseconds = 3e15;
constexpr std::int64_t kMostShiftNs = 1'000'000'000'000'000'000;

std::int64_t to_ns(const json& microseconds) {
  return std::llround(microseconds.get<double>() * 1000.0);
}

double to_microseconds(std::int64_t ns) {
  return static_cast<double>(ns) / 1000.0;
}

std::int64_t integer_field(const TraceFile& file, const json& object, const char* key,
                           std::string_view where) {
  const auto it = object.find(key);
  if (it == object.end() || !it->is_number()) {
    bad(file.path, fmt::format("{} has no numeric \"{}\"", where, key));
  }
  return it->is_number_integer() ? it->get<std::int64_t>() : std::llround(it->get<double>());
}

// The clock shift a braid rank file declares; 0 for merged and foreign traces.
std::int64_t shift_of(const TraceFile& file) {
  const json& doc = file.document;
  const auto braid = doc.find("braid");
  if (braid == doc.end() || !braid->is_object()) return 0;
  if (braid->value("format", "") != "braid-trace") return 0;
  const auto clock = braid->find("clock");
  if (clock == braid->end() || !clock->is_object())
    bad(file.path, "\"braid\" has no \"clock\" object");
  if (const auto rank = braid->find("rank"); rank == braid->end() || !rank->is_number_integer()) {
    bad(file.path, "\"braid\" has no integer \"rank\"");
  }
  const std::int64_t origin = integer_field(file, *clock, "origin_ns", "\"braid.clock\"");
  const std::int64_t offset = integer_field(file, *clock, "offset_ns", "\"braid.clock\"");
  for (const std::int64_t value : {origin, offset}) {
    if (value < -kMostShiftNs || value > kMostShiftNs) {
      bad(file.path,
          fmt::format("\"braid.clock\" holds {} ns, beyond any clock (at most 1e18)", value));
    }
  }
  return origin + offset;
}

void check_event(const TraceFile& file, const json& event, std::size_t index) {
  const std::string where = fmt::format("event {}", index);
  if (!event.is_object()) bad(file.path, fmt::format("{} is not an object", where));
  const auto ph = event.find("ph");
  if (ph == event.end() || !ph->is_string() || ph->get_ref<const std::string&>().empty()) {
    bad(file.path, fmt::format("{} has no \"ph\" (phase) string", where));
  }
  const std::string& phase = ph->get_ref<const std::string&>();
  for (const char* key : {"name", "cat"}) {
    if (const auto text = event.find(key); text != event.end() && !text->is_string()) {
      bad(file.path, fmt::format("{} has a \"{}\" that is not text", where, key));
    }
  }
  if (phase == "M") {
    // Metadata names threads and processes: its args must be an object whose name is text.
    if (const auto args = event.find("args"); args != event.end()) {
      const auto name = args->is_object() ? args->find("name") : args->end();
      if (!args->is_object() || (name != args->end() && !name->is_string())) {
        bad(file.path, fmt::format("{} (ph \"M\") has \"args\" that are not an object with a "
                                   "text \"name\"",
                                   where));
      }
    }
    return;
  }
  const auto ts = event.find("ts");
  if (ts == event.end() || !ts->is_number()) {
    bad(file.path, fmt::format("{} (ph \"{}\") has no numeric \"ts\"", where, phase));
  }
  if (const double t = ts->get<double>(); !(t >= 0 && t <= kMostMicroseconds)) {
    bad(file.path, fmt::format("{} has \"ts\" {}, outside 0 to 3e15 microseconds", where, t));
  }
  if (phase == "X") {
    const auto dur = event.find("dur");
    if (dur == event.end() || !dur->is_number() || !(dur->get<double>() >= 0) ||
        dur->get<double>() > kMostMicroseconds) {
      bad(file.path,
          fmt::format("{} (ph \"X\") has no numeric \"dur\" from 0 to 3e15 microseconds", where));
    }
  }
  if (const auto pid = event.find("pid"); pid != event.end() && !pid->is_number_integer()) {
    bad(file.path, fmt::format("{} has a \"pid\" that is not an integer", where));
  }
}

TraceFile read_file(const std::filesystem::path& path) {
  TraceFile file;
  file.path = path;
  const std::string text = read_bounded(path);
  try {
    file.document = json::parse(text);
  } catch (const json::parse_error& e) {
    bad(path, fmt::format("not valid JSON at byte {} (truncated, or not a trace?)", e.byte));
  }
  if (file.document.is_array()) {  // Chrome's "JSON array format"
    file.document = json{{"traceEvents", std::move(file.document)}};
  }
  const auto events =
      file.document.is_object() ? file.document.find("traceEvents") : file.document.end();
  if (!file.document.is_object() || events == file.document.end() || !events->is_array()) {
    bad(path, "not a Chrome trace: expected an object with a \"traceEvents\" array");
  }
  file.shift_ns = shift_of(file);
  std::int64_t earliest = std::numeric_limits<std::int64_t>::max();
  std::size_t index = 0;
  for (const json& event : *events) {
    check_event(file, event, index++);
    if (event["ph"] == "M") continue;
    earliest = std::min(earliest, to_ns(event["ts"]) + file.shift_ns);
    file.has_events = true;
  }
  file.earliest_ns = file.has_events ? earliest : 0;
  return file;
}

std::string arg_text(const json& value) {
  return value.is_string() ? value.get<std::string>() : value.dump();
}

std::uint32_t tid_of(const json& event) {
  const auto tid = event.find("tid");
  return tid != event.end() && tid->is_number_unsigned() ? tid->get<std::uint32_t>() : 0;
}

trace::TimelineEvent event_from(const json& event, std::int64_t begin_ns, std::int64_t end_ns) {
  trace::TimelineEvent out;
  out.name = event.value("name", "");
  out.category = event.value("cat", "");
  out.track = tid_of(event);
  out.begin_ns = begin_ns;
  out.end_ns = end_ns;
  if (const auto args = event.find("args"); args != event.end() && args->is_object()) {
    for (const auto& [key, value] : args->items()) {
      if (key == "bytes" && value.is_number_unsigned()) {
        out.bytes = value.get<std::uint64_t>();
      } else {
        out.args.emplace_back(key, arg_text(value));
      }
    }
  }
  return out;
}

int pid_of(const json& event) {
  const auto pid = event.find("pid");
  return pid != event.end() ? pid->get<int>() : 0;
}

}  // namespace

std::string read_bounded(const std::filesystem::path& path, std::uintmax_t limit) {
  const auto too_large = [&] {
    bad(path, fmt::format("is larger than {} MiB, the most the tools read", limit >> 20));
  };
  std::error_code error;
  if (std::filesystem::is_regular_file(path, error) &&
      std::filesystem::file_size(path, error) > limit) {
    too_large();
  }
  std::ifstream stream(path, std::ios::binary);
  if (!stream) bad(path, "cannot be opened");
  std::string text;
  std::vector<char> chunk(std::size_t{1} << 16);
  while (stream.read(chunk.data(), static_cast<std::streamsize>(chunk.size())) ||
         stream.gcount() > 0) {
    text.append(chunk.data(), static_cast<std::size_t>(stream.gcount()));
    if (text.size() > limit) too_large();  // a device or a pipe: no size to check first
  }
  if (stream.bad()) bad(path, "could not be read");
  return text;
}

std::string json_error_text(const nlohmann::json::exception& e) {
  std::string_view text = e.what();
  if (text.starts_with("[json.exception.")) {
    if (const auto end = text.find("] "); end != std::string_view::npos)
      text.remove_prefix(end + 2);
  }
  return std::string(text.substr(0, 200));
}

TraceSet TraceSet::load(const std::filesystem::path& path) {
  std::error_code error;
  if (!std::filesystem::exists(path, error)) bad(path, "does not exist");
  std::vector<std::filesystem::path> paths;
  if (std::filesystem::is_directory(path, error)) {
    for (const auto& entry : std::filesystem::directory_iterator(path)) {
      if (entry.is_regular_file() && entry.path().extension() == ".json") {
        paths.push_back(entry.path());
      }
    }
    std::sort(paths.begin(), paths.end());
    if (paths.empty()) {
      bad(path, "no trace files (*.json) here; run with BRAID_TRACE set to this directory");
    }
  } else {
    paths.push_back(path);
  }
  TraceSet set;
  std::int64_t origin = std::numeric_limits<std::int64_t>::max();
  for (const auto& file : paths) {
    set.files_.push_back(read_file(file));
    if (set.files_.back().has_events) origin = std::min(origin, set.files_.back().earliest_ns);
  }
  set.origin_ns_ = origin == std::numeric_limits<std::int64_t>::max() ? 0 : origin;
  return set;
}

trace::Timeline TraceSet::timeline() const {
  std::map<int, trace::RankTimeline> ranks;
  int declared_world = 0;
  for (const TraceFile& file : files_) {
    const json& doc = file.document;
    const auto braid = doc.find("braid");
    if (const auto info = doc.find("distributedInfo"); info != doc.end() && info->is_object()) {
      declared_world = std::max(declared_world, info->value("world_size", 0));
    }
    auto rank_of = [&](int pid) -> trace::RankTimeline& {
      trace::RankTimeline& rank = ranks[pid];
      rank.rank = pid;
      return rank;
    };
    // Async pairs by (pid, cat, name, id); B/E stacks by (pid, tid).
    std::map<std::tuple<int, std::string, std::string, std::string>, const json*> open_async;
    std::map<std::pair<int, std::uint32_t>, std::vector<const json*>> open_sync;
    std::size_t index = 0;
    for (const json& event : doc["traceEvents"]) {
      ++index;
      const std::string& phase = event["ph"].get_ref<const std::string&>();
      const int pid = pid_of(event);
      trace::RankTimeline& rank = rank_of(pid);
      if (phase == "M") {
        if (event.value("name", "") == "thread_name" && event.contains("args")) {
          rank.track_names[tid_of(event)] = event["args"].value("name", "");
        }
        continue;
      }
      const std::int64_t at = to_ns(event["ts"]) + file.shift_ns - origin_ns_;
      if (phase == "X") {
        rank.events.push_back(event_from(event, at, at + to_ns(event["dur"])));
      } else if (phase == "b" || phase == "e") {
        const auto key = std::make_tuple(pid, event.value("cat", ""), event.value("name", ""),
                                         event.contains("id") ? arg_text(event["id"]) : "");
        if (phase == "b") {
          open_async[key] = &event;
        } else {
          const auto begin = open_async.find(key);
          if (begin == open_async.end()) {
            bad(file.path, fmt::format("event {} ends async span \"{}\" (id {}) that never began",
                                       index - 1, std::get<2>(key), std::get<3>(key)));
          }
          const json& first = *begin->second;
          rank.events.push_back(
              event_from(first, to_ns(first["ts"]) + file.shift_ns - origin_ns_, at));
          open_async.erase(begin);
        }
      } else if (phase == "B" || phase == "E") {
        auto& stack = open_sync[{pid, tid_of(event)}];
        if (phase == "B") {
          stack.push_back(&event);
        } else if (!stack.empty()) {
          const json& first = *stack.back();
          rank.events.push_back(
              event_from(first, to_ns(first["ts"]) + file.shift_ns - origin_ns_, at));
          stack.pop_back();
        }
      } else if (phase == "i" || phase == "I" || phase == "n" || phase == "C") {
        trace::TimelineEvent instant = event_from(event, at, at);
        instant.instant = true;
        rank.events.push_back(std::move(instant));
      }
    }
    // A braid rank file says who wrote it: that rank's host and clock, read once per file.
    if (braid != doc.end() && braid->is_object() && braid->value("format", "") == "braid-trace") {
      const auto written_by = ranks.find(braid->value("rank", -1));
      if (written_by != ranks.end()) {
        trace::RankTimeline& rank = written_by->second;
        rank.host = braid->value("host", "");
        rank.overwritten_records = braid->value("overwritten_records", std::uint64_t{0});
        const json& clock = (*braid)["clock"];
        rank.clock.reference_rank = clock.value("reference_rank", 0);
        rank.clock.offset_ns = clock.value("offset_ns", std::int64_t{0});
        rank.clock.round_trip_ns = clock.value("round_trip_ns", std::int64_t{0});
      }
    }
  }
  trace::Timeline timeline;
  for (auto& [pid, rank] : ranks) {
    std::stable_sort(rank.events.begin(), rank.events.end(),
                     [](const trace::TimelineEvent& a, const trace::TimelineEvent& b) {
                       return a.begin_ns < b.begin_ns;
                     });
    timeline.ranks.push_back(std::move(rank));
  }
  timeline.world_size = std::max(declared_world, static_cast<int>(timeline.ranks.size()));
  return timeline;
}

json TraceSet::merged() const {
  json events = json::array();
  json ranks = json::array();
  std::set<int> pids;
  int world = 0;
  for (const TraceFile& file : files_) {
    const json& doc = file.document;
    if (const auto braid = doc.find("braid"); braid != doc.end() && braid->is_object()) {
      world = std::max(world, braid->value("world_size", 0));
      if (braid->value("format", "") == "braid-trace") {
        ranks.push_back(
            json{{"rank", braid->value("rank", 0)},
                 {"host", braid->value("host", "")},
                 {"file", file.path.filename().string()},
                 {"offset_ns", (*braid)["clock"].value("offset_ns", std::int64_t{0})},
                 {"round_trip_ns", (*braid)["clock"].value("round_trip_ns", std::int64_t{0})},
                 {"overwritten_records", braid->value("overwritten_records", std::uint64_t{0})}});
      }
    }
    for (const json& event : doc["traceEvents"]) {
      json copy = event;
      pids.insert(pid_of(event));
      if (event["ph"] != "M") {
        copy["ts"] = to_microseconds(to_ns(event["ts"]) + file.shift_ns - origin_ns_);
      }
      events.push_back(std::move(copy));
    }
  }
  world = std::max(world, static_cast<int>(pids.size()));
  return json{{"displayTimeUnit", "ns"},
              {"braid",
               {{"format", "braid-trace-merged"},
                {"version", 1},
                {"world_size", world},
                {"origin_ns", origin_ns_},
                {"ranks", std::move(ranks)}}},
              {"traceEvents", std::move(events)}};
}

}  // namespace braid::tools::trace_tool
