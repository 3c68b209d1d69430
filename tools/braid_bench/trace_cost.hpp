// braid-bench trace-cost: what tracing costs. In process: ns per span with tracing off
// and on. Under braid-run: an all-reduce loop timed in ~2 ms batches that alternate
// tracing off and on (off, on, on, off: so drift in the machine's load hits both alike),
// reported as time per iteration, the median group's overhead in percent, and
// spans recorded per iteration; once as a trace records by default (small calls sampled)
// and once with every call recorded.
#pragma once

#include <string>
#include <vector>

namespace braid::bench {

// Entry point for `braid-bench trace-cost ...`; returns the process exit code.
int run_trace_cost(const std::vector<std::string>& args);

}  // namespace braid::bench
