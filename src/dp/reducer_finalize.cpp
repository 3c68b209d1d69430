// Reducer's end of an iteration (<braid/dp/reducer.hpp>): the check that the previous one
// finished, waiting for the buckets' reductions (bounded where one failed), writing the
// results back to the gradients, and, after the first synchronised iteration, rebuilding
// the buckets in the order rank 0's gradients arrived.
#include <algorithm>
#include <chrono>
#include <exception>

#include <fmt/format.h>

#include <braid/core/error.hpp>
#include <braid/core/log.hpp>
#include <braid/dp/reducer.hpp>

#include "dp/reducer_internal.hpp"
#include "dp/scaled_copy.hpp"

namespace braid::dp {

using detail::describe;
using detail::misuse;

void Reducer::check_previous_finished() const {
  if (failed_) {
    // The buckets that did finish moved on; the ranks' collectives no longer pair up.
    throw Error(failed_->code(),
                fmt::format("the previous iteration's gradient reduction failed ({}); the ranks' "
                            "buckets no longer pair up: make a new communicator and "
                            "DistributedDataParallel to go on",
                            failed_->what()),
                {.rank = comm_->world_rank(comm_->rank()),
                 .peer = failed_->context().peer,
                 .operation = "ddp"});
  }
  if (state_ == State::backward) {
    misuse(*comm_,
           "the previous iteration's gradient reduction did not finish: every forward through "
           "DistributedDataParallel needs its backward() before the next forward, run to its "
           "end (a backward that threw leaves it unfinished; use no_sync() to accumulate, or "
           "find_unused_parameters if some parameters get no gradient)");
  }
}

void Reducer::wait_for_reductions() {
  try {
    for (auto& bucket : buckets_) bucket->reduction->get();
    if (used_reduction_) used_reduction_->get();
  } catch (const std::exception& e) {
    const auto* error = dynamic_cast<const Error*>(&e);
    failed_ = error != nullptr
                  ? *error
                  : Error(Errc::invalid_argument, e.what(),
                          {.rank = comm_->world_rank(comm_->rank()), .operation = "ddp comm hook"});
    // The other buckets' reductions may still write into the buckets, which may be the
    // gradients: let them end (the failure usually fails them fast) before the caller
    // sees the error. Bounded, as in the destructor.
    settle_reductions();
    throw;
  }
}

void Reducer::producer_follows_reductions() {
  if (device_ == nullptr) return;
  // The collectives are done; hooks' kernels may still be queued on the buckets' streams:
  // what the producer stream does next (the write-back, the optimizer, the next
  // iteration's copies into the buckets) follows them.
  Stream& producer = device_->producer();
  for (auto& bucket : buckets_) {
    bucket->data.stream()->record(*bucket->reduced);
    producer.wait(*bucket->reduced);
  }
}

void Reducer::settle_reductions() noexcept {
  for (auto& bucket : buckets_) {
    if (bucket->reduction && !bucket->reduction->wait_for(std::chrono::seconds(30))) {
      log::warn("ddp: a bucket reduction was still running after 30 s; its bucket is left to it");
    }
  }
  if (used_reduction_) (void)used_reduction_->wait_for(std::chrono::seconds(30));
}

void Reducer::end_iteration() {
  state_ = State::idle;
  shadowing_ = false;
  if (!first_sync_done_) {
    // Where rank 0 shadowed this iteration it saw no gradient arrive: every rank learns
    // that from the broadcast alike and waits for a synchronised iteration rank 0 trains.
    first_sync_done_ = !options_.rebuild_buckets || rebuild_from_arrival_order();
  }
}

void Reducer::finalize() {
  if (state_ == State::accumulating) {
    state_ = State::idle;
    return;
  }
  if (state_ == State::idle) return;  // nothing prepared: a backward outside the wrapper
  comm_->set_computing(false);        // backward is over: this rank only waits now
  {
    std::lock_guard lock(mutex_);
    std::vector<std::string> missing;
    for (std::size_t i = 0; i < parameters_.size(); ++i) {
      if (ready_[i] == 0) missing.push_back(describe(parameters_[i], i));
    }
    if (!missing.empty()) {
      // The iteration stays unfinished: the next forward says so too.
      const std::size_t shown = std::min<std::size_t>(missing.size(), 5);
      std::string names;
      for (std::size_t i = 0; i < shown; ++i) names += (i ? ", " : "") + missing[i];
      if (shown < missing.size()) names += fmt::format(" and {} more", missing.size() - shown);
      misuse(*comm_, fmt::format("backward ended with {} parameter(s) still waiting for a "
                                 "gradient: {}. Parameters the forward does not use need "
                                 "find_unused_parameters",
                                 missing.size(), names));
    }
  }
  wait_for_reductions();
  producer_follows_reductions();
  {
    trace::Span write_back(trace::Category::bucket, "bucket.write_back", track_);
    for (std::size_t i = 0; i < parameters_.size(); ++i) {
      // Unused on every rank: nobody has a gradient for it; leave it as it is.
      if (used_reduction_ && locally_used_[i] == 0) continue;
      const Bucket& bucket = *buckets_[bucket_of_[i]];
      const std::optional<Buffer> gradient = access_.gradient(i, true);
      if (gradient) copy_scaled(*gradient, bucket.slot(slot_of_[i], parameters_[i].count), 1.0);
    }
    for (const KeptGradient& kept : unused_gradients_) {
      if (locally_used_[kept.index] != 0) continue;  // some rank used it: it takes the average
      const std::optional<Buffer> gradient = access_.gradient(kept.index, false);
      if (!gradient || gradient->size_bytes() != kept.copy.size_bytes()) continue;
      copy_scaled(*gradient,
                  Buffer(kept.copy.data(), gradient->count(), gradient->dtype(), kept.copy.memory(),
                         kept.copy.device()),
                  1.0);
    }
    unused_gradients_.clear();
  }
  ++iterations_;
  end_iteration();
}

bool Reducer::rebuild_from_arrival_order() {
  std::vector<std::int64_t> order(parameters_.size());
  for (std::size_t i = 0; i < order.size(); ++i) {
    order[i] = i < arrival_.size() ? static_cast<std::int64_t>(arrival_[i]) : -1;
  }
  comm_->launch(comm_->broadcast(Buffer(order), 0)).get();
  if (std::none_of(order.begin(), order.end(), [](std::int64_t index) { return index >= 0; })) {
    arrival_.clear();  // rank 0 shadowed (join): no order to learn from yet
    return false;
  }
  std::vector<std::size_t> ready_order;
  std::vector<std::uint8_t> seen(parameters_.size(), 0);
  for (const std::int64_t index : order) {
    if (index >= 0 && static_cast<std::size_t>(index) < parameters_.size() && seen[index] == 0) {
      seen[index] = 1;
      ready_order.push_back(static_cast<std::size_t>(index));
    }
  }
  // Rank 0 saw every parameter (finalize checked); anything else keeps reverse order.
  // (A rank 0 that shadowed saw none, and returned above.)
  for (const std::size_t index : reverse_order(parameters_.size())) {
    if (seen[index] == 0) ready_order.push_back(index);
  }
  std::lock_guard lock(mutex_);
  // The old buckets stay alive until the gradients (views into them, with bucket view)
  // have been copied into the new ones.
  std::vector<std::unique_ptr<Bucket>> old = std::move(buckets_);
  build_buckets(ready_order);
  bind_gradients();
  old.clear();
  hook_->buckets_rebuilt();
  rebuilt_ = true;
  arrival_.clear();
  arrival_.shrink_to_fit();
  return true;
}

}  // namespace braid::dp
