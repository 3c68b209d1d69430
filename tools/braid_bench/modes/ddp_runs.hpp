// What braid-bench ddp's reports share (ddp.cpp, ddp_balance.cpp): the run's options and
// one run of braid-bench-ddp-worker under braid-run.
//
// ddp: one model and batch trained three ways in one run -- braid's DistributedDataParallel
// (the main job's loop, braid-bench-ddp-worker), PyTorch DDP with Gloo (peers/ddp_torch.py)
// and no gradient sync at all -- with step times, the communication each DDP leaves exposed
// (its step time minus the no-sync step time), the bare all-reduce of all gradients, and
// braid's ratios to PyTorch.
// ddp --balance: the same job with a slower last rank three ways in one run -- equal batch
// shares, dp::BatchBalancer's shares and dp::CadenceBalancer's windows -- beside the ideal
// step (the global batch over the sum of the ranks' measured throughputs), each figure the
// mean over interleaved rounds.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace braid::bench {

struct DdpOptions {
  int ranks = 2;
  int hidden = 1024;
  int layers = 8;
  int batch = 0;  // 0: 32, or 128 with --balance (balancing is for compute-bound steps)
  int steps = 30;
  int rounds = 3;
  std::vector<std::string> optimizers{"sgd", "adam"};
  std::string optimizer = "sgd";  // the one being run
  double straggle_ms = 0;         // the last rank computes this much more before each backward
  bool balance = false;           // equal shares against the balancers, instead of DDP's figures
  std::string device = "cpu";     // cuda: each rank on GPU LOCAL_RANK (modulo the GPUs)
};

// Prints the --balance table for `o` (its optimizer, model, ranks, rounds, steps and
// straggler); returns the process exit code.
int report_ddp_balance(const DdpOptions& o);

// braid-bench-ddp-worker --sync `sync` with `o`'s model, steps and straggler, and `extra`
// arguments: the JSON line it printed, or nullopt (its output shown on stderr).
std::optional<std::string> run_braid(const DdpOptions& o, const std::string& sync,
                                     const std::vector<std::string>& extra = {});

}  // namespace braid::bench
