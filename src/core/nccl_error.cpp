#include <cstring>

#include <fmt/format.h>

#include <braid/core/nccl_error.hpp>

namespace braid {
namespace {

class NcclCategory final : public std::error_category {
 public:
  const char* name() const noexcept override { return "nccl"; }
  std::string message(int value) const override {
    return ncclGetErrorString(static_cast<ncclResult_t>(value));
  }
};

}  // namespace

const std::error_category& nccl_category() noexcept {
  static const NcclCategory category;
  return category;
}

namespace detail {
void throw_nccl_error(ncclResult_t result, const char* call, const char* file, int line) {
  // NCCL keeps a thread-local description of the last failure (which argument, which
  // peer); it is the most useful part of the message when present.
  const char* last = ncclGetLastError(nullptr);
  std::string detail = fmt::format("{} at {}:{}", call, file, line);
  if (last != nullptr && std::strlen(last) > 0) detail += fmt::format(" ({})", last);
  throw Error(make_nccl_error_code(result), std::move(detail));
}
}  // namespace detail

}  // namespace braid
