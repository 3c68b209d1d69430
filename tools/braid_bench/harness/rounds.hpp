// The one driver loop: every configuration of a table run `rounds` times, the configurations
// taking turns within a round, each run on a quiet machine. On a shared or throttled machine
// a slow spell then moves one round of each configuration instead of all of whichever ran
// during it; what one run leaves behind (Gloo's processes freeing gigabytes) is not charged
// to the next.
#pragma once

#include <optional>
#include <type_traits>
#include <vector>

namespace braid::bench {

// Waits until the machine's CPUs have been at least 90% idle over a 200 ms window, for at
// most 10 s, and says on stderr when they never were. Small all-reduces timed right after
// Gloo's Python processes exit ran 2x slower than the same sizes a few minutes later.
void wait_until_quiet();

// `run(config)` for each of `configs`, `rounds` times in turns; returns, per configuration in
// the order given, what its runs returned (a run that returns nullopt failed and is left out).
template <class Config, class Run>
auto run_rounds(int rounds, const std::vector<Config>& configs, Run&& run) {
  using Result = typename std::invoke_result_t<Run&, const Config&>::value_type;
  std::vector<std::vector<Result>> results(configs.size());
  for (int round = 0; round < rounds; ++round) {
    for (std::size_t c = 0; c < configs.size(); ++c) {
      wait_until_quiet();
      if (auto result = run(configs[c])) results[c].push_back(std::move(*result));
    }
  }
  return results;
}

}  // namespace braid::bench
