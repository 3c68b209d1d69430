// The libtorch side of CUDA for braid's adapters: which stream libtorch computes on. Only
// a libtorch with CUDA has one to ask (BRAID_WITH_TORCH_CUDA); against a CPU-only libtorch
// every call here refuses, naming what the build lacks.
#pragma once

#include <functional>
#include <memory>

#include <braid/dp/bucket_device.hpp>

namespace braid::torch::detail {

// The cudaStream_t of libtorch's current stream for `device` on the calling thread
// (autograd sets it for each gradient's hooks to the stream that computed it).
void* current_cuda_stream(int device);

// The reducer's bucket device for CUDA `device`, its producer libtorch's current stream.
std::shared_ptr<dp::BucketDevice> libtorch_bucket_device(int device);

// `work` made to run, on whatever thread calls it, with libtorch's current stream for
// `device` what it is on the calling thread now: copies it enqueues land on the caller's
// stream. `work` itself where libtorch has no CUDA.
std::function<void()> on_current_stream(int device, std::function<void()> work);

}  // namespace braid::torch::detail
