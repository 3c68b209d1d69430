// What braid-bench ddp's reports share (ddp.cpp, ddp_balance.cpp): the run's options and
// one run of braid-bench-ddp-worker under braid-run.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace braid::bench {

struct DdpOptions {
  int ranks = 2;
  int hidden = 1024;
  int layers = 8;
  int batch = 32;
  int steps = 30;
  int rounds = 3;
  std::string optimizer = "sgd";
  double straggle_ms = 0;      // the last rank computes this much more before each backward
  bool balance = false;        // equal shares against the balancers, instead of DDP's figures
  std::string device = "cpu";  // cuda: each rank on GPU LOCAL_RANK (modulo the GPUs)
};

// braid-bench-ddp-worker --sync `sync` with `o`'s model, steps and straggler, and `extra`
// arguments: the JSON line it printed, or nullopt (its output shown on stderr).
std::optional<std::string> run_braid(const DdpOptions& o, const std::string& sync,
                                     const std::vector<std::string>& extra = {});

}  // namespace braid::bench
