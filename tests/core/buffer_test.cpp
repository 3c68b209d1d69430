#include <gtest/gtest.h>

#include <braid/core/buffer.hpp>
#include <braid/core/reduce_op.hpp>

namespace braid {
namespace {

TEST(DType, SizesAndNames) {
  EXPECT_EQ(dtype_size(DType::f32), 4u);
  EXPECT_EQ(dtype_size(DType::f64), 8u);
  EXPECT_EQ(dtype_size(DType::f16), 2u);
  EXPECT_EQ(dtype_size(DType::bf16), 2u);
  EXPECT_EQ(dtype_size(DType::i32), 4u);
  EXPECT_EQ(dtype_size(DType::i64), 8u);
  EXPECT_EQ(dtype_size(DType::u8), 1u);
  EXPECT_EQ(to_string(DType::bf16), "bf16");
  EXPECT_EQ(to_string(ReduceOp::avg), "avg");
  static_assert(dtype_of<double> == DType::f64);
}

TEST(Buffer, ViewsAVectorWithItsDType) {
  std::vector<std::int64_t> values{1, 2, 3};
  Buffer buffer(values);
  EXPECT_EQ(buffer.data(), values.data());
  EXPECT_EQ(buffer.count(), 3u);
  EXPECT_EQ(buffer.dtype(), DType::i64);
  EXPECT_EQ(buffer.size_bytes(), 24u);
  EXPECT_EQ(buffer.memory(), MemoryKind::host);
  buffer.as<std::int64_t>()[1] = 20;
  EXPECT_EQ(values[1], 20);
}

TEST(Buffer, SliceIsBoundsChecked) {
  std::vector<float> values(10);
  Buffer buffer(values);
  Buffer tail = buffer.slice(7, 3);
  EXPECT_EQ(tail.data(), values.data() + 7);
  EXPECT_EQ(tail.count(), 3u);
  EXPECT_TRUE(buffer.slice(10, 0).empty());
  EXPECT_THROW(buffer.slice(8, 3), InvariantError);
  EXPECT_THROW(buffer.slice(11, 0), InvariantError);
}

TEST(Buffer, TypedAccessChecksDTypeAndMemory) {
  std::vector<float> values(4);
  Buffer buffer(values);
  EXPECT_THROW(buffer.as<double>(), InvariantError);
  int fake_device_memory = 0;
  Buffer device(&fake_device_memory, 1, DType::i32, MemoryKind::cuda, 0);
  EXPECT_THROW(device.as<std::int32_t>(), InvariantError);
}

TEST(Buffer, RejectsInconsistentConstruction) {
  EXPECT_THROW(Buffer(nullptr, 4, DType::f32), InvariantError);
  float x = 0;
  EXPECT_THROW(Buffer(&x, 1, DType::f32, MemoryKind::cuda, -1), InvariantError);
  EXPECT_THROW(Buffer(&x, 1, DType::f32, MemoryKind::host, 0), InvariantError);
}

}  // namespace
}  // namespace braid
