#include <sstream>

#include <fmt/format.h>
#include <torch/torch.h>

#include <braid/core/error.hpp>
#include <braid/torch/tensor_buffer.hpp>

namespace braid::torch {
namespace {

std::string describe(const at::Tensor& tensor) {
  std::ostringstream out;
  out << "a " << tensor.scalar_type() << " tensor of shape " << tensor.sizes() << ", strides "
      << tensor.strides() << ", on " << tensor.device();
  return out.str();
}

}  // namespace

std::optional<DType> dtype_of(c10::ScalarType type) noexcept {
  switch (type) {
    case c10::ScalarType::Float:
      return DType::f32;
    case c10::ScalarType::Double:
      return DType::f64;
    case c10::ScalarType::Half:
      return DType::f16;
    case c10::ScalarType::BFloat16:
      return DType::bf16;
    case c10::ScalarType::Int:
      return DType::i32;
    case c10::ScalarType::Long:
      return DType::i64;
    case c10::ScalarType::Byte:
      return DType::u8;
    default:
      return std::nullopt;
  }
}

c10::ScalarType scalar_type_of(DType dtype) noexcept {
  switch (dtype) {
    case DType::f32:
      return c10::ScalarType::Float;
    case DType::f64:
      return c10::ScalarType::Double;
    case DType::f16:
      return c10::ScalarType::Half;
    case DType::bf16:
      return c10::ScalarType::BFloat16;
    case DType::i32:
      return c10::ScalarType::Int;
    case DType::i64:
      return c10::ScalarType::Long;
    case DType::u8:
      return c10::ScalarType::Byte;
  }
  return c10::ScalarType::Undefined;
}

Buffer as_buffer(const at::Tensor& tensor) {
  const auto dtype = dtype_of(tensor.scalar_type());
  if (!tensor.defined() || !dtype) {
    throw Error(Errc::invalid_argument,
                tensor.defined() ? describe(tensor) + ": braid does not move this type"
                                 : std::string("an undefined tensor has no memory"),
                {.operation = "as_buffer"});
  }
  if (!tensor.is_contiguous()) {
    throw Error(Errc::invalid_argument,
                describe(tensor) + " is not contiguous; call .contiguous() first",
                {.operation = "as_buffer"});
  }
  if (tensor.is_cpu()) {
    return Buffer(tensor.data_ptr(), static_cast<std::size_t>(tensor.numel()), *dtype);
  }
  if (tensor.is_cuda()) {
    return Buffer(tensor.data_ptr(), static_cast<std::size_t>(tensor.numel()), *dtype,
                  MemoryKind::cuda, tensor.get_device());
  }
  throw Error(Errc::invalid_argument, describe(tensor) + ": braid moves CPU and CUDA memory only",
              {.operation = "as_buffer"});
}

}  // namespace braid::torch
