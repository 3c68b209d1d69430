// The trace files braid-trace reads: a directory of per-rank files written under
// BRAID_TRACE (chrome_trace.hpp), a file merged by `braid-trace merge`, or Chrome traces
// from elsewhere (read with no clock shift). Loading lines every file up on one time base:
// an event's reference time is its ts plus its file's shift (origin_ns + offset_ns for a
// braid rank file, 0 otherwise), and the job's origin is the earliest of those.
//
// Bad input is a TraceInputError naming the file and what is wrong with it: not JSON (or
// truncated), not an object with a "traceEvents" array, an event without a "ph", a span
// without a numeric "ts" or "dur", an "e" with no "b". An empty directory is one too.
#pragma once

#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <vector>

#include <braid/trace/timeline.hpp>

namespace braid::tools::trace_tool {

class TraceInputError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The tools read no input file larger than this: a trace of a long job is hundreds of MiB;
// /dev/zero or a mistaken path is refused after this many bytes rather than taking memory.
inline constexpr std::uintmax_t kMaxInputBytes = std::uintmax_t{1} << 30;

// The whole of `path`, or a TraceInputError naming it: it cannot be opened, or it holds more
// than `limit` bytes (a regular file's size is checked before anything is read).
std::string read_bounded(const std::filesystem::path& path, std::uintmax_t limit = kMaxInputBytes);

// A JSON library error as one plain phrase, without the library's "[json.exception...]"
// prefix: "syntax error while parsing value - invalid literal" and where.
std::string json_error_text(const nlohmann::json::exception& e);

struct TraceFile {
  std::filesystem::path path;
  nlohmann::json document;
  std::int64_t shift_ns = 0;     // added to an event's ts (in ns) to get reference time
  std::int64_t earliest_ns = 0;  // the earliest reference time of its events
  bool has_events = false;
};

class TraceSet {
 public:
  // `path`: a directory (every *.json in it, by name) or one file.
  static TraceSet load(const std::filesystem::path& path);

  const std::vector<TraceFile>& files() const noexcept { return files_; }
  // Reference time of the job's earliest event: timeline time 0.
  std::int64_t origin_ns() const noexcept { return origin_ns_; }

  // Every rank's events, aligned, from time 0.
  trace::Timeline timeline() const;
  // One Chrome trace holding every file's events, ts aligned to the job origin.
  nlohmann::json merged() const;

 private:
  std::vector<TraceFile> files_;
  std::int64_t origin_ns_ = 0;
};

}  // namespace braid::tools::trace_tool
