// braid::dp::BatchBalancer: batch shares that follow each rank's measured speed, for
// data-parallel training on ranks that compute at different rates (an older device beside
// a newer one, a node that runs hot, a rank sharing its host). With equal shares every step
// waits for the slowest rank; with shares proportional to throughput the ranks finish their
// backward together.
//
//   braid::dp::BatchBalancer balancer(comm, /*global_batch=*/256);
//   for (...) {
//     auto batch = next_batch(balancer.batch_size());          // this rank's share
//     ddp.reducer().set_batch_share(balancer.share());         // weights of the average
//     ... time forward + backward (seconds) ...
//     balancer.record_step(compute_seconds);                   // a collective
//   }
//
// Each step every rank reports its throughput (its samples / its compute seconds); one
// all-reduce of P numbers gives every rank every rank's, smoothed by an exponential moving
// average (weight `smoothing` on the newest). After `calibration_steps` and then every
// `interval` steps the shares become proportional to the smoothed throughputs, no rank's
// below `floor` x the equal share, and are turned into whole batch sizes that add up to
// the global batch (largest remainders). The same numbers reach every rank, so every rank
// computes the same sizes. A dead band keeps shares still when no size would move by more
// than `dead_band` of the equal share (equally fast ranks stay equal under noise), and a
// rank that stalls once moves the average by `smoothing` of one step, which the next steps
// take back: it does not lose its share for good.
//
// The gradient average: with each rank's loss the mean over its own samples and the
// reducer's set_batch_share(share) (share = its samples / the global batch), DDP's weighted
// sum is exactly the gradient of the mean loss over the whole global batch, what one
// process would compute on it.
//
// Cost per step: one all-reduce of P doubles. Decisions are logged (info) and traced as a
// counter per rank ("balance share r", in per mille of the global batch).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include <braid/collectives/communicator.hpp>
#include <braid/core/config.hpp>

namespace braid::dp {

// The defaults are the knobs' (BRAID_BALANCE_*, in the one knob table).
struct BatchBalancerOptions {
  int calibration_steps = 5;  // steps measured before the first rebalance
  int interval = 10;          // steps between rebalances after that
  double smoothing = 0.3;     // weight of the newest step in the moving average
  double floor = 0.1;         // no rank's share below this x the equal share
  double dead_band = 0.05;    // no change while every size would move less than this x equal

  // BRAID_BALANCE_CALIBRATION, _INTERVAL, _SMOOTHING, _FLOOR and _DEAD_BAND, unset ones at
  // their defaults. A malformed value is Error(invalid_environment) naming the variable.
  static BatchBalancerOptions from_environment(
      const config::EnvLookup& env = config::process_env());
};

class BatchBalancer {
 public:
  // Throws Error(invalid_argument) for a global batch smaller than the ranks, or options
  // outside their ranges (named in the message).
  BatchBalancer(std::shared_ptr<collectives::Communicator> comm, std::int64_t global_batch,
                BatchBalancerOptions options = {});

  std::int64_t batch_size() const { return sizes_.at(static_cast<std::size_t>(comm_->rank())); }
  // This rank's share of the global batch: batch_size() / global_batch().
  double share() const;
  const std::vector<std::int64_t>& batch_sizes() const noexcept { return sizes_; }
  std::int64_t global_batch() const noexcept { return global_batch_; }
  // The smoothed throughput (samples per second) of every rank; 0 before the first step.
  const std::vector<double>& throughputs() const noexcept { return smoothed_; }

  // After a step: the seconds this rank computed its batch_size() samples. A collective.
  // Returns true when the sizes changed (from the next step on).
  bool record_step(double compute_seconds);

  // The sizes for `weights` (any positive numbers, one per rank) that add up to `total`:
  // proportional, none below floor x total / ranks (and none below 1), largest remainders.
  static std::vector<std::int64_t> sizes_for(const std::vector<double>& weights, std::int64_t total,
                                             double floor);

 private:
  std::shared_ptr<collectives::Communicator> comm_;
  std::int64_t global_batch_;
  BatchBalancerOptions options_;
  std::vector<std::int64_t> sizes_;
  std::vector<double> smoothed_;
  int steps_ = 0;
};

}  // namespace braid::dp
