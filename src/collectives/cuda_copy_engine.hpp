// CudaCopyEngine: the staging pipeline's copy engine on a GPU (staging.hpp). Built only
// with CUDA (BRAID_WITH_CUDA).
//
// Copies run with cudaMemcpyAsync on a private non-blocking stream of the buffer's device,
// into and out of pinned host memory (cudaHostAlloc), which the GPU's copy engines reach
// by DMA at full PCIe or C2C speed, unlike pageable memory that the driver must bounce
// through its own pinned buffer. follow_producer() records an event on the producer
// stream (the buffer's own, or the communicator's) and makes the copy stream wait on it:
// copies start after the kernels that wrote the buffer, and the host never blocks on the
// GPU.
#pragma once

#include <cuda_runtime_api.h>

#include <braid/core/cuda_stream.hpp>

#include "collectives/staging.hpp"

namespace braid::collectives::detail {

class CudaCopyEngine final : public CopyEngine {
 public:
  // `producer`: the stream whose work writes and reads the caller's buffers (nullptr: the
  // device's legacy default stream).
  CudaCopyEngine(int device, cudaStream_t producer);

  int device() const noexcept { return device_; }
  Stream& stream() override { return stream_; }
  void copy(void* dst, const void* src, std::size_t bytes) override;
  StagingMemory allocate(std::size_t bytes) override;
  void follow_producer(Stream* producer) override;

 private:
  int device_;
  cudaStream_t producer_;
  CudaStream stream_;
  CudaEvent produced_;
};

}  // namespace braid::collectives::detail
