#include <string>

#include <fmt/format.h>
#include <ucs/type/status.h>

#include <braid/transport/ucx/ucx_error.hpp>

namespace braid::transport {
namespace {

class UcxCategory final : public std::error_category {
 public:
  const char* name() const noexcept override { return "ucx"; }

  std::string message(int value) const override {
    return ucs_status_string(static_cast<ucs_status_t>(value));
  }

  // Lets callers compare UCX codes with portable conditions (std::errc::timed_out...)
  // without knowing UCX's numbering.
  std::error_condition default_error_condition(int value) const noexcept override {
    switch (static_cast<ucs_status_t>(value)) {
      case UCS_ERR_NO_MEMORY:
        return std::errc::not_enough_memory;
      case UCS_ERR_INVALID_PARAM:
        return std::errc::invalid_argument;
      case UCS_ERR_TIMED_OUT:
      case UCS_ERR_ENDPOINT_TIMEOUT:
        return std::errc::timed_out;
      case UCS_ERR_CONNECTION_RESET:
        return std::errc::connection_reset;
      case UCS_ERR_UNREACHABLE:
        return std::errc::host_unreachable;
      case UCS_ERR_CANCELED:
        return std::errc::operation_canceled;
      case UCS_ERR_UNSUPPORTED:
        return std::errc::not_supported;
      case UCS_ERR_BUSY:
        return std::errc::device_or_resource_busy;
      case UCS_ERR_NO_DEVICE:
        return std::errc::no_such_device;
      default:
        return {value, *this};
    }
  }
};

}  // namespace

const std::error_category& ucx_category() noexcept {
  static const UcxCategory category;
  return category;
}

std::error_code make_ucx_error_code(int status) noexcept {
  return {status, ucx_category()};
}

namespace detail {
void throw_ucx_error(int status, const char* call, const ErrorContext& context) {
  throw Error(make_ucx_error_code(status), fmt::format("in {}", call), context);
}
}  // namespace detail

}  // namespace braid::transport
