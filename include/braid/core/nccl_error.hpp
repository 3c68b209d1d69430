// NCCL errors as braid::Error. Built only with CUDA and NCCL (BRAID_WITH_CUDA).
//
//   BRAID_NCCL_CHECK(ncclCommInitRankConfig(&comm, size, id, rank, &config));
//
// throws braid::Error whose code() is in nccl_category() (value: the ncclResult_t,
// message: ncclGetErrorString) and whose detail names the failed call, file and line,
// followed by NCCL's own last-error text when it has one. ncclInProgress is not success:
// non-blocking communicators poll for it explicitly rather than through this macro.
#pragma once

#include <system_error>

#include <nccl.h>

#include <braid/core/error.hpp>

namespace braid {

const std::error_category& nccl_category() noexcept;

inline std::error_code make_nccl_error_code(ncclResult_t result) noexcept {
  return {static_cast<int>(result), nccl_category()};
}

namespace detail {
[[noreturn]] void throw_nccl_error(ncclResult_t result, const char* call, const char* file,
                                   int line);
}  // namespace detail

}  // namespace braid

#define BRAID_NCCL_CHECK(expr)                                                          \
  do {                                                                                  \
    const ncclResult_t braid_nccl_result_ = (expr);                                     \
    if (braid_nccl_result_ != ncclSuccess) [[unlikely]] {                               \
      ::braid::detail::throw_nccl_error(braid_nccl_result_, #expr, __FILE__, __LINE__); \
    }                                                                                   \
  } while (false)
