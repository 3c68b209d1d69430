// BucketDevice: what the gradient reducer needs to keep its buckets in device memory
// (CUDA) instead of host memory: the memory, the streams, and element-wise work enqueued
// on them. The reducer (reducer.hpp) orders everything it does to device buckets on
// streams and never waits for the GPU on the autograd thread:
//
//   producer()            mark_ready(i):  gradient i -> its slot, scaled (convert)
//                         bucket full:    record `filled`
//   reduction_stream(b)                   wait(filled); bucket b's collectives follow this
//                                         stream (Buffer::on_stream), hooks' kernels run on it
//   producer()            finalize():     wait(reduced, each bucket's); slots -> gradients
//
// so the all-reduce starts once the GPU has written the bucket's gradients (not when the
// host got there), and the optimizer's kernels, enqueued after backward on the producer
// stream, follow the write-back.
//
// cuda_bucket_device() is the CUDA one (a build with CUDA); tests give the reducer a
// host stand-in with host streams and memory labelled as a device's, which runs the
// same orderings on a CPU.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>

#include <braid/core/buffer.hpp>
#include <braid/core/stream.hpp>

namespace braid::dp {

class BucketDevice {
 public:
  virtual ~BucketDevice() = default;

  // The CUDA device ordinal buckets live on.
  virtual int device() const noexcept = 0;
  // `bytes` of device memory, uninitialised (the reducer writes it on a stream before
  // reading it), freed when the last pointer goes, after the work enqueued on this
  // device's streams that may still use it. Allocating may synchronise the device: the
  // reducer allocates when it builds its buckets, and hooks once per bucket.
  virtual std::shared_ptr<std::byte[]> allocate(std::size_t bytes) = 0;
  // The stream the framework computes gradients on now, on the calling thread (libtorch:
  // the device's current stream, which autograd sets for each gradient's hooks).
  virtual Stream& producer() = 0;
  // The stream bucket `bucket`'s reduction is ordered on. A few streams serve the buckets
  // in turn (bucket b on stream b mod their number): a collective records its start on its
  // stream when its turn comes, and on one stream shared by every bucket that point would
  // already cover the waits for later buckets' gradients.
  virtual Stream& reduction_stream(std::size_t bucket) = 0;
  // Enqueues dst[i] = src[i] * factor on `stream`, converting between floating dtypes
  // (f32, f64, f16, bf16); equal counts. The buffers are device memory.
  virtual void convert(const Buffer& dst, const Buffer& src, double factor, Stream& stream) = 0;
  // Enqueues zeroing `dst` on `stream`.
  virtual void zero(const Buffer& dst, Stream& stream) = 0;
};

// The CUDA bucket device for `device`: memory from cudaMalloc, four reduction streams of the
// device's highest priority, kernels for convert. `current_stream` returns the
// cudaStream_t the framework computes on now, on the calling thread (null: the legacy
// default stream). Throws Error(invalid_argument) in a build without CUDA.
std::shared_ptr<BucketDevice> cuda_bucket_device(int device, std::function<void*()> current_stream);

}  // namespace braid::dp
