#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <iterator>
#include <unistd.h>
#include <vector>

#include <fmt/format.h>

#include <braid/core/error.hpp>
#include <braid/core/json_text.hpp>
#include <braid/trace/chrome_trace.hpp>

namespace braid::trace {
namespace {

using braid::append_json_string;
using braid::append_microseconds;

class EventWriter {
 public:
  EventWriter(std::string& out, int pid, std::int64_t origin_ns)
      : out_(out), pid_(pid), origin_ns_(origin_ns) {}

  void metadata(std::string_view name, std::uint32_t tid, std::string_view key,
                std::string_view text) {
    open("M", name, tid);
    out_ += R"(,"args":{)";
    append_json_string(out_, key);
    out_ += ':';
    append_json_string(out_, text);
    out_ += "}}";
  }
  void metadata(std::string_view name, std::uint32_t tid, std::string_view key,
                std::int64_t value) {
    open("M", name, tid);
    fmt::format_to(std::back_inserter(out_), R"(,"args":{{"{}":{}}}}})", key, value);
  }

  void complete(const Record& record) {
    open("X", record.name, record.track);
    category(record);
    time("ts", record.begin_ns - origin_ns_);
    out_ += R"(,"dur":)";
    append_microseconds(out_, record.end_ns - record.begin_ns);
    args(record);
    out_ += '}';
  }

  void async(const Record& record, std::uint64_t id) {
    for (const bool begin : {true, false}) {
      open(begin ? "b" : "e", record.name, record.track);
      category(record);
      fmt::format_to(std::back_inserter(out_), R"(,"id":"0x{:x}")", id);
      time("ts", (begin ? record.begin_ns : record.end_ns) - origin_ns_);
      if (begin) args(record);
      out_ += '}';
    }
  }

  void instant(const Record& record) {
    open("i", record.name, record.track);
    category(record);
    out_ += R"(,"s":"t")";
    time("ts", record.begin_ns - origin_ns_);
    args(record);
    out_ += '}';
  }

  void counter(const Record& record) {
    open("C", record.name, record.track);
    category(record);
    time("ts", record.begin_ns - origin_ns_);
    out_ += R"(,"args":{)";
    append_json_string(out_, record.name);
    fmt::format_to(std::back_inserter(out_), ":{}}}}}", record.args[0].value);
  }

 private:
  void open(std::string_view phase, std::string_view name, std::uint32_t tid) {
    out_ += first_ ? "\n" : ",\n";
    first_ = false;
    fmt::format_to(std::back_inserter(out_), R"({{"ph":"{}","pid":{},"tid":{},"name":)", phase,
                   pid_, tid);
    append_json_string(out_, name);
  }
  void category(const Record& record) {
    fmt::format_to(std::back_inserter(out_), R"(,"cat":"{}")", to_string(record.category));
  }
  void time(std::string_view key, std::int64_t ns) {
    fmt::format_to(std::back_inserter(out_), R"(,"{}":)", key);
    append_microseconds(out_, ns);
  }
  void args(const Record& record) {
    if (record.bytes == 0 && record.arg_count == 0 && record.text_key == nullptr) return;
    out_ += R"(,"args":{)";
    bool first = true;
    auto key = [&](std::string_view name) {
      if (!first) out_ += ',';
      first = false;
      append_json_string(out_, name);
      out_ += ':';
    };
    if (record.bytes != 0) {
      key("bytes");
      fmt::format_to(std::back_inserter(out_), "{}", record.bytes);
    }
    for (std::uint8_t i = 0; i < record.arg_count; ++i) {
      key(record.args[i].key);
      fmt::format_to(std::back_inserter(out_), "{}", record.args[i].value);
    }
    if (record.text_key != nullptr) {
      key(record.text_key);
      append_json_string(out_, record.text != nullptr ? record.text : "");
    }
    out_ += '}';
  }

  std::string& out_;
  int pid_;
  std::int64_t origin_ns_;
  bool first_ = true;
};

}  // namespace

std::string trace_file_name(int rank) {
  return fmt::format("rank-{}.trace.json", rank);
}

std::string chrome_trace_json(const Snapshot& snapshot, const TraceIdentity& identity) {
  const std::int64_t origin_ns = origin_of(snapshot);
  std::string out;
  out.reserve(256 + snapshot.records.size() * 160);
  fmt::format_to(std::back_inserter(out),
                 R"({{"displayTimeUnit":"ns","distributedInfo":{{"backend":"braid","rank":{},)"
                 R"("world_size":{}}},"braid":{{"format":"braid-trace","version":1,"rank":{},)"
                 R"("world_size":{},"host":)",
                 identity.rank, identity.world_size, identity.rank, identity.world_size);
  append_json_string(out, identity.host);
  fmt::format_to(std::back_inserter(out),
                 R"(,"clock":{{"origin_ns":{},"reference_rank":{},"offset_ns":{},)"
                 R"("round_trip_ns":{}}},"overwritten_records":{}}},"traceEvents":[)",
                 origin_ns, identity.clock.reference_rank, identity.clock.offset_ns,
                 identity.clock.round_trip_ns, snapshot.overwritten);

  EventWriter writer(out, identity.rank, origin_ns);
  const std::string process = identity.host.empty()
                                  ? fmt::format("rank {}", identity.rank)
                                  : fmt::format("rank {} ({})", identity.rank, identity.host);
  writer.metadata("process_name", 0, "name", process);
  writer.metadata("process_sort_index", 0, "sort_index", identity.rank);
  for (const TrackInfo& track : snapshot.tracks) {
    const std::string name =
        track.thread ? fmt::format("{} (thread {})", track.name.empty() ? "thread" : track.name,
                                   track.os_thread_id)
                     : track.name;
    writer.metadata("thread_name", track.id, "name", name);
    // Named tracks (communicators, streams) above the threads that drive them.
    writer.metadata("thread_sort_index", track.id, "sort_index",
                    static_cast<std::int64_t>(track.id) + (track.thread ? 1000000 : 0));
  }

  // Records come ordered by track, then begin, longest first: a span nests in the open
  // spans of its track when it ends before the innermost one does.
  std::vector<std::int64_t> open_ends;
  std::uint32_t current_track = 0;
  std::uint64_t next_async_id = 1;
  for (const Record& record : snapshot.records) {
    if (record.track != current_track) {
      open_ends.clear();
      current_track = record.track;
    }
    switch (record.kind) {
      case RecordKind::instant:
        writer.instant(record);
        continue;
      case RecordKind::counter:
        writer.counter(record);
        continue;
      case RecordKind::span:
      case RecordKind::async_span:
        break;
    }
    while (!open_ends.empty() && open_ends.back() <= record.begin_ns) open_ends.pop_back();
    if (open_ends.empty() || record.end_ns <= open_ends.back()) {
      writer.complete(record);
      open_ends.push_back(record.end_ns);
    } else {
      writer.async(record, next_async_id++);
    }
  }
  out += "\n]}\n";
  return out;
}

void write_chrome_trace(const std::filesystem::path& file, const Snapshot& snapshot,
                        const TraceIdentity& identity) {
  const std::string text = chrome_trace_json(snapshot, identity);
  const std::filesystem::path temporary =
      file.string() + fmt::format(".{}.tmp", static_cast<long>(getpid()));
  {
    std::ofstream stream(temporary, std::ios::binary | std::ios::trunc);
    stream.write(text.data(), static_cast<std::streamsize>(text.size()));
    stream.close();
    if (!stream) {
      const int error = errno;
      throw Error(
          Errc::invalid_argument,
          fmt::format("cannot write the trace to {}: {}", temporary.string(), std::strerror(error)),
          {.rank = identity.rank, .operation = "trace::write"});
    }
  }
  std::error_code error;
  std::filesystem::rename(temporary, file, error);
  if (error) {
    std::filesystem::remove(temporary, error);
    throw Error(
        Errc::invalid_argument,
        fmt::format("cannot move the trace into place at {}: {}", file.string(), error.message()),
        {.rank = identity.rank, .operation = "trace::write"});
  }
}

}  // namespace braid::trace
