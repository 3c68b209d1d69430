#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>

#include <boost/asio/redirect_error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <fmt/format.h>

#include <braid/core/error.hpp>
#include <braid/core/log.hpp>
#include <braid/dp/reducer.hpp>

#include "scaled_copy.hpp"

namespace braid::dp {
namespace {

using collectives::Communicator;

[[noreturn]] void misuse(const Communicator& comm, std::string what) {
  throw Error(Errc::invalid_argument, std::move(what),
              {.rank = comm.world_rank(comm.rank()), .operation = "ddp"});
}

std::string describe(const ParameterSpec& p, std::size_t index) {
  return fmt::format("'{}' (parameter {})", p.name.empty() ? "?" : p.name, index);
}

// One bucket's reduction done, for the next bucket's hook to wait on (hooks that issue
// several collectives run one bucket at a time). Touched only on the runtime thread.
struct ReductionTurn {
  explicit ReductionTurn(asio::any_io_executor executor) : timer(std::move(executor)) {
    timer.expires_at(asio::steady_timer::time_point::max());
  }
  bool done = false;
  asio::steady_timer timer;  // cancelled when done: wakes the waiter
};

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

struct Reducer::Bucket {
  BucketLayout layout;
  // Shared with the gradients bound to it (gradient_as_bucket_view), which may outlive it.
  std::shared_ptr<std::byte[]> storage;
  Buffer data;
  std::size_t pending = 0;  // parameters not yet ready this iteration
  bool full = false;
  bool launched = false;
  std::optional<Future<void>> reduction;
  std::shared_ptr<ReductionTurn> turn;  // with hooks that run one bucket at a time
  trace::AsyncSpan lifetime;   // "bucket": from full (every gradient in) to reduced

  Buffer slot(std::size_t position, std::size_t count) const {
    return data.slice(layout.offsets[position], count);
  }
};

Reducer::Reducer(std::shared_ptr<Communicator> comm, std::vector<ParameterSpec> parameters,
                 GradientAccess& access, Options options)
    : comm_(std::move(comm)),
      parameters_(std::move(parameters)),
      access_(access),
      options_(options),
      scale_(1.0 / comm_->size()),
      track_(trace::track("ddp buckets")),
      hook_(all_reduce_hook()) {
  for (std::size_t i = 0; i < parameters_.size(); ++i) {
    const ParameterSpec& p = parameters_[i];
    if (p.memory != MemoryKind::host) {
      misuse(*comm_, fmt::format("{} is in {} memory; this reducer's communicator moves host "
                                 "memory",
                                 describe(p, i), to_string(p.memory)));
    }
    if (p.dtype != DType::f32 && p.dtype != DType::f64 && p.dtype != DType::f16 &&
        p.dtype != DType::bf16) {
      misuse(*comm_, fmt::format("{} is {}; gradients must be floating point", describe(p, i),
                                 to_string(p.dtype)));
    }
  }
  ready_.assign(parameters_.size(), 0);
  locally_used_.assign(parameters_.size(), 1);
  build_buckets(reverse_order(parameters_.size()));
  bind_gradients();
}

void Reducer::bind_gradients() {
  if (!options_.gradient_as_bucket_view) return;
  for (std::size_t i = 0; i < parameters_.size(); ++i) {
    const Buffer slot = buckets_[bucket_of_[i]]->slot(slot_of_[i], parameters_[i].count);
    const std::optional<Buffer> current = access_.gradient(i, false);
    // A parameter with no gradient keeps none: optimizers skip it (no momentum, no weight
    // decay), as in copy mode and PyTorch's. fill_slot binds it once one arrives.
    if (!current) continue;
    if (current->count() == slot.count() && current->dtype() == slot.dtype()) {
      detail::scaled_copy(slot, *current, 1.0);
    } else {
      detail::zero(slot);
    }
    access_.bind_gradient(i, slot, buckets_[bucket_of_[i]]->storage);
  }
}

Reducer::~Reducer() {
  comm_->set_computing(false);
  // In-flight reductions still read and write the buckets: give them a bounded while.
  settle_reductions();
}

void Reducer::build_buckets(const std::vector<std::size_t>& ready_order) {
  buckets_.clear();
  bucket_of_.assign(parameters_.size(), 0);
  slot_of_.assign(parameters_.size(), 0);
  std::vector<BucketLayout> layouts = plan_buckets(parameters_, ready_order, options_.limits);
  // One allocation for every bucket (the same size on every rank, as the layouts are),
  // each bucket starting on a cache line of its own.
  constexpr std::size_t kAlignment = 64;
  std::vector<std::size_t> starts;
  std::size_t total = 0;
  for (const BucketLayout& layout : layouts) {
    starts.push_back(total);
    total += (layout.count * dtype_size(layout.dtype) + kAlignment - 1) / kAlignment * kAlignment;
  }
  std::shared_ptr<std::byte[]> memory = options_.shared_buckets
                                            ? comm_->launch(comm_->allocate_shared(total)).get()
                                            : std::make_shared<std::byte[]>(total);
  for (std::size_t b = 0; b < layouts.size(); ++b) {
    BucketLayout& layout = layouts[b];
    auto bucket = std::make_unique<Bucket>();
    // Aliases the allocation: it lives while any bucket or bound gradient does.
    bucket->storage = std::shared_ptr<std::byte[]>(memory, memory.get() + starts[b]);
    bucket->data = Buffer(bucket->storage.get(), layout.count, layout.dtype);
    for (std::size_t position = 0; position < layout.parameters.size(); ++position) {
      bucket_of_[layout.parameters[position]] = buckets_.size();
      slot_of_[layout.parameters[position]] = position;
    }
    bucket->layout = std::move(layout);
    buckets_.push_back(std::move(bucket));
  }
}

std::size_t Reducer::bucket_count() const {
  return buckets_.size();
}

const BucketLayout& Reducer::bucket(std::size_t index) const {
  return buckets_.at(index)->layout;
}

void Reducer::set_comm_hook(std::shared_ptr<CommHook> hook) {
  std::lock_guard lock(mutex_);
  if (state_ == State::backward) misuse(*comm_, "set_comm_hook during a backward pass");
  if (!hook) misuse(*comm_, "set_comm_hook with no hook");
  hook_ = std::move(hook);
}

double Reducer::clip_grad_norm(double max_norm) {
  if (!(max_norm > 0)) misuse(*comm_, fmt::format("clip_grad_norm: max_norm {} <= 0", max_norm));
  if (state_ == State::backward) misuse(*comm_, "clip_grad_norm before the backward finished");
  double squares = 0;
  std::vector<Buffer> gradients;
  for (std::size_t i = 0; i < parameters_.size(); ++i) {
    const std::optional<Buffer> g = access_.gradient(i, false);
    if (!g) continue;
    gradients.push_back(*g);
    std::vector<float> widened(g->count());
    detail::widen(*g, widened);
    for (const float x : widened) squares += double{x} * x;
  }
  std::vector<double> norm{std::sqrt(squares)};
  comm_->launch(comm_->all_reduce(Buffer(norm), ReduceOp::max)).get();
  const double factor = max_norm / (norm[0] + 1e-6);
  if (factor < 1.0) {
    for (const Buffer& g : gradients) detail::scaled_copy(g, g, factor);
  }
  return norm[0];
}

void Reducer::set_batch_share(double share) {
  if (!(share > 0.0 && share <= 1.0)) {
    misuse(*comm_, fmt::format("batch share {} is not in (0, 1]", share));
  }
  scale_ = share;
  equal_shares_ = false;
}

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
  const auto* bytes = static_cast<const std::byte*>(gradient->data());
  unused_gradients_.emplace_back(index,
                                 std::vector<std::byte>(bytes, bytes + gradient->size_bytes()));
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
      detail::zero(buckets_[b]->data);
      buckets_[b]->pending = 0;
      mark_full(b);
    }
    launch_ready_buckets();
  }
  wait_for_reductions();
  end_iteration();
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

void Reducer::fill_slot(std::size_t index, bool bind) {
  const ParameterSpec& p = parameters_[index];
  Bucket& bucket = *buckets_[bucket_of_[index]];
  const Buffer slot = bucket.slot(slot_of_[index], p.count);
  const std::optional<Buffer> gradient = access_.gradient(index, false);
  if (!gradient) {
    detail::zero(slot);
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
  detail::scaled_copy(slot, *gradient, factor);
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

void Reducer::mark_full(std::size_t index) {
  Bucket& bucket = *buckets_[index];
  bucket.full = true;
  bucket.lifetime =
      trace::AsyncSpan(trace::Category::bucket, "bucket", track_, bucket.data.size_bytes());
  bucket.lifetime.arg("bucket", static_cast<std::int64_t>(index));
}

void Reducer::launch_ready_buckets() {
  while (next_launch_ < buckets_.size() && buckets_[next_launch_]->full) {
    Bucket& bucket = *buckets_[next_launch_];
    // Later than the span's start where the bucket waited for an earlier one to fill.
    trace::instant(trace::Category::bucket, "bucket.launched", track_, bucket.data.size_bytes());
    trace::AsyncSpan span = std::move(bucket.lifetime);
    BucketView view{.index = next_launch_,
                    .data = bucket.data,
                    .layout = &bucket.layout,
                    .parameters = parameters_,
                    .combine = averaged_in_reduction(bucket) ? ReduceOp::avg : ReduceOp::sum,
                    .shadow = shadowing_};
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
  {
    trace::Span write_back(trace::Category::bucket, "bucket.write_back", track_);
    for (std::size_t i = 0; i < parameters_.size(); ++i) {
      // Unused on every rank: nobody has a gradient for it; leave it as it is.
      if (used_reduction_ && locally_used_[i] == 0) continue;
      const Bucket& bucket = *buckets_[bucket_of_[i]];
      const std::optional<Buffer> gradient = access_.gradient(i, true);
      if (gradient)
        detail::scaled_copy(*gradient, bucket.slot(slot_of_[i], parameters_[i].count), 1.0);
    }
    for (const auto& [index, bytes] : unused_gradients_) {
      if (locally_used_[index] != 0) continue;  // some rank used it: it takes the average
      const std::optional<Buffer> gradient = access_.gradient(index, false);
      if (gradient && gradient->size_bytes() == bytes.size()) {
        std::memcpy(gradient->data(), bytes.data(), bytes.size());
      }
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
