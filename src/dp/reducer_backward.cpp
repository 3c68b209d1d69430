// Reducer's backward pass (<braid/dp/reducer.hpp>): an iteration prepared, each gradient
// copied into its bucket's slot as it arrives, and full buckets launched strictly in index
// order, each reduction on the runtime thread through the comm hook.
#include <algorithm>
#include <memory>

#include <boost/asio/redirect_error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <fmt/format.h>

#include <braid/core/fault_points.hpp>
#include <braid/dp/reducer.hpp>

#include "dp/reducer_internal.hpp"
#include "dp/scaled_copy.hpp"

namespace braid::dp {

using detail::describe;
using detail::misuse;

namespace {

using collectives::Communicator;
using detail::ReductionTurn;

// The reduction of one bucket, on the runtime thread: the span runs from the moment the
// bucket was full to the moment its sum is back.
asio::awaitable<void> reduce_bucket(std::shared_ptr<Communicator> comm,
                                    std::shared_ptr<CommHook> hook, BucketView bucket,
                                    trace::AsyncSpan span, std::shared_ptr<ReductionTurn> previous,
                                    std::shared_ptr<ReductionTurn> mine) {
  if (previous && !previous->done) {
    boost::system::error_code ignored;
    co_await previous->timer.async_wait(asio::redirect_error(asio::use_awaitable, ignored));
  }
  struct Finish {
    ReductionTurn* turn;
    ~Finish() {
      if (turn != nullptr) {
        turn->done = true;
        turn->timer.cancel();
      }
    }
  } finish{mine.get()};
  co_await hook->reduce(*comm, bucket);
  span.end();
}

}  // namespace

void Reducer::prepare_for_backward(bool sync,
                                   std::optional<std::vector<std::size_t>> locally_unused) {
  std::unique_lock lock(mutex_);
  check_previous_finished();
  if (!sync) {
    state_ = State::accumulating;
    return;
  }
  begin_iteration();
  // Until finalize, this rank's core computes the gradients: bucket reductions leave their
  // work to ranks that have finished their backward (Communicator::set_computing). The
  // hint is the communicator's: a second reducer on it would overwrite it (performance
  // only, never results).
  comm_->set_computing(true);
  if (!locally_unused) return;
  std::fill(locally_used_.begin(), locally_used_.end(), 1);
  for (const std::size_t index : *locally_unused) {
    if (index >= parameters_.size())
      misuse(*comm_, fmt::format("unused parameter {} is out of range", index));
    locally_used_[index] = 0;
  }
  // Which parameters some rank used: one small all-reduce, issued now so it is done long
  // before backward ends (every rank tracking unused parameters issues it here).
  used_reduction_ = comm_->launch(comm_->all_reduce(
      Buffer(locally_used_.data(), locally_used_.size(), DType::u8), ReduceOp::max));
  for (const std::size_t index : *locally_unused) {
    ready_[index] = 1;
    if (!first_sync_done_) arrival_.push_back(index);
    keep_unused_gradient(index);
    // Its gradient will not change in this backward: what it holds now (accumulated under
    // no_sync(), or none: zeros) is its contribution, as in PyTorch's DDP.
    fill_slot(index, /*bind=*/false);
    if (--buckets_[bucket_of_[index]]->pending == 0) mark_full(bucket_of_[index]);
  }
  launch_ready_buckets();
}

void Reducer::keep_unused_gradient(std::size_t index) {
  if (!options_.gradient_as_bucket_view) return;
  const std::optional<Buffer> gradient = access_.gradient(index, false);
  const Buffer slot = buckets_[bucket_of_[index]]->slot(slot_of_[index], parameters_[index].count);
  // With its own memory it stays untouched: fill_slot does not bind it this iteration.
  if (!gradient || gradient->data() != slot.data()) return;
  // The gradient is its slot here, so its size never changes: one allocation serves.
  std::shared_ptr<std::byte[]>& memory = kept_memory_[index];
  if (!memory) {
    memory = device_ != nullptr ? device_->allocate(gradient->size_bytes())
                                : std::make_shared<std::byte[]>(gradient->size_bytes());
  }
  const Buffer copy(memory.get(), gradient->count(), gradient->dtype(), gradient->memory(),
                    gradient->device());
  copy_scaled(copy, *gradient, 1.0);
  unused_gradients_.push_back({index, copy});
}

void Reducer::begin_iteration() {
  unused_gradients_.clear();
  shadowing_ = false;  // shadow_iteration sets it after this; a shadow that threw left it
  std::fill(ready_.begin(), ready_.end(), 0);
  for (auto& bucket : buckets_) {
    bucket->pending = bucket->layout.parameters.size();
    bucket->full = false;
    bucket->launched = false;
    bucket->reduction.reset();
    bucket->turn.reset();
    bucket->producer = nullptr;
  }
  next_launch_ = 0;
  state_ = State::backward;
  used_reduction_.reset();
}

void Reducer::shadow_iteration(bool track_unused) {
  {
    std::lock_guard lock(mutex_);
    check_previous_finished();
    begin_iteration();
    shadowing_ = true;
    if (track_unused) {
      // This rank used nothing: the ranks still training decide what was used.
      std::fill(locally_used_.begin(), locally_used_.end(), 0);
      used_reduction_ = comm_->launch(comm_->all_reduce(
          Buffer(locally_used_.data(), locally_used_.size(), DType::u8), ReduceOp::max));
    }
    std::fill(ready_.begin(), ready_.end(), 1);
    for (std::size_t b = 0; b < buckets_.size(); ++b) {
      // Device buckets are zeroed on the producer stream, behind the last iteration's
      // write-back that reads them; `filled` then covers the zeros.
      clear(buckets_[b]->data);
      note_producer(*buckets_[b]);
      buckets_[b]->pending = 0;
      mark_full(b);
    }
    launch_ready_buckets();
  }
  wait_for_reductions();
  producer_follows_reductions();
  end_iteration();
}

void Reducer::fill_slot(std::size_t index, bool bind) {
  const ParameterSpec& p = parameters_[index];
  Bucket& bucket = *buckets_[bucket_of_[index]];
  const Buffer slot = bucket.slot(slot_of_[index], p.count);
  const std::optional<Buffer> gradient = access_.gradient(index, false);
  if (!gradient) {
    clear(slot);
    note_producer(bucket);
    return;
  }
  if (gradient->count() != p.count || gradient->dtype() != p.dtype) {
    misuse(*comm_, fmt::format("the gradient of {} has {} {} elements; the parameter has {} {}",
                               describe(p, index), gradient->count(), to_string(gradient->dtype()),
                               p.count, to_string(p.dtype)));
  }
  const double factor = !averaged_in_reduction(bucket) ? scale_
                        : equal_shares_                ? 1.0
                                                       : scale_ * comm_->size();
  copy_scaled(slot, *gradient, factor);
  note_producer(bucket);
  if (bind && options_.gradient_as_bucket_view && gradient->data() != slot.data()) {
    // The framework replaced the gradient (set to none by zero_grad, or assigned): from
    // the next backward on it accumulates in the bucket again, as with PyTorch's views.
    access_.bind_gradient(index, slot, bucket.storage);
  }
}

bool Reducer::averaged_in_reduction(const Bucket& bucket) const {
  return hook_->averages() && bucket.layout.dtype != DType::f16;
}

void Reducer::mark_ready(std::size_t index) {
  {
    std::lock_guard lock(mutex_);
    if (index >= parameters_.size())
      misuse(*comm_, fmt::format("parameter {} is out of range", index));
    if (state_ == State::accumulating) return;
    if (state_ == State::idle) {
      // After a finished iteration this is the same gradient a second time: backward ran
      // again on the graph of the last forward (retain_graph).
      misuse(*comm_, first_sync_done_ || iterations_ > 0
                         ? fmt::format("{} was marked ready twice for one forward: backward() ran "
                                       "again without a new forward through "
                                       "DistributedDataParallel (retain_graph?)",
                                       describe(parameters_[index], index))
                         : fmt::format("the gradient of {} arrived outside an iteration: run the "
                                       "forward through DistributedDataParallel, and call "
                                       "backward() once per forward",
                                       describe(parameters_[index], index)));
    }
    if (ready_[index] != 0) {
      misuse(*comm_, fmt::format("{} was marked ready twice in one backward pass (backward() "
                                 "called twice after one forward, or a parameter shared in a way "
                                 "that fires its hook twice)",
                                 describe(parameters_[index], index)));
    }
    ready_[index] = 1;
    if (!first_sync_done_) arrival_.push_back(index);
  }
  fill_slot(index);  // outside the lock: slots are disjoint
  std::lock_guard lock(mutex_);
  if (--buckets_[bucket_of_[index]]->pending == 0) mark_full(bucket_of_[index]);
  launch_ready_buckets();
}

void Reducer::note_producer(Bucket& bucket) {
  if (device_ == nullptr) return;
  Stream& producer = device_->producer();
  std::lock_guard lock(producer_mutex_);
  if (bucket.producer != nullptr && bucket.producer != &producer) {
    // An earlier gradient of this bucket came on another stream: the bucket's stream
    // waits for that one now; `filled` covers this stream's when the bucket is full.
    bucket.producer->record(*bucket.filled);
    bucket.data.stream()->wait(*bucket.filled);
  }
  bucket.producer = &producer;
}

void Reducer::mark_full(std::size_t index) {
  Bucket& bucket = *buckets_[index];
  bucket.full = true;
  if (device_ != nullptr) {
    std::lock_guard lock(producer_mutex_);
    if (bucket.producer != nullptr) bucket.producer->record(*bucket.filled);
  }
  bucket.lifetime =
      trace::AsyncSpan(trace::Category::bucket, "bucket", track_, bucket.data.size_bytes());
  bucket.lifetime.arg("bucket", static_cast<std::int64_t>(index));
}

void Reducer::launch_ready_buckets() {
  while (next_launch_ < buckets_.size() && buckets_[next_launch_]->full) {
    Bucket& bucket = *buckets_[next_launch_];
    // In bucket order, so a reduction stream never waits for a later bucket first.
    if (device_ != nullptr) bucket.data.stream()->wait(*bucket.filled);
    // Later than the span's start where the bucket waited for an earlier one to fill.
    trace::instant(trace::Category::bucket, "bucket.launched", track_, bucket.data.size_bytes());
    trace::AsyncSpan span = std::move(bucket.lifetime);
    BucketView view{.index = next_launch_,
                    .data = bucket.data,
                    .layout = &bucket.layout,
                    .parameters = parameters_,
                    .combine = averaged_in_reduction(bucket) ? ReduceOp::avg : ReduceOp::sum,
                    .shadow = shadowing_,
                    .device = device_};
    std::shared_ptr<ReductionTurn> previous;
    std::shared_ptr<ReductionTurn> mine;
    if (!hook_->single_collective()) {
      previous = next_launch_ > 0 ? buckets_[next_launch_ - 1]->turn : nullptr;
      mine = std::make_shared<ReductionTurn>(comm_->runtime().executor());
    }
    bucket.turn = mine;
    bucket.reduction = comm_->launch(
        reduce_bucket(comm_, hook_, view, std::move(span), std::move(previous), std::move(mine)));
    bucket.launched = true;
    ++next_launch_;
    fault_point(FaultPoint::bucket_reduction);
  }
}

}  // namespace braid::dp
