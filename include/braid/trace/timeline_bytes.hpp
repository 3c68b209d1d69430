// A rank's timeline as bytes, so a training program can gather every rank's timeline to
// one rank and summarise the job in-process (collectives/gather_timeline.hpp), as
// braid-trace does from the files BRAID_TRACE writes.
//
// Layout (little-endian, as every rank of a job shares the host byte order): a magic word
// and version, the rank, the overwritten-record count, the reference-clock time of the
// timeline's origin, then the tracks (id, name) and the events (name, category, track,
// begin, end, bytes, instant, args). Strings are a u32 length and the bytes.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include <braid/trace/timeline.hpp>

namespace braid::trace {

// `origin_reference_ns`: the reference rank's clock reading at this timeline's time 0
// (times in RankTimeline count from there), carried so the receiver can line ranks up.
std::string timeline_to_bytes(const RankTimeline& rank, std::int64_t origin_reference_ns);

struct RankTimelineBytes {
  RankTimeline rank;
  std::int64_t origin_reference_ns = 0;
};

// Throws braid::Error(Errc::protocol_error) for bytes that are not a timeline (truncated,
// another version, lengths past the end).
RankTimelineBytes timeline_from_bytes(std::string_view bytes);

}  // namespace braid::trace
