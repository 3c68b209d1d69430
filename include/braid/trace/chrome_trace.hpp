// A Snapshot as Chrome Trace Event JSON, the format chrome://tracing, Perfetto and
// PyTorch's Holistic Trace Analysis read. One file per rank:
//
//   {"displayTimeUnit": "ns",
//    "distributedInfo": {"backend": "braid", "rank": 1, "world_size": 4},
//    "braid": {"format": "braid-trace", "version": 1, "rank": 1, "world_size": 4,
//              "host": "node7",
//              "clock": {"origin_ns": ..., "reference_rank": 0, "offset_ns": ...,
//                        "round_trip_ns": ...}},
//    "traceEvents": [ ... ]}
//
// pid is the rank, tid the track (a thread, a communicator, a stream); process and thread
// names and sort order are "M" metadata events. Times are microseconds with three
// decimals, counted from clock.origin_ns on this rank's steady clock. Adding offset_ns
// gives the reference rank's clock, so `braid-trace merge` can line ranks up: the
// reference time of an event is origin_ns + ts * 1000 + offset_ns.
//
// Spans that nest on their track are complete ("X") events. Async spans that overlap
// others on their track without nesting (two collectives in flight on one communicator)
// are "b"/"e" pairs with an id, which viewers draw on rows of their own.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>

#include <braid/trace/recorder.hpp>

namespace braid::trace {

// How this rank's steady clock relates to the reference rank's, measured at start-up by
// round trips (the sample with the shortest round trip wins; its error is at most half
// of it).
struct ClockAlignment {
  int reference_rank = 0;
  std::int64_t offset_ns = 0;      // reference clock = this rank's clock + offset_ns
  std::int64_t round_trip_ns = 0;  // of the sample the offset came from; 0: not measured
};

// Who wrote a trace.
struct TraceIdentity {
  int rank = 0;
  int world_size = 1;
  std::string host;
  ClockAlignment clock;
};

// The JSON text of `snapshot`. origin_ns is the earliest record's begin (now_ns() when
// there are none).
std::string chrome_trace_json(const Snapshot& snapshot, const TraceIdentity& identity);

// Writes chrome_trace_json() to `file` through a temporary file and a rename, so a reader
// never sees half a trace. Throws braid::Error naming the file when it cannot.
void write_chrome_trace(const std::filesystem::path& file, const Snapshot& snapshot,
                        const TraceIdentity& identity);

// "rank-<r>.trace.json": the name of rank r's file in a trace directory.
std::string trace_file_name(int rank);

}  // namespace braid::trace
