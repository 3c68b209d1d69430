// CUDA runtime errors as braid::Error. Built only with CUDA (BRAID_WITH_CUDA).
//
//   BRAID_CUDA_CHECK(cudaStreamCreate(&stream));
//
// throws braid::Error whose code() is in cuda_category() (value: the cudaError_t,
// message: cudaGetErrorString) and whose detail names the failed call, file and line.
// The runtime's last-error slot is cleared first, so a non-sticky error is reported once
// rather than again by the next unrelated cudaGetLastError().
#pragma once

#include <system_error>

#include <cuda_runtime_api.h>

#include <braid/core/error.hpp>

namespace braid {

const std::error_category& cuda_category() noexcept;

inline std::error_code make_cuda_error_code(cudaError_t status) noexcept {
  return {static_cast<int>(status), cuda_category()};
}

namespace detail {
[[noreturn]] void throw_cuda_error(cudaError_t status, const char* call, const char* file,
                                   int line);
}  // namespace detail

}  // namespace braid

#define BRAID_CUDA_CHECK(expr)                                                          \
  do {                                                                                  \
    const cudaError_t braid_cuda_status_ = (expr);                                      \
    if (braid_cuda_status_ != cudaSuccess) [[unlikely]] {                               \
      ::braid::detail::throw_cuda_error(braid_cuda_status_, #expr, __FILE__, __LINE__); \
    }                                                                                   \
  } while (false)
