// Comm hooks: how a gradient bucket is reduced. The reducer hands each full bucket to its
// hook, which must leave the ranks' combined buckets (BucketView::combine) in the bucket
// on every rank, identically. Usually the bucket is already scaled by this rank's share,
// and combine is sum: the sum over ranks is the average. A hook that says it averages()
// may instead get unscaled f32/f64/bf16 buckets with combine avg, so the 1/W costs no pass
// of its own (Reducer). The default is one all-reduce; the built-ins trade accuracy for
// bytes on the wire, as PyTorch's DDP comm hooks do:
//
//   hook                      bytes per element sent      result
//   all_reduce (default)      2(W-1)/W x 4 (ring)          exact sum
//   compress(f16 | bf16)      2(W-1)/W x 2                 sum rounded to 11 (8) bits
//   quantize_8bit()           (W-1) x 1 (all-gather)       8-bit, error fed back
//   power_sgd(rank r)         (n+m) r per n x m matrix     rank-r approximation, error fed back
//
// Error feedback (quantize_8bit, power_sgd): what compression lost this iteration is
// added to the bucket next iteration, so nothing is lost for good; the state lives in the
// hook, per bucket, and is dropped when the buckets are rebuilt.
//
// A hook runs as a coroutine on the communicator's runtime thread. A hook that issues
// more than one collective per bucket runs its buckets one at a time, in bucket order:
// interleaved at their co_awaits, two buckets' collectives could be issued in different
// orders on different ranks, which the communicator's issue-order matching cannot allow.
// The default all-reduce issues one collective, at once, so its buckets overlap.
//
// On buckets in device memory (a reducer with a BucketDevice) run all_reduce and compress
// (its conversions are kernels on the bucket's reduction stream); the others refuse them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include <boost/asio/awaitable.hpp>

#include <braid/collectives/communicator.hpp>
#include <braid/core/buffer.hpp>
#include <braid/dp/bucket_device.hpp>
#include <braid/dp/bucket_plan.hpp>

namespace braid::dp {

// One bucket as a hook sees it.
struct BucketView {
  std::size_t index = 0;
  Buffer data;                                // the flat bucket, reduced in place
  const BucketLayout* layout = nullptr;       // which parameters, where
  std::span<const ParameterSpec> parameters;  // all of the model's (layout indexes them)
  // How the ranks' buckets combine: sum, or avg for a hook that averages().
  ReduceOp combine = ReduceOp::sum;
  // This rank has run out of inputs and shadows the others (Reducer::shadow_iteration):
  // the bucket holds zeros, which is all it contributes. A hook issues its collectives as
  // always, but error feedback adds nothing of this rank's and keeps its state for the
  // rank's next real iteration.
  bool shadow = false;
  // Where the bucket lives when it is device memory (bucket_device.hpp), null for host
  // buckets. Device work a hook enqueues goes on data.stream(), the stream `data`
  // is ordered on; the reducer's write-back follows it.
  BucketDevice* device = nullptr;
};

class CommHook {
 public:
  virtual ~CommHook() = default;
  virtual std::string_view name() const noexcept = 0;
  virtual asio::awaitable<void> reduce(collectives::Communicator& comm, BucketView bucket) = 0;
  // True when reduce() issues exactly one collective before its first suspension, so
  // buckets may be in flight together.
  virtual bool single_collective() const noexcept { return false; }
  // True when reduce() combines as BucketView::combine says, avg included: the reducer then
  // leaves the 1/W to the reduction (an all-reduce divides each piece while it is in
  // cache) instead of scaling every gradient on its way into the bucket. Compressing
  // hooks say no: a sum of unscaled gradients may overflow their wire format.
  virtual bool averages() const noexcept { return false; }
  // The buckets were rebuilt: per-bucket state no longer lines up.
  virtual void buckets_rebuilt() {}
  // True when reduce() takes buckets in device memory (BucketView::device).
  virtual bool runs_on_device() const noexcept { return false; }
};

std::shared_ptr<CommHook> all_reduce_hook();
// f16 or bf16 on the wire; f32 buckets only (others are reduced exactly).
std::shared_ptr<CommHook> compress_hook(DType wire);
std::shared_ptr<CommHook> quantize_8bit_hook();
// PowerSGD: matrices (parameters with a 2-D shape, n x m with min(n, m) > rank) are sent as
// rank-`rank` factors P (n x r) and Q (m x r), one power iteration per step with Q kept from
// the last step (warm start; the first Q is random, the same on every rank by `seed`);
// vectors and small matrices go uncompressed. f32 buckets only.
std::shared_ptr<CommHook> power_sgd_hook(int rank, std::uint64_t seed = 0);

}  // namespace braid::dp
