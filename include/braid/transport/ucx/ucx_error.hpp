// UCX status codes as std::error_code, and the one checking macro for UCX calls.
//
// A ucs_status_t error (a negative value) becomes std::error_code{status, ucx_category()};
// message() is ucs_status_string(). UCX headers stay out of this header: the status
// travels as an int, so users of braid need no UCX include path.
//
//   BRAID_UCX_CHECK(ucp_worker_create(context, &params, &worker), {.rank = rank_});
//
// throws braid::Error with the UCX code, the failing call's text and the given
// ErrorContext when the call returns an error. It is meant for set-up and tear-down
// calls; the send/receive hot path turns statuses into errors itself, with the peer and
// sequence of the operation.
#pragma once

#include <system_error>

#include <braid/core/error.hpp>

namespace braid::transport {

const std::error_category& ucx_category() noexcept;

// `status` is a ucs_status_t.
std::error_code make_ucx_error_code(int status) noexcept;

namespace detail {
[[noreturn]] void throw_ucx_error(int status, const char* call, const ErrorContext& context);
}  // namespace detail

}  // namespace braid::transport

// `call` is evaluated once; UCS_OK and the positive "in progress" statuses pass.
#define BRAID_UCX_CHECK(call, ...)                                                     \
  do {                                                                                 \
    const int braid_ucx_status = static_cast<int>(call);                               \
    if (braid_ucx_status < 0) [[unlikely]] {                                           \
      ::braid::transport::detail::throw_ucx_error(braid_ucx_status, #call,             \
                                                  ::braid::ErrorContext(__VA_ARGS__)); \
    }                                                                                  \
  } while (false)
