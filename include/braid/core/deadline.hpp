// Every wait in braid has a deadline. A deadline is an absolute steady-clock time, so
// it can be handed down through layers without each one restarting the clock.
#pragma once

#include <chrono>

namespace braid {

using Clock = std::chrono::steady_clock;
using Deadline = Clock::time_point;

inline Deadline deadline_after(Clock::duration timeout) {
  return Clock::now() + timeout;
}

// The timeout in force for operations that were not given one: BRAID_TIMEOUT, read at
// the first call (a malformed value throws Error(invalid_environment) there).
Clock::duration default_timeout();
inline Deadline default_deadline() {
  return deadline_after(default_timeout());
}

// "The default timeout, from when the operation first has to wait": the transport reads
// the clock only for an operation that does not complete at once (a clock read costs as
// much as a short message: docs/benchmarks.md, "braid-bench p2p"; a short send or an
// already-arrived receive never needs one).
inline constexpr Deadline kDefaultDeadline = Deadline::min();

}  // namespace braid
