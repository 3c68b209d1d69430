// The bucket kernels (bucket_kernels.hpp): one grid-stride loop per pair of element
// types. Memory bound: a 25 MiB f32 bucket moves at the device's bandwidth (~3 TB/s on an
// H100: ~17 us), so the scaling costs no pass of its own beside the copy it rides on.
#include <cstdint>
#include <type_traits>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "dp/bucket_kernels.hpp"

namespace braid::dp::detail {
namespace {

// f64 where either side is f64, else f32 (which holds every f16 and bf16 value exactly).
template <class Out, class In>
using Math =
    std::conditional_t<std::is_same_v<Out, double> || std::is_same_v<In, double>, double, float>;

template <class Out, class In>
__global__ void convert_kernel(Out* dst, const In* src, std::size_t count, double factor) {
  using M = Math<Out, In>;
  const M scale = static_cast<M>(factor);
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += stride) {
    dst[i] = static_cast<Out>(static_cast<M>(src[i]) * scale);
  }
}

template <class Out, class In>
cudaError_t launch(void* dst, const void* src, std::size_t count, double factor,
                   cudaStream_t stream) {
  constexpr unsigned kThreads = 256;
  // Enough blocks to fill the device several times over; the loop strides past the rest.
  const std::size_t wanted = (count + kThreads - 1) / kThreads;
  const unsigned blocks = static_cast<unsigned>(wanted < 4096 ? wanted : 4096);
  convert_kernel<Out, In><<<blocks, kThreads, 0, stream>>>(
      static_cast<Out*>(dst), static_cast<const In*>(src), count, factor);
  return cudaGetLastError();
}

template <class Out>
cudaError_t launch_from(KernelType src_type, void* dst, const void* src, std::size_t count,
                        double factor, cudaStream_t stream) {
  switch (src_type) {
    case KernelType::f32:
      return launch<Out, float>(dst, src, count, factor, stream);
    case KernelType::f64:
      return launch<Out, double>(dst, src, count, factor, stream);
    case KernelType::f16:
      return launch<Out, __half>(dst, src, count, factor, stream);
    case KernelType::bf16:
      return launch<Out, __nv_bfloat16>(dst, src, count, factor, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace

int launch_convert(void* dst, KernelType dst_type, const void* src, KernelType src_type,
                   std::size_t count, double factor, void* stream) {
  if (count == 0) return cudaSuccess;
  const auto on = static_cast<cudaStream_t>(stream);
  switch (dst_type) {
    case KernelType::f32:
      return launch_from<float>(src_type, dst, src, count, factor, on);
    case KernelType::f64:
      return launch_from<double>(src_type, dst, src, count, factor, on);
    case KernelType::f16:
      return launch_from<__half>(src_type, dst, src, count, factor, on);
    case KernelType::bf16:
      return launch_from<__nv_bfloat16>(src_type, dst, src, count, factor, on);
  }
  return cudaErrorInvalidValue;
}

}  // namespace braid::dp::detail
