#include <algorithm>
#include <cmath>
#include <numeric>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <braid/core/error.hpp>
#include <braid/core/log.hpp>
#include <braid/dp/cadence_balancer.hpp>
#include <braid/trace/span.hpp>

#include "dp/rank_measurements.hpp"

namespace braid::dp {

CadenceOptions CadenceOptions::from_environment(const config::EnvLookup& env) {
  return {.measure = BatchBalancerOptions::from_environment(env),
          .anchor = static_cast<int>(config::int_value("BRAID_BALANCE_ANCHOR", env)),
          .max_anchor = static_cast<int>(config::int_value("BRAID_BALANCE_MAX_ANCHOR", env)),
          .overhead_target = config::number_value("BRAID_BALANCE_OVERHEAD_TARGET", env)};
}

CadenceBalancer::CadenceBalancer(std::shared_ptr<collectives::Communicator> comm,
                                 std::int64_t micro_batch, CadenceOptions options)
    : comm_(std::move(comm)),
      micro_batch_(micro_batch),
      options_(options),
      anchor_(options.anchor) {
  const BatchBalancerOptions& m = options_.measure;
  if (micro_batch_ < 1 || options_.anchor < 1 || options_.max_anchor < options_.anchor ||
      !(options_.overhead_target > 0) || options_.overhead_target >= 1 || m.calibration_steps < 1 ||
      m.interval < 1 || !(m.smoothing > 0) || m.smoothing > 1 || m.dead_band < 0) {
    throw Error(
        Errc::invalid_argument,
        fmt::format("micro_batch {} and anchor {} must be at least 1, max_anchor {} at "
                    "least the anchor, overhead_target {} in (0, 1), calibration_steps "
                    "{} and interval {} at least 1, smoothing {} in (0, 1], dead_band "
                    "{} >= 0",
                    micro_batch_, options_.anchor, options_.max_anchor, options_.overhead_target,
                    m.calibration_steps, m.interval, m.smoothing, m.dead_band),
        {.rank = comm_->world_rank(comm_->rank()), .operation = "CadenceBalancer"});
  }
  const auto ranks = static_cast<std::size_t>(comm_->size());
  counts_.assign(ranks, anchor_);
  throughput_.assign(ranks, 0.0);
  sync_seconds_.assign(ranks, 0.0);
}

std::int64_t CadenceBalancer::window_samples() const {
  return micro_batch_ * std::accumulate(counts_.begin(), counts_.end(), std::int64_t{0});
}

double CadenceBalancer::share() const {
  return static_cast<double>(micro_batches() * micro_batch_) /
         static_cast<double>(window_samples());
}

std::vector<int> CadenceBalancer::counts_for(const std::vector<double>& throughputs, int anchor,
                                             const std::vector<int>& current, double dead_band) {
  const double slowest = *std::min_element(throughputs.begin(), throughputs.end());
  std::vector<int> counts(throughputs.size());
  for (std::size_t r = 0; r < throughputs.size(); ++r) {
    if (throughputs[r] == slowest) {  // the slowest rank computes the anchor, always
      counts[r] = anchor;
      continue;
    }
    const double ideal = anchor * throughputs[r] / slowest;
    const bool keep = r < current.size() && std::abs(ideal - current[r]) <= 0.5 + dead_band * ideal;
    counts[r] = keep ? current[r] : std::max(1, static_cast<int>(std::lround(ideal)));
  }
  return counts;
}

bool CadenceBalancer::record_window(double compute_seconds, double window_seconds) {
  const int mine = micro_batches();
  const auto all = detail::exchange_per_rank(
      *comm_, {compute_seconds > 0 ? mine / compute_seconds : 0.0,
               compute_seconds > 0 ? std::max(window_seconds - compute_seconds, 1e-9) : 0.0});
  const BatchBalancerOptions& m = options_.measure;
  detail::smooth(throughput_, all[0], m.smoothing);
  detail::smooth(sync_seconds_, all[1], m.smoothing);
  ++windows_;
  const auto slowest = static_cast<std::size_t>(
      std::min_element(throughput_.begin(), throughput_.end()) - throughput_.begin());
  // The synchronisation's own cost: the wait of the rank that waited least (the slowest,
  // whose window is its compute and the all-reduce).
  const double sync = *std::min_element(sync_seconds_.begin(), sync_seconds_.end());
  const double per_micro_batch = throughput_[slowest] > 0 ? 1 / throughput_[slowest] : 0;
  overhead_ = per_micro_batch > 0 ? sync / (anchor_ * per_micro_batch + sync) : 0;
  if (!detail::rebalance_due(windows_, m.calibration_steps, m.interval, throughput_)) return false;
  // The smallest anchor whose window keeps sync / (anchor x per_micro_batch + sync) at or
  // under the target.
  const double target = options_.overhead_target;
  // (Clamped as a double: a tiny per-micro-batch time would overflow an int.)
  const int meets_target = static_cast<int>(
      std::clamp(std::ceil(sync * (1 - target) / (target * per_micro_batch) - 1e-9), 1.0,
                 static_cast<double>(options_.max_anchor)));
  int anchor = anchor_;
  if (overhead_ > target) anchor = std::max(anchor_, meets_target);
  if (overhead_ < target / 2) anchor = std::min(anchor_, meets_target);
  std::vector<int> counts = counts_for(
      throughput_, anchor, anchor == anchor_ ? counts_ : std::vector<int>{}, m.dead_band);
  if (anchor == anchor_ && counts == counts_) return false;
  anchor_ = anchor;
  counts_ = std::move(counts);
  log::info(
      "cadence balancer, window {}: throughputs [{:.1f}] micro-batches/s, synchronisation {:.0f}% "
      "of a window, anchor {}, micro-batches per window now [{}]",
      windows_, fmt::join(throughput_, ", "), 100 * overhead_, anchor_, fmt::join(counts_, ", "));
  trace::counter(trace::Category::user, trace::intern("cadence anchor"), anchor_);
  for (std::size_t r = 0; r < counts_.size(); ++r) {
    trace::counter(trace::Category::user, trace::intern(fmt::format("cadence micro-batches {}", r)),
                   counts_[r]);
  }
  return true;
}

}  // namespace braid::dp
