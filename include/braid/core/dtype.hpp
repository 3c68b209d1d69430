// Element types braid moves and reduces. f16 and bf16 are stored as 16-bit patterns and
// reduced through f32.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace braid {

enum class DType : std::uint8_t { f32, f64, f16, bf16, i32, i64, u8 };

constexpr std::size_t dtype_size(DType dtype) noexcept {
  switch (dtype) {
    case DType::f64:
    case DType::i64:
      return 8;
    case DType::f32:
    case DType::i32:
      return 4;
    case DType::f16:
    case DType::bf16:
      return 2;
    case DType::u8:
      return 1;
  }
  return 0;
}

constexpr std::string_view to_string(DType dtype) noexcept {
  switch (dtype) {
    case DType::f32:
      return "f32";
    case DType::f64:
      return "f64";
    case DType::f16:
      return "f16";
    case DType::bf16:
      return "bf16";
    case DType::i32:
      return "i32";
    case DType::i64:
      return "i64";
    case DType::u8:
      return "u8";
  }
  return "?";
}

// The DType of a C++ element type, for the types that have one natively.
template <class T>
struct DTypeOf;
template <>
struct DTypeOf<float> {
  static constexpr DType value = DType::f32;
};
template <>
struct DTypeOf<double> {
  static constexpr DType value = DType::f64;
};
template <>
struct DTypeOf<std::int32_t> {
  static constexpr DType value = DType::i32;
};
template <>
struct DTypeOf<std::int64_t> {
  static constexpr DType value = DType::i64;
};
template <>
struct DTypeOf<std::uint8_t> {
  static constexpr DType value = DType::u8;
};
template <class T>
inline constexpr DType dtype_of = DTypeOf<T>::value;

}  // namespace braid
