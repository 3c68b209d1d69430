// What dp::BatchBalancer and dp::CadenceBalancer share: every rank's measurements gathered
// in one small all-reduce, and their exponential moving averages.
#pragma once

#include <vector>

#include <braid/collectives/communicator.hpp>

namespace braid::dp::detail {

// `mine`: this rank's k numbers. Returns every rank's, as [k][rank]: one all-reduce of
// k x ranks doubles, each rank filling its own slots (a collective).
std::vector<std::vector<double>> exchange_per_rank(collectives::Communicator& comm,
                                                   const std::vector<double>& mine);

// average[r] <- weight x now[r] + (1 - weight) x average[r]. A rank that measured nothing
// (now[r] <= 0) keeps its average; an average still at 0 takes the first measurement whole.
void smooth(std::vector<double>& average, const std::vector<double>& now, double weight);

// Whether the balancers decide again after `steps` steps (or windows): at the end of the
// calibration, then every `interval`, and only once every rank has a measurement.
bool rebalance_due(int steps, int calibration_steps, int interval,
                   const std::vector<double>& throughputs);

}  // namespace braid::dp::detail
