// braid-bench ddp --balance: the same data-parallel job with a slower last rank three ways
// in one run -- equal batch shares, dp::BatchBalancer's shares and dp::CadenceBalancer's
// windows -- beside the ideal step (the global batch over the sum of the ranks' measured
// throughputs), each figure the mean over interleaved rounds.
#pragma once

#include "ddp_runs.hpp"

namespace braid::bench {

// Prints the table for `o` (its optimizer, model, ranks, rounds, steps and straggler);
// returns the process exit code.
int report_ddp_balance(const DdpOptions& o);

}  // namespace braid::bench
