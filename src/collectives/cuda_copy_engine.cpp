#include "collectives/cuda_copy_engine.hpp"

#include <cuda_runtime.h>

#include <braid/core/cuda_error.hpp>
#include <braid/core/cuda_support.hpp>
#include <braid/core/enforce.hpp>

namespace braid::collectives::detail {

CudaCopyEngine::CudaCopyEngine(int device, cudaStream_t producer)
    : device_(device), producer_(producer), stream_(device), produced_(device) {}

void CudaCopyEngine::copy(void* dst, const void* src, std::size_t bytes) {
  const braid::CudaDeviceGuard guard(device_);
  BRAID_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream_.native()));
}

StagingMemory CudaCopyEngine::allocate(std::size_t bytes) {
  const braid::CudaDeviceGuard guard(device_);
  void* memory = nullptr;
  // Portable: pinned for every device's copies, not only this one's.
  BRAID_CUDA_CHECK(cudaHostAlloc(&memory, bytes, cudaHostAllocPortable));
  return StagingMemory(static_cast<std::byte*>(memory),
                       [](std::byte* p) { (void)cudaFreeHost(p); });
}

void CudaCopyEngine::follow_producer(Stream* producer) {
  cudaStream_t native = producer_;
  if (producer != nullptr) {
    auto* cuda = dynamic_cast<CudaStream*>(producer);
    BRAID_ENFORCE(cuda != nullptr, "a CUDA buffer ordered on a {} stream",
                  to_string(producer->kind()));
    native = cuda->native();
  }
  const braid::CudaDeviceGuard guard(device_);
  BRAID_CUDA_CHECK(cudaEventRecord(produced_.native(), native));
  BRAID_CUDA_CHECK(cudaStreamWaitEvent(stream_.native(), produced_.native(), 0));
}

}  // namespace braid::collectives::detail
