// braid::dp::CadenceBalancer: data parallelism where ranks of different speeds synchronise
// less often, each computing as many micro-batches between synchronisations as its speed
// allows. The slowest rank computes `anchor` micro-batches per window, the others
// proportionally more (a rank twice as fast, twice as many), accumulating gradients locally
// (DDP's no_sync()) and synchronising once at the window's last backward, weighted by the
// samples each rank computed. The anchor adapts so that the synchronisation's share of a
// window stays under `overhead_target`: where the all-reduce is cheap beside one
// micro-batch the ranks synchronise every micro-batch, where it is dear they accumulate.
//
//   braid::dp::CadenceBalancer cadence(comm, /*micro_batch=*/32);
//   for (...) {                                       // one window, one optimizer step
//     const int count = cadence.micro_batches();      // this rank's, this window
//     ddp.reducer().set_batch_share(cadence.share()); // its samples / the window's
//     for (int i = 0; i < count; ++i) {
//       auto local = i + 1 < count ? ddp.no_sync() : ...;   // the last one synchronises
//       (loss(next_micro_batch()) / count).backward();
//     }
//     optimizer.step();
//     cadence.record_window(compute_seconds, window_seconds);  // a collective
//   }
//
// What the update is: with each micro-batch's loss the mean over its samples divided by
// the rank's count, and the share its samples / the window's, DDP's weighted sum is exactly
// the gradient of the mean loss over every sample of the window, on every rank alike: all
// ranks hold the same parameters after each window (this is gradient accumulation, not
// local SGD; nothing is stale). Its effect on convergence is that of a larger and varying
// batch: one update per window of anchor x (sum of the speed ratios) micro-batches, so
// fewer updates per epoch than synchronising every micro-batch (scale the learning rate
// with the window's samples, as for any large batch), and the faster ranks draw more
// samples per window (a sampler over the whole dataset, not fixed equal shards per rank,
// keeps every sample seen equally often).
//
// The measures: each window every rank reports its compute seconds (forward and backward
// of its micro-batches) and the window's wall seconds up to the synchronisation's end;
// one all-reduce of 2 x P numbers gives every rank all of them, smoothed as
// BatchBalancer's throughputs (`smoothing`). After `calibration_steps` windows and then
// every `interval` windows the counts are recomputed: the slowest rank's throughput sets
// the anchor's unit; a count moves only when its ideal differs from it by more than half a
// micro-batch plus `dead_band` of it (equally fast ranks stay equal under noise). The
// overhead is measured on the rank that waited least (the slowest; its window minus its
// compute is the synchronisation itself): over the target the anchor rises to the smallest
// that meets it (at most `max_anchor`); under half the target it falls to that smallest.
//
// Cost per window: one all-reduce of 2 x P doubles. Decisions are logged (info) and traced
// as counters ("cadence micro-batches r", "cadence anchor").
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include <braid/collectives/communicator.hpp>
#include <braid/core/config.hpp>
#include <braid/dp/batch_balancer.hpp>

namespace braid::dp {

// The defaults are the knobs' (BRAID_BALANCE_*, in the one knob table).
struct CadenceOptions {
  // calibration_steps, interval, smoothing and dead_band count windows; floor is unused
  // (the slowest rank always computes the anchor).
  BatchBalancerOptions measure;
  int anchor = 1;                // the slowest rank's micro-batches per window, at first
  int max_anchor = 8;            // the most the anchor may rise to
  double overhead_target = 0.1;  // the synchronisation's share of a window to stay under

  // BRAID_BALANCE_CALIBRATION, _INTERVAL, _SMOOTHING, _DEAD_BAND, _ANCHOR, _MAX_ANCHOR and
  // _OVERHEAD_TARGET, unset ones at their defaults. A malformed value is
  // Error(invalid_environment) naming the variable.
  static CadenceOptions from_environment(const config::EnvLookup& env = config::process_env());
};

class CadenceBalancer {
 public:
  // Throws Error(invalid_argument) for a micro-batch below 1 or options outside their ranges
  // (named in the message).
  CadenceBalancer(std::shared_ptr<collectives::Communicator> comm, std::int64_t micro_batch,
                  CadenceOptions options = {});

  // This rank's micro-batches in the coming window.
  int micro_batches() const { return counts_.at(static_cast<std::size_t>(comm_->rank())); }
  const std::vector<int>& counts() const noexcept { return counts_; }
  int anchor() const noexcept { return anchor_; }
  std::int64_t micro_batch() const noexcept { return micro_batch_; }
  // Every rank's samples in the coming window.
  std::int64_t window_samples() const;
  // This rank's share of them: its micro_batches() x micro_batch() / window_samples().
  double share() const;
  // The synchronisation's share of a window, smoothed, as last measured (0 before).
  double overhead() const noexcept { return overhead_; }

  // After a window: the seconds this rank computed its micro-batches, and the window's wall
  // seconds up to the end of its synchronisation. A collective. Returns true when the counts
  // or the anchor changed (from the next window on).
  bool record_window(double compute_seconds, double window_seconds);

  // The counts for an anchor and every rank's throughput (any positive numbers): the slowest
  // rank `anchor`, rank r anchor x throughput[r] / slowest, rounded to the nearest, at least
  // 1; a count within half a micro-batch plus dead_band of its ideal keeps its `current`
  // value. Rounding up may make a faster rank's part of the window a little longer than the
  // slowest rank's, the window being the longest; it still computes more samples per second
  // than rounding down (a rank 1.5x as fast: 3 micro-batches in 1.33 windows' time, not 2
  // in 1).
  static std::vector<int> counts_for(const std::vector<double>& throughputs, int anchor,
                                     const std::vector<int>& current, double dead_band);

 private:
  std::shared_ptr<collectives::Communicator> comm_;
  std::int64_t micro_batch_;
  CadenceOptions options_;
  int anchor_;
  std::vector<int> counts_;
  std::vector<double> throughput_;    // smoothed micro-batches per compute second, per rank
  std::vector<double> sync_seconds_;  // smoothed window - compute seconds, per rank
  double overhead_ = 0;
  int windows_ = 0;
};

}  // namespace braid::dp
