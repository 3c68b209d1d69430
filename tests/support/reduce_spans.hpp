// reduce_spans: the "shared_memory.reduce" spans of single-copy all-reduces in a trace
// snapshot, one per rank per all-reduce: the bytes that rank reduced, and whether it said
// it was computing while another rank was free (the "deferred" argument,
// Communicator::set_computing), for tests of who does a reduction's work.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include <braid/trace/recorder.hpp>

namespace braid::testing {

struct ReduceSpan {
  std::uint64_t bytes = 0;
  bool deferred = false;
};

inline std::vector<ReduceSpan> reduce_spans(const trace::Snapshot& snapshot) {
  std::vector<ReduceSpan> spans;
  for (const trace::Record& record : snapshot.records) {
    if (std::string_view(record.name) != "shared_memory.reduce") continue;
    ReduceSpan span{.bytes = record.bytes};
    for (std::uint8_t a = 0; a < record.arg_count; ++a) {
      if (std::string_view(record.args[a].key) == "deferred") span.deferred = true;
    }
    spans.push_back(span);
  }
  return spans;
}

}  // namespace braid::testing
