// Every rank's timeline on one rank, in-process: what braid-trace reads from the files
// BRAID_TRACE writes, without the files. A training program summarises its job with it
// (trace::summarize: overlap, exposed communication, and which part of it was waiting for
// a late rank, which needs every rank's arrival times on one clock).
//
//   auto clock = co_await world.clock_alignment();
//   auto timeline = co_await gather_timeline(*comm, trace::snapshot(), clock);
//   if (timeline) std::cout << trace::format_text(trace::summarize(*timeline));
//
// Collective over `comm`. Each rank sends its snapshot's events (timeline_bytes.hpp) to
// `root`; times are shifted onto one base, the reference rank's clock (`clock`, from
// World::clock_alignment; ranks of one node may pass {}), counted from the job's earliest
// event. Costs: two collectives, and the encoded snapshots (~60 bytes an event) padded to
// the largest, gathered at the root.
#pragma once

#include <optional>

#include <boost/asio/awaitable.hpp>

#include <braid/collectives/communicator.hpp>
#include <braid/trace/chrome_trace.hpp>
#include <braid/trace/recorder.hpp>
#include <braid/trace/timeline.hpp>

namespace braid::collectives {

// The job's timeline at `root` (its ranks numbered as in `comm`); nullopt elsewhere.
asio::awaitable<std::optional<trace::Timeline>> gather_timeline(Communicator& comm,
                                                                trace::Snapshot snapshot,
                                                                trace::ClockAlignment clock = {},
                                                                int root = 0);

}  // namespace braid::collectives
