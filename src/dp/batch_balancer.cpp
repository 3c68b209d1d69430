#include <algorithm>
#include <cmath>
#include <numeric>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <braid/core/error.hpp>
#include <braid/core/log.hpp>
#include <braid/dp/batch_balancer.hpp>
#include <braid/trace/span.hpp>

#include "dp/rank_measurements.hpp"

namespace braid::dp {
namespace {

[[noreturn]] void refuse(const collectives::Communicator& comm, std::string what) {
  throw Error(Errc::invalid_argument, std::move(what),
              {.rank = comm.world_rank(comm.rank()), .operation = "BatchBalancer"});
}

}  // namespace

BatchBalancerOptions BatchBalancerOptions::from_environment(const config::EnvLookup& env) {
  return {
      .calibration_steps = static_cast<int>(config::int_value("BRAID_BALANCE_CALIBRATION", env)),
      .interval = static_cast<int>(config::int_value("BRAID_BALANCE_INTERVAL", env)),
      .smoothing = config::number_value("BRAID_BALANCE_SMOOTHING", env),
      .floor = config::number_value("BRAID_BALANCE_FLOOR", env),
      .dead_band = config::number_value("BRAID_BALANCE_DEAD_BAND", env)};
}

BatchBalancer::BatchBalancer(std::shared_ptr<collectives::Communicator> comm,
                             std::int64_t global_batch, BatchBalancerOptions options)
    : comm_(std::move(comm)), global_batch_(global_batch), options_(options) {
  const int ranks = comm_->size();
  if (global_batch_ < ranks) {
    refuse(*comm_,
           fmt::format("global batch {} is smaller than the {} ranks", global_batch_, ranks));
  }
  if (options_.calibration_steps < 1 || options_.interval < 1 || !(options_.smoothing > 0) ||
      options_.smoothing > 1 || options_.floor < 0 || options_.floor > 1 ||
      options_.dead_band < 0) {
    refuse(*comm_, fmt::format("calibration_steps {} and interval {} must be at least 1, "
                               "smoothing {} in (0, 1], floor {} in [0, 1], dead_band {} >= 0",
                               options_.calibration_steps, options_.interval, options_.smoothing,
                               options_.floor, options_.dead_band));
  }
  sizes_ = sizes_for(std::vector<double>(static_cast<std::size_t>(ranks), 1.0), global_batch_,
                     options_.floor);
  smoothed_.assign(static_cast<std::size_t>(ranks), 0.0);
}

double BatchBalancer::share() const {
  return static_cast<double>(batch_size()) / static_cast<double>(global_batch_);
}

std::vector<std::int64_t> BatchBalancer::sizes_for(const std::vector<double>& weights,
                                                   std::int64_t total, double floor) {
  const auto ranks = static_cast<std::int64_t>(weights.size());
  const double least =
      std::max(1.0, floor * static_cast<double>(total) / static_cast<double>(ranks));
  // Proportional shares, then every one lifted to the floor, the lift paid by the others in
  // proportion (repeated: a share paying for the lift may fall to the floor in turn).
  std::vector<double> ideal(weights.size());
  const double sum = std::accumulate(weights.begin(), weights.end(), 0.0);
  for (std::size_t r = 0; r < weights.size(); ++r) ideal[r] = total * weights[r] / sum;
  std::vector<bool> pinned(weights.size(), false);
  for (bool moved = true; moved;) {
    moved = false;
    double free_total = 0, pinned_total = 0;
    for (std::size_t r = 0; r < ideal.size(); ++r) {
      if (!pinned[r] && ideal[r] < least) {
        pinned[r] = true;
        moved = true;
      }
      (pinned[r] ? pinned_total : free_total) += pinned[r] ? least : weights[r];
    }
    if (!moved) break;
    for (std::size_t r = 0; r < ideal.size(); ++r) {
      ideal[r] =
          pinned[r] ? least : (static_cast<double>(total) - pinned_total) * weights[r] / free_total;
    }
  }
  // Whole sizes: floors, then the remainders to the largest fractions (ties to lower ranks).
  std::vector<std::int64_t> sizes(weights.size());
  std::int64_t given = 0;
  for (std::size_t r = 0; r < ideal.size(); ++r) {
    sizes[r] = std::max<std::int64_t>(1, static_cast<std::int64_t>(std::floor(ideal[r])));
    given += sizes[r];
  }
  std::vector<std::size_t> order(weights.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    return ideal[a] - std::floor(ideal[a]) > ideal[b] - std::floor(ideal[b]);
  });
  for (std::size_t k = 0; given < total; k = (k + 1) % order.size(), ++given) ++sizes[order[k]];
  for (std::size_t k = order.size(); given > total; ++k) {  // only where every size was 1
    auto& s = sizes[order[k % order.size()]];
    if (s > 1) {
      --s;
      --given;
    }
  }
  return sizes;
}

bool BatchBalancer::record_step(double compute_seconds) {
  const int ranks = comm_->size();
  const double mine =
      compute_seconds > 0 ? static_cast<double>(batch_size()) / compute_seconds : 0.0;
  detail::smooth(smoothed_, detail::exchange_per_rank(*comm_, {mine})[0], options_.smoothing);
  ++steps_;
  if (!detail::rebalance_due(steps_, options_.calibration_steps, options_.interval, smoothed_)) {
    return false;
  }
  std::vector<std::int64_t> proposed = sizes_for(smoothed_, global_batch_, options_.floor);
  const double equal = static_cast<double>(global_batch_) / ranks;
  std::int64_t largest_move = 0;
  for (std::size_t r = 0; r < proposed.size(); ++r) {
    largest_move = std::max(largest_move, std::abs(proposed[r] - sizes_[r]));
  }
  if (static_cast<double>(largest_move) <= options_.dead_band * equal) return false;
  sizes_ = std::move(proposed);
  log::info("batch balancer, step {}: throughputs [{:.1f}] samples/s, batch sizes now [{}]", steps_,
            fmt::join(smoothed_, ", "), fmt::join(sizes_, ", "));
  for (std::size_t r = 0; r < sizes_.size(); ++r) {
    trace::counter(trace::Category::user, trace::intern(fmt::format("balance share {}", r)),
                   1000 * sizes_[r] / global_batch_);
  }
  return true;
}

}  // namespace braid::dp
