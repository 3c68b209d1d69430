// A compute span that also records how long its thread spent off its core while it ran:
// argument "off_core_ns", wall time minus the thread's CPU time. Overlap counts the
// communication that ran beside compute as hidden, and on a GPU, or on a CPU with a core to
// spare, it is. Where the reduction runs on the very core the compute needs (braid's
// runtime thread folding a bucket on a machine that training fills), the compute stops
// while it does, and this argument shows that time; `braid-trace summary` adds it up per
// rank ("off-core").
//
//   trace::ComputeSpan backward("backward");   // on the thread that computes
//   ...
//   backward.end();                             // on the same thread
//
// It is an upper bound on what communication cost the compute: off-core time also counts
// any wait inside the span (a lock, a blocking call, a page fault served from disk, other
// processes taking the core, a thread waiting for intra-op workers or a GPU). Ended on
// another thread than it began on, it records no argument (the CPU clock is per thread).
//
// Cost with tracing on: two reads of the thread's CPU clock, a system call each (~0.2-0.5
// us on the dev VM), beside the span's own cost. Off: a function call and the enabled()
// load.
#pragma once

#include <cstdint>
#include <thread>

#include <braid/trace/span.hpp>

namespace braid::trace {

class ComputeSpan {
 public:
  ComputeSpan() noexcept = default;  // records nothing
  explicit ComputeSpan(Name name, Track track = {}) noexcept;
  ComputeSpan(ComputeSpan&& other) noexcept = default;
  ComputeSpan& operator=(ComputeSpan&& other) noexcept;
  ~ComputeSpan() { end(); }

  // One number to show with the span ("step", 12); the span's other argument slot holds
  // off_core_ns, so a second call is ignored.
  void arg(Name key, std::int64_t value) noexcept;
  void end() noexcept;

 private:
  AsyncSpan span_;
  std::thread::id thread_;
  std::int64_t wall_start_ns_ = 0;
  std::int64_t cpu_start_ns_ = 0;
  bool has_user_arg_ = false;
};

}  // namespace braid::trace
