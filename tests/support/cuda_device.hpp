// Whether this machine has a CUDA device: GPU-labelled tests skip themselves without one.
#pragma once

#include <cuda_runtime_api.h>

namespace braid::testing {

inline bool has_cuda_device() {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  (void)cudaGetLastError();
  return status == cudaSuccess && count > 0;
}

}  // namespace braid::testing
