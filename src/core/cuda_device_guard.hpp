// Makes a CUDA device current for a scope and restores the caller's device afterwards:
// streams and events are created on the current device. Two cudaGetDevice/cudaSetDevice
// calls (a few hundred ns), paid only where objects are created.
#pragma once

#include <cuda_runtime.h>

#include <braid/core/cuda_error.hpp>

namespace braid::detail {

class CudaDeviceGuard {
 public:
  explicit CudaDeviceGuard(int device) {
    BRAID_CUDA_CHECK(cudaGetDevice(&previous_));
    if (previous_ != device) BRAID_CUDA_CHECK(cudaSetDevice(device));
  }
  ~CudaDeviceGuard() { (void)cudaSetDevice(previous_); }
  CudaDeviceGuard(const CudaDeviceGuard&) = delete;
  CudaDeviceGuard& operator=(const CudaDeviceGuard&) = delete;

 private:
  int previous_ = 0;
};

}  // namespace braid::detail
