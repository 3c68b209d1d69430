// Element-wise kernels for gradient buckets in CUDA memory (cuda_bucket_device.cpp):
// the scaled copy of a gradient into its bucket and back, and the conversions of the
// compressing comm hook. Defined in bucket_kernels.cu, which nvcc compiles; this header
// is plain C++ so the C++ compiler never sees CUDA's device code.
#pragma once

#include <cstddef>

namespace braid::dp::detail {

enum class KernelType : int { f32, f64, f16, bf16 };

// dst[i] = src[i] * factor for `count` elements, converted from src_type to dst_type
// (through f64 where either is f64, else f32), enqueued on `stream` (a cudaStream_t).
// Returns the launch's cudaError_t (0: cudaSuccess); the kernel runs later.
int launch_convert(void* dst, KernelType dst_type, const void* src, KernelType src_type,
                   std::size_t count, double factor, void* stream);

}  // namespace braid::dp::detail
