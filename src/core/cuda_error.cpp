#include <fmt/format.h>

#include <braid/core/cuda_error.hpp>

namespace braid {
namespace {

class CudaCategory final : public std::error_category {
 public:
  const char* name() const noexcept override { return "cuda"; }
  std::string message(int value) const override {
    const auto status = static_cast<cudaError_t>(value);
    return fmt::format("{} ({})", cudaGetErrorString(status), cudaGetErrorName(status));
  }
};

}  // namespace

const std::error_category& cuda_category() noexcept {
  static const CudaCategory category;
  return category;
}

namespace detail {
void throw_cuda_error(cudaError_t status, const char* call, const char* file, int line) {
  (void)cudaGetLastError();
  throw Error(make_cuda_error_code(status), fmt::format("{} at {}:{}", call, file, line));
}
}  // namespace detail

}  // namespace braid
