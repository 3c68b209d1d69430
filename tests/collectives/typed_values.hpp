// Test data for collectives: small integer values that every dtype holds exactly, so a
// reduction's result is known exactly whatever order an algorithm combines in, and a
// serial reference to compare with.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include <braid/collectives/reduce_kernels.hpp>
#include <braid/core/buffer.hpp>
#include <braid/core/reduce_op.hpp>

namespace braid::collectives::testing {

// Typed storage behind a Buffer: owned, or `count` elements at `storage` (someone else's).
class TypedVector {
 public:
  TypedVector(DType dtype, std::size_t count)
      : dtype_(dtype), count_(count), bytes_(count * dtype_size(dtype) + 1), data_(bytes_.data()) {}
  TypedVector(DType dtype, std::size_t count, std::byte* storage)
      : dtype_(dtype), count_(count), data_(storage) {}
  // A moved vector keeps its elements where they were; a copy would point at the original's.
  TypedVector(TypedVector&&) = default;
  TypedVector& operator=(TypedVector&&) = default;
  Buffer buffer() { return Buffer(data_, count_, dtype_); }
  std::size_t count() const { return count_; }
  DType dtype() const { return dtype_; }

  void set(std::size_t i, double value) {
    std::byte* at = data_ + i * dtype_size(dtype_);
    switch (dtype_) {
      case DType::f32:
        store(at, static_cast<float>(value));
        break;
      case DType::f64:
        store(at, value);
        break;
      case DType::f16:
        store(at, f32_to_f16(static_cast<float>(value)));
        break;
      case DType::bf16:
        store(at, f32_to_bf16(static_cast<float>(value)));
        break;
      case DType::i32:
        store(at, static_cast<std::int32_t>(static_cast<std::int64_t>(value)));
        break;
      case DType::i64:
        store(at, static_cast<std::int64_t>(value));
        break;
      case DType::u8:
        store(at, static_cast<std::uint8_t>(static_cast<std::int64_t>(value)));
        break;
    }
  }
  double get(std::size_t i) const {
    const std::byte* at = data_ + i * dtype_size(dtype_);
    switch (dtype_) {
      case DType::f32:
        return load<float>(at);
      case DType::f64:
        return load<double>(at);
      case DType::f16:
        return f16_to_f32(load<std::uint16_t>(at));
      case DType::bf16:
        return bf16_to_f32(load<std::uint16_t>(at));
      case DType::i32:
        return load<std::int32_t>(at);
      case DType::i64:
        return static_cast<double>(load<std::int64_t>(at));
      case DType::u8:
        return load<std::uint8_t>(at);
    }
    return 0;
  }
  void fill(double value) {
    for (std::size_t i = 0; i < count_; ++i) set(i, value);
  }

 private:
  template <class T>
  static void store(std::byte* at, T value) {
    std::memcpy(at, &value, sizeof(T));
  }
  template <class T>
  static T load(const std::byte* at) {
    T value;
    std::memcpy(&value, at, sizeof(T));
    return value;
  }

  DType dtype_;
  std::size_t count_;
  std::vector<std::byte> bytes_;  // one spare byte so that count 0 still has an address
  std::byte* data_;
};

inline bool is_float(DType dtype) {
  return dtype == DType::f32 || dtype == DType::f64 || dtype == DType::f16 || dtype == DType::bf16;
}

// Rank r's value at index i for reduce op `op`: small enough that sums over 8 ranks and
// products stay exact in every dtype (u8 products may wrap, as the reference does too).
inline double value_for(int rank, std::size_t i, DType dtype, ReduceOp op) {
  if (op == ReduceOp::prod) return 1 + static_cast<double>((rank + i) % 2);  // 1 or 2
  const auto v = static_cast<double>((static_cast<std::size_t>(rank) * 3 + i * 7) % 11);
  return dtype == DType::u8 ? v : v - 5;  // -5..5 where the dtype is signed
}

// The reduction over ranks 0..world-1 of value_for(r, i), with the dtype's semantics.
inline double reference(int world, std::size_t i, DType dtype, ReduceOp op) {
  double acc = value_for(0, i, dtype, op);
  for (int r = 1; r < world; ++r) {
    const double v = value_for(r, i, dtype, op);
    switch (op) {
      case ReduceOp::sum:
      case ReduceOp::avg:
        acc += v;
        break;
      case ReduceOp::prod:
        acc *= v;
        break;
      case ReduceOp::min:
        acc = std::min(acc, v);
        break;
      case ReduceOp::max:
        acc = std::max(acc, v);
        break;
    }
  }
  if (dtype == DType::u8)
    acc = static_cast<double>(static_cast<std::uint8_t>(static_cast<std::int64_t>(acc)));
  if (op == ReduceOp::avg) {
    if (is_float(dtype)) {
      // Divided once, in f32 for f16/bf16 and f32, then rounded to the dtype.
      if (dtype == DType::f64) return acc / world;
      const float quotient = static_cast<float>(acc) / static_cast<float>(world);
      if (dtype == DType::f16) return f16_to_f32(f32_to_f16(quotient));
      if (dtype == DType::bf16) return bf16_to_f32(f32_to_bf16(quotient));
      return quotient;
    }
    return static_cast<double>(static_cast<std::int64_t>(acc) / world);  // truncates toward 0
  }
  return acc;
}

}  // namespace braid::collectives::testing
