#include "dp/rank_measurements.hpp"

#include <algorithm>

namespace braid::dp::detail {

std::vector<std::vector<double>> exchange_per_rank(collectives::Communicator& comm,
                                                   const std::vector<double>& mine) {
  const auto ranks = static_cast<std::size_t>(comm.size());
  const auto me = static_cast<std::size_t>(comm.rank());
  std::vector<double> all(mine.size() * ranks, 0.0);
  for (std::size_t k = 0; k < mine.size(); ++k) all[k * ranks + me] = mine[k];
  comm.launch(comm.all_reduce(Buffer(all), ReduceOp::sum)).get();
  std::vector<std::vector<double>> by_kind(mine.size());
  for (std::size_t k = 0; k < mine.size(); ++k) {
    by_kind[k].assign(all.begin() + static_cast<std::ptrdiff_t>(k * ranks),
                      all.begin() + static_cast<std::ptrdiff_t>((k + 1) * ranks));
  }
  return by_kind;
}

void smooth(std::vector<double>& average, const std::vector<double>& now, double weight) {
  for (std::size_t r = 0; r < now.size(); ++r) {
    if (now[r] <= 0) continue;
    average[r] = average[r] == 0 ? now[r] : weight * now[r] + (1 - weight) * average[r];
  }
}

bool rebalance_due(int steps, int calibration_steps, int interval,
                   const std::vector<double>& throughputs) {
  return steps >= calibration_steps && (steps - calibration_steps) % interval == 0 &&
         std::all_of(throughputs.begin(), throughputs.end(), [](double t) { return t > 0; });
}

}  // namespace braid::dp::detail
