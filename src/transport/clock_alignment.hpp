// Clock alignment for traces: each rank's steady-clock offset against rank 0's, measured
// at start-up the way NTP does. A rank sends rank 0 a ping at t0 (its clock), rank 0
// answers with its clock t1, the answer lands at t2; if the two legs took equal time,
// rank 0's clock read t1 at local time (t0 + t2) / 2, so offset = t1 - (t0 + t2) / 2, off
// by at most half the round trip. Of kRounds samples the one with the shortest round trip
// wins (the least queueing). Ranks on one node share CLOCK_MONOTONIC, so there the offset
// comes out within a few microseconds of zero; across nodes it is what lines them up.
//
// Cost: kRounds round trips per rank, served by rank 0 one rank after another: about
// world_size * kRounds * 10 us over shared memory, once, and only when tracing to a
// directory.
#pragma once

#include <boost/asio/awaitable.hpp>

#include <braid/core/deadline.hpp>
#include <braid/trace/chrome_trace.hpp>
#include <braid/transport/ucx/ucx_worker.hpp>

namespace braid::transport::detail {

inline constexpr int kClockRounds = 16;

// Every rank of `transport` calls this at the same point; rank 0's result is {0, 0}.
asio::awaitable<trace::ClockAlignment> align_clocks(UcxWorker& transport, Deadline deadline);

}  // namespace braid::transport::detail
