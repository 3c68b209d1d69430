// braid-bench ddp --balance: the same data-parallel job with a slower last rank three ways
// in one run -- equal batch shares, dp::BatchBalancer's shares and dp::CadenceBalancer's
// windows -- beside the ideal step (the global batch over the sum of the ranks' measured
// throughputs), each figure the mean over interleaved rounds.
#pragma once

#include <string>
#include <vector>

namespace braid::bench {

struct BalanceRun {
  int ranks = 2;
  int rounds = 3;
  int steps = 30;
  double straggle_ms = 0;          // per --batch samples on the last rank
  std::vector<std::string> model;  // the worker's model and optimizer arguments
};

// Prints the table; returns the process exit code.
int report_ddp_balance(const BalanceRun& run);

}  // namespace braid::bench
