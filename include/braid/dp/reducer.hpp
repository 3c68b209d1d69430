// The gradient reducer: data parallelism's engine, framework-agnostic. An adapter (the
// libtorch one is braid/torch/data_parallel/distributed_data_parallel.hpp) describes the
// parameters, calls prepare_for_backward() after each forward, mark_ready(i) from the autograd hook
// of each parameter as its gradient becomes final, and finalize() at the end of backward.
//
//   mark_ready(i)   copies gradient i into its bucket, scaled by this rank's share (1/W
//                   unless set_batch_share says otherwise) in the same pass, or leaves
//                   the 1/W to the all-reduce (see averaged_in_reduction); the bucket
//                   whose last gradient this was is full, and every full bucket whose
//                   predecessors have launched launches its all-reduce now, on the
//                   communicator's runtime thread, while backward goes on computing.
//   finalize()      waits for every bucket in order and writes the averaged gradients
//                   back; what it waits for is the communication backward did not hide.
//
// Order. Buckets launch strictly in index order on every rank, whatever order gradients
// arrive in, so all ranks issue the same collectives in the same order. After the first
// synchronised iteration the buckets are rebuilt once from the order gradients actually
// arrived on rank 0 (broadcast, so every rank agrees), so later iterations launch each
// bucket as early as its gradients allow.
//
// Threads. mark_ready may run on any thread (autograd engine threads) and concurrently:
// copies into distinct slots run outside the lock, which guards only the bookkeeping.
// prepare_for_backward and finalize run on the training loop's thread, never on the
// communicator's runtime thread (finalize blocks on it).
//
// Device memory. Parameters in CUDA memory (all on one device) get buckets in that
// device's memory through Options::device (bucket_device.hpp, which shows the streams):
// gradients are copied into their slots on the stream that produced them, each bucket's
// reduction starts on its reduction stream once the GPU has written the bucket, and
// finalize() leaves the write-back enqueued on the producer stream behind the
// reductions. The comm hooks that run there are all_reduce and compress; the others, and
// clip_grad_norm, work on host buckets only (an error says so).
//
// Misuse is an Error(Errc::invalid_argument) naming the parameter: a gradient marked
// ready twice in one backward (backward twice after one forward), a mark with no
// prepare_for_backward (no forward through the wrapper), a new iteration while the
// previous one's reduction is unfinished, and gradients that never arrived (parameters
// the forward did not use, without find-unused handling).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <braid/collectives/communicator.hpp>
#include <braid/core/buffer.hpp>
#include <braid/core/error.hpp>
#include <braid/core/future.hpp>
#include <braid/dp/bucket_device.hpp>
#include <braid/dp/bucket_plan.hpp>
#include <braid/dp/comm_hook.hpp>
#include <braid/trace/recorder.hpp>
#include <braid/trace/span.hpp>

namespace braid::dp {

// How the reducer reaches the framework's gradients.
class GradientAccess {
 public:
  virtual ~GradientAccess() = default;
  // Parameter `index`'s gradient: `count` contiguous elements of its dtype. With `create`,
  // make a zero gradient where there is none yet; without, nullopt where there is none.
  virtual std::optional<Buffer> gradient(std::size_t index, bool create) = 0;
  // gradient_as_bucket_view: make parameter `index`'s gradient a view of `slot` (bucket
  // memory, already holding the current gradient's values), so the framework accumulates
  // straight into the bucket. `owner` keeps that memory alive: the gradient must hold it
  // for as long as it may be read, since the reducer drops its buckets when it rebuilds
  // them or is destroyed while the gradients live on. Returns false where it cannot (the
  // reducer then copies).
  virtual bool bind_gradient(std::size_t /*index*/, Buffer /*slot*/,
                             std::shared_ptr<const void> /*owner*/) {
    return false;
  }
};

struct ReducerOptions {
  BucketLimits limits;
  // Rebuild the buckets once, after the first synchronised iteration, from the order
  // gradients arrived in on rank 0.
  bool rebuild_buckets = true;
  // Gradients live in the buckets (GradientAccess::bind_gradient): no copy into the
  // bucket before the all-reduce and none back after it, at the price of scaling in
  // place. A gradient the framework replaced (set to none, reassigned) falls back to
  // copying for that iteration.
  bool gradient_as_bucket_view = false;
  // Keep the buckets in memory every rank on the node maps (Communicator::allocate_shared,
  // one allocation for all of them, made again when they are rebuilt), so each bucket's
  // all-reduce reads and writes peers' buckets directly: no system call, no pinned pages.
  // Members on several nodes get private memory either way. Host buckets only.
  bool shared_buckets = true;
  // Where the buckets of parameters in CUDA memory live (cuda_bucket_device()); required
  // for them, unused for host parameters.
  std::shared_ptr<BucketDevice> device;
};

class Reducer {
 public:
  using Options = ReducerOptions;

  // `access` must outlive the reducer. Throws Error(invalid_argument) for non-float
  // dtypes, parameters on more than one device (or host and device), CUDA parameters
  // without Options::device or on another device than it, and CUDA parameters on a
  // communicator that cannot move CUDA memory.
  Reducer(std::shared_ptr<collectives::Communicator> comm, std::vector<ParameterSpec> parameters,
          GradientAccess& access, Options options = {});
  ~Reducer();
  Reducer(const Reducer&) = delete;
  Reducer& operator=(const Reducer&) = delete;

  // Begins an iteration. With sync false (no_sync), gradients just accumulate where they
  // are: marks are ignored and finalize does nothing. `locally_unused` lists parameters
  // this rank's forward did not use: they count as ready at once, contributing the
  // gradient they hold (accumulated under no_sync; zeros if none), and a parameter unused
  // on every rank is left alone (its gradient untouched). Every rank
  // passes a list (maybe empty) or every rank passes nullopt: with a list, the ranks
  // all-reduce which parameters anyone used, one small collective per iteration.
  void prepare_for_backward(bool sync = true,
                            std::optional<std::vector<std::size_t>> locally_unused = std::nullopt);
  void mark_ready(std::size_t index);
  // Throws the unfinished-iteration error prepare_for_backward would; a wrapper calls it
  // before running a forward, so the error comes before the work.
  void check_previous_finished() const;
  // Waits for every bucket and writes the results back. Throws what a reduction threw,
  // or Error(invalid_argument) naming parameters whose gradients never arrived.
  void finalize();
  // For a rank that has run out of inputs while others train on (uneven inputs, the
  // adapter's join()): issues the collectives of one synchronised iteration, in the order
  // prepare_for_backward and the buckets would, contributing zeros (and, with
  // `track_unused`, no used parameter), and waits for them. Hooks see BucketView::shadow:
  // error feedback adds nothing and keeps its state. The sums land in the buckets and
  // nowhere else: with gradient_as_bucket_view they are this rank's gradients, which are
  // scratch while it shadows. in_backward() is true meanwhile.
  void shadow_iteration(bool track_unused);

  // This rank's share of the global batch (its samples / all samples), for uneven
  // shares: gradients are scaled by it instead of 1/W, so the sum over ranks is the
  // gradient of the whole batch's mean loss. The shares must add up to 1 over ranks.
  void set_batch_share(double share);

  // How buckets are reduced from the next iteration on (comm_hook.hpp); every rank must
  // set the same kind of hook. Default: all_reduce_hook(). Not during a backward.
  void set_comm_hook(std::shared_ptr<CommHook> hook);

  // Host gradients only. Scales the gradients (after finalize) so their global L2 norm is
  // at most max_norm,
  // and returns the norm before clipping. All ranks hold the same averaged gradients, so
  // the norm is computed once per rank and the ranks agree on the largest (one 8-byte
  // all-reduce), so every rank applies the same factor. A collective call.
  double clip_grad_norm(double max_norm);

  // True between prepare_for_backward(sync = true) and the end of finalize().
  bool in_backward() const noexcept { return state_ == State::backward; }
  std::size_t bucket_count() const;
  const BucketLayout& bucket(std::size_t index) const;
  bool buckets_rebuilt() const noexcept { return rebuilt_; }
  const std::vector<ParameterSpec>& parameters() const noexcept { return parameters_; }
  collectives::Communicator& communicator() noexcept { return *comm_; }

 private:
  enum class State { idle, backward, accumulating };
  struct Bucket;

  void build_buckets(const std::vector<std::size_t>& ready_order);
  // Needs mutex_. Every parameter not ready, every bucket waiting for all of its own.
  void begin_iteration();
  void wait_for_reductions();
  // After the reductions: the iteration is over; the first synchronised one rebuilds the
  // buckets.
  void end_iteration();
  void bind_gradients();  // gradient_as_bucket_view
  // Needs mutex_. Bucket `index` has every gradient: its "bucket" span starts (and, for a
  // device bucket, `filled` is recorded on the stream its gradients came on).
  void mark_full(std::size_t index);
  // Device buckets: the stream the calling thread produces gradients on now is the one
  // `bucket`'s last gradient came on (Bucket::producer).
  void note_producer(Bucket& bucket);
  // Needs mutex_. Launches every full bucket from next_launch_ on.
  void launch_ready_buckets();
  // Copies (and scales) parameter `index`'s gradient into its slot; with
  // gradient_as_bucket_view and `bind`, makes the gradient a view of the slot. Not for a
  // parameter this rank left unused: the all-reduce may give its slot values its gradient
  // must not take (no rank used it).
  void fill_slot(std::size_t index, bool bind = true);
  // Waits, bounded, for every launched reduction to end, whatever it ends with.
  void settle_reductions() noexcept;
  // Device buckets, after the reductions: the producer stream waits for each bucket's
  // stream, where hooks' kernels may still be queued.
  void producer_follows_reductions();
  // Needs mutex_. Before a parameter this rank left unused is filled in: unused_gradients_.
  void keep_unused_gradient(std::size_t index);
  // With a hook that averages (the default all-reduce), f32, f64 and bf16 buckets go in
  // unscaled (scaled by share x W under set_batch_share) and the all-reduce averages
  // them: the single-copy all-reduce divides each piece while it is in cache. Scaling on
  // the way in costs a pass over every gradient (docs/benchmarks.md, "braid-bench ddp"),
  // and with gradient_as_bucket_view it would be the only pass. f16 buckets keep the
  // scaling before the sum, whose unscaled intermediate could overflow. The choice
  // depends on the hook and the dtype alone, which every rank shares, so every rank
  // issues the same reduction.
  bool averaged_in_reduction(const Bucket& bucket) const;
  // dst = src * factor, and dst = 0: at once in host memory, enqueued on the producer
  // stream in device memory.
  void copy_scaled(const Buffer& dst, const Buffer& src, double factor);
  void clear(const Buffer& dst);
  // Device buckets: every parameter's memory is device_'s, or an error naming the first
  // that is not.
  void check_placement() const;
  // False, leaving the buckets as they are, where rank 0 had no arrival order to share
  // (it shadowed the iteration): every rank learns that from the same broadcast.
  bool rebuild_from_arrival_order();

  std::shared_ptr<collectives::Communicator> comm_;
  std::vector<ParameterSpec> parameters_;
  GradientAccess& access_;
  Options options_;
  double scale_;              // this rank's share of the batch
  bool equal_shares_ = true;  // no set_batch_share: every share is 1/W
  trace::Track track_;
  std::shared_ptr<CommHook> hook_;
  BucketDevice* device_ = nullptr;  // options_.device where the parameters are in CUDA memory

  std::mutex mutex_;
  std::mutex producer_mutex_;  // Bucket::producer; taken after mutex_ where both are
  std::atomic<State> state_{State::idle};
  std::vector<std::unique_ptr<Bucket>> buckets_;
  std::vector<std::size_t> bucket_of_;  // parameter -> bucket
  std::vector<std::size_t> slot_of_;    // parameter -> position in its bucket
  std::vector<std::uint8_t> ready_;     // parameter -> marked this iteration
  std::vector<std::size_t> arrival_;    // first synchronised iteration's order
  std::vector<std::uint8_t> locally_used_;
  std::optional<Future<void>> used_reduction_;  // all-reduce(max) of locally_used_
  // gradient_as_bucket_view: what the gradients of parameters this rank left unused held
  // before their bucket's all-reduce wrote over them (they are the bucket's memory). Where
  // no rank used one, finalize puts it back: left alone, as in copy mode.
  struct KeptGradient {
    std::size_t index;
    Buffer copy;  // in kept_memory_, where the gradient is (host or device memory)
  };
  std::vector<KeptGradient> unused_gradients_;
  // By parameter, allocated once: on a device, allocating and freeing every iteration
  // would synchronise it inside backward.
  std::map<std::size_t, std::shared_ptr<std::byte[]>> kept_memory_;
  std::size_t next_launch_ = 0;
  bool first_sync_done_ = false;
  std::uint64_t iterations_ = 0;  // finalized synchronised iterations
  bool rebuilt_ = false;
  bool shadowing_ = false;  // in shadow_iteration: buckets launch as BucketView::shadow
  // What the last synchronised iteration's reductions threw (a peer died, a deadline
  // passed): the next iteration reports it, not an unfinished backward.
  std::optional<Error> failed_;
};

}  // namespace braid::dp
