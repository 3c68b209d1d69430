// CUDA helpers for code that drives devices beside braid: a scoped current device, a
// query status read as ready or not, and a deadline-bounded poll (CUDA's blocking
// synchronise calls take no deadline). braid's streams, events, GPU trace timelines, NCCL
// communicator and copy engines use them.
#pragma once

#include <algorithm>
#include <chrono>
#include <thread>

#include <cuda_runtime.h>

#include <braid/core/cuda_error.hpp>
#include <braid/core/deadline.hpp>

namespace braid {

// Makes a CUDA device current for a scope and restores the caller's device afterwards:
// streams and events are created on the current device. Two cudaGetDevice/cudaSetDevice
// calls (a few hundred ns), paid only where objects are created.
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

// The status of a query (cudaEventQuery, cudaStreamQuery): cudaSuccess is true;
// cudaErrorNotReady is false (and cleared from the last-error slot, as it is not an
// error); anything else throws.
inline bool cuda_ready(cudaError_t status, const char* call) {
  if (status == cudaErrorNotReady) {
    (void)cudaGetLastError();
    return false;
  }
  if (status != cudaSuccess) detail::throw_cuda_error(status, call, __FILE__, __LINE__);
  return true;
}

// Polls `done` until it returns true (then true) or `deadline` passes (then false):
// without pause for `spin`, then sleeping between polls with a backoff from 10 us to
// 1 ms, because CUDA's blocking synchronise calls take no deadline.
template <class Done>
bool poll_with_backoff(Deadline deadline, Done done,
                       Clock::duration spin = Clock::duration::zero()) {
  const auto spin_until = Clock::now() + spin;
  auto pause = std::chrono::microseconds(10);
  while (!done()) {
    const auto now = Clock::now();
    if (now >= deadline) return false;
    if (now >= spin_until) {
      std::this_thread::sleep_for(pause);
      pause = std::min<std::chrono::microseconds>(pause * 2, std::chrono::milliseconds(1));
    }
  }
  return true;
}

}  // namespace braid
