#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <braid/core/error.hpp>
#include <braid/torch/tensor_buffer.hpp>

using ::testing::HasSubstr;

namespace braid::torch {
namespace {

TEST(TensorBuffer, AContiguousCpuTensorIsViewedInPlaceWithItsType) {
  auto tensor = ::torch::arange(6, ::torch::kFloat64).reshape({2, 3});
  Buffer buffer = as_buffer(tensor);
  EXPECT_EQ(buffer.data(), tensor.data_ptr());
  EXPECT_EQ(buffer.count(), 6u);
  EXPECT_EQ(buffer.dtype(), DType::f64);
  EXPECT_EQ(buffer.memory(), MemoryKind::host);
  buffer.as<double>()[4] = 40.0;
  EXPECT_EQ(tensor[1][1].item<double>(), 40.0);
}

TEST(TensorBuffer, EveryBraidTypeMapsToATorchTypeAndBack) {
  for (DType dtype :
       {DType::f32, DType::f64, DType::f16, DType::bf16, DType::i32, DType::i64, DType::u8}) {
    auto tensor = ::torch::zeros({3}, ::torch::TensorOptions().dtype(scalar_type_of(dtype)));
    EXPECT_EQ(as_buffer(tensor).dtype(), dtype) << to_string(dtype);
    EXPECT_EQ(as_buffer(tensor).size_bytes(), 3 * dtype_size(dtype));
  }
}

TEST(TensorBuffer, ANonContiguousTensorIsRefusedWithItsShapeAndStrides) {
  auto transposed = ::torch::zeros({2, 3}).t();
  try {
    as_buffer(transposed);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::invalid_argument);
    EXPECT_THAT(e.what(), HasSubstr("shape [3, 2]"));
    EXPECT_THAT(e.what(), HasSubstr("is not contiguous"));
  }
}

TEST(TensorBuffer, TypesBraidDoesNotMoveAreRefused) {
  EXPECT_THROW(as_buffer(::torch::zeros({2}, ::torch::kBool)), Error);
  EXPECT_THROW(as_buffer(::torch::zeros({2}, ::torch::kComplexFloat)), Error);
  EXPECT_THROW(as_buffer(at::Tensor()), Error);
}

TEST(TensorBuffer, AnEmptyTensorIsAnEmptyBuffer) {
  EXPECT_TRUE(as_buffer(::torch::zeros({0})).empty());
}

}  // namespace
}  // namespace braid::torch
