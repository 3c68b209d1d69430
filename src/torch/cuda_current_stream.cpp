#include "torch/cuda_current_stream.hpp"

#include <braid/build_config.hpp>
#include <braid/core/error.hpp>

#if BRAID_WITH_TORCH_CUDA
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace braid::torch::detail {

void* current_cuda_stream(int device) {
#if BRAID_WITH_TORCH_CUDA
  return c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device)).stream();
#else
  (void)device;
  throw Error(Errc::invalid_argument,
              "CUDA tensors need libbraid_torch built against a libtorch with CUDA "
              "(-Dlibtorch=<PyTorch's torch/ directory>); this one was built against a "
              "CPU-only libtorch",
              {.operation = "libtorch"});
#endif
}

std::function<void()> on_current_stream(int device, std::function<void()> work) {
#if BRAID_WITH_TORCH_CUDA
  const c10::cuda::CUDAStream stream =
      c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device));
  return [stream, work = std::move(work)] {
    const c10::cuda::CUDAStreamGuard guard(stream);
    work();
  };
#else
  (void)device;
  return work;
#endif
}

std::shared_ptr<dp::BucketDevice> libtorch_bucket_device(int device) {
  (void)current_cuda_stream(device);  // refuses here, not at the first gradient
  return dp::cuda_bucket_device(device, [device] { return current_cuda_stream(device); });
}

}  // namespace braid::torch::detail
