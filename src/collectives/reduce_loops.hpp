// The element loops of the reduction kernels (<braid/collectives/reduce_kernels.hpp>),
// private to the files that compile them: scalar f16/bf16 conversions, the element
// operations, and f16 through f32 with a codec of the instruction set's choosing.
//
// Every loop is written once, as plain C++ over one element type, and compiled three times:
// for the x86-64 baseline (SSE2, reduce_kernels_baseline.cpp), and inside functions marked
// target("avx2,f16c") and target("avx512f,...") (reduce_kernels_x86.cpp) so that GCC
// vectorises the same source for wider registers. Only f16 has hand-written vector code
// (F16C conversions, in reduce_kernels_x86.cpp). reduce_kernels.cpp picks one instruction
// set's table from CPUID (reduce_kernel_table.hpp).
//
// GCC 12 at -O2 (the project's debugoptimized build) vectorises with the "very cheap" cost
// model: only loops whose trip count is a known multiple of the vector width, and no run-time
// alias checks. Hence the loop shape used throughout (see kVectorStep), and
// BRAID_INDEPENDENT_ITERATIONS to tell the compiler that dst may equal a or b without a
// loop-carried dependence; restrict would be undefined behaviour for the in-place call, which
// is the common one in all-reduce.
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include <braid/core/dtype.hpp>
#include <braid/core/reduce_op.hpp>

#if defined(__clang__)
#define BRAID_INDEPENDENT_ITERATIONS _Pragma("clang loop vectorize(assume_safety)")
#elif defined(__GNUC__)
#define BRAID_INDEPENDENT_ITERATIONS _Pragma("GCC ivdep")
#else
#define BRAID_INDEPENDENT_ITERATIONS
#endif

// Helpers are always_inline so that they are compiled inside, and for the instruction set of,
// the kernel that calls them.
#define BRAID_INLINE [[gnu::always_inline]] inline

namespace braid::collectives::reduce_loops {

// Each vectorised loop is an outer loop over groups of kVectorStep elements around an inner
// loop with that constant trip count, then a scalar tail. 64 is a multiple of every vector
// width used here (64 u8 fill a 512-bit register). A plain loop over count & ~63 vectorises
// too, until inlining puts several in a row: GCC then loses track of the count's low zero
// bits and leaves them scalar (measured: bf16 at a tenth of the speed).
constexpr std::size_t kVectorStep = 64;

// ------------------------------------------------------------------ scalar conversions

BRAID_INLINE float half_to_float(std::uint16_t half) {
  const std::uint32_t sign = std::uint32_t{half & 0x8000u} << 16;
  const std::uint32_t exponent = (half >> 10) & 0x1Fu;
  const std::uint32_t mantissa = half & 0x3FFu;
  if (exponent == 0x1F) {
    // Infinity, or NaN made quiet with its payload kept: what F16C's vcvtph2ps does.
    const std::uint32_t quiet = mantissa != 0 ? 0x400000u : 0;
    return std::bit_cast<float>(sign | 0x7F800000u | quiet | (mantissa << 13));
  }
  if (exponent == 0) {
    // Zero or subnormal: mantissa * 2^-24, exact in f32.
    const float magnitude = static_cast<float>(mantissa) * 0x1p-24f;
    return sign != 0 ? -magnitude : magnitude;
  }
  return std::bit_cast<float>(sign | ((exponent + (127 - 15)) << 23) | (mantissa << 13));
}

BRAID_INLINE std::uint16_t float_to_half(float value) {
  const std::uint32_t bits = std::bit_cast<std::uint32_t>(value);
  const auto sign = static_cast<std::uint16_t>((bits >> 16) & 0x8000u);
  const std::uint32_t magnitude = bits & 0x7FFFFFFFu;
  if (magnitude > 0x7F800000u) {
    // NaN: quiet, sign and top payload bits kept, as F16C's vcvtps2ph does.
    return static_cast<std::uint16_t>(sign | 0x7E00u | ((magnitude >> 13) & 0x3FFu));
  }
  // 65520 is halfway between the largest f16 (65504) and the next step, 65536; the tie goes
  // to the even neighbour, which is infinity.
  if (magnitude >= 0x477FF000u) return static_cast<std::uint16_t>(sign | 0x7C00u);
  if (magnitude >= 0x38800000u) {
    // Normal f16 (>= 2^-14): rebias the exponent and round away 13 mantissa bits to nearest
    // even; a carry out of the mantissa correctly bumps the exponent.
    const std::uint32_t rounded = magnitude + 0xFFFu + ((magnitude >> 13) & 1u);
    return static_cast<std::uint16_t>(sign | ((rounded - ((127u - 15u) << 23)) >> 13));
  }
  // Subnormal f16: the result is round(value / 2^-24). Below 2^-25 that rounds to zero.
  const std::uint32_t exponent = magnitude >> 23;
  if (exponent < 102) return sign;
  const std::uint32_t significand = (magnitude & 0x7FFFFFu) | 0x800000u;
  const std::uint32_t shift = 126 - exponent;  // 14..24
  const std::uint32_t kept = significand >> shift;
  const std::uint32_t dropped = significand & ((1u << shift) - 1);
  const std::uint32_t half_step = 1u << (shift - 1);
  const bool round_up = dropped > half_step || (dropped == half_step && (kept & 1u) != 0);
  // Rounding 0x3FF up gives 0x400: the smallest normal, which is the right bit pattern.
  return static_cast<std::uint16_t>(sign | (kept + (round_up ? 1u : 0u)));
}

BRAID_INLINE float bfloat_to_float(std::uint16_t bfloat) {
  return std::bit_cast<float>(std::uint32_t{bfloat} << 16);
}

// Branch-free, in 32-bit lanes until one final shift, so that loops over it vectorise tightly.
BRAID_INLINE std::uint16_t float_to_bfloat(float value) {
  const std::uint32_t bits = std::bit_cast<std::uint32_t>(value);
  // A NaN is made quiet and its low half cleared, so that rounding cannot carry it into
  // infinity.
  const std::uint32_t kept = std::isnan(value) ? (bits | 0x400000u) & 0xFFFF0000u : bits;
  // Adding just under half a bf16 step, plus one when the kept part is odd, rounds to nearest
  // even; overflow carries into the exponent and ends at infinity, as it should.
  const std::uint32_t rounded = kept + 0x7FFFu + ((kept >> 16) & 1u);
  return static_cast<std::uint16_t>(rounded >> 16);
}

// ------------------------------------------------------------------ element operations

template <DType D>
struct Storage;
// clang-format off
template <> struct Storage<DType::f32> { using type = float; };
template <> struct Storage<DType::f64> { using type = double; };
template <> struct Storage<DType::f16> { using type = std::uint16_t; };
template <> struct Storage<DType::bf16> { using type = std::uint16_t; };
template <> struct Storage<DType::i32> { using type = std::int32_t; };
template <> struct Storage<DType::i64> { using type = std::int64_t; };
template <> struct Storage<DType::u8> { using type = std::uint8_t; };
// clang-format on

template <ReduceOp Op, class T>
BRAID_INLINE T combine(T a, T b) {
  static_assert(Op != ReduceOp::avg, "avg is instantiated as sum");
  if constexpr (std::is_integral_v<T>) {
    // Wrap-around arithmetic in an unsigned type at least as wide as unsigned int (u8 would
    // otherwise promote to signed int); converting back to T is modular since C++20.
    using Wide = decltype(std::make_unsigned_t<T>{} + 0u);
    if constexpr (Op == ReduceOp::sum) {
      return static_cast<T>(static_cast<Wide>(a) + static_cast<Wide>(b));
    } else if constexpr (Op == ReduceOp::prod) {
      return static_cast<T>(static_cast<Wide>(a) * static_cast<Wide>(b));
    } else if constexpr (Op == ReduceOp::min) {
      return b < a ? b : a;
    } else {
      return a < b ? b : a;
    }
  } else {
    if constexpr (Op == ReduceOp::sum) {
      return a + b;
    } else if constexpr (Op == ReduceOp::prod) {
      return a * b;
    } else if constexpr (Op == ReduceOp::min) {
      // `b < a ? b : a` is one vminps, which returns a when either is NaN; the NaN test on b
      // completes the propagation for one compare and blend more.
      return std::isnan(b) ? b : (b < a ? b : a);
    } else {
      return std::isnan(b) ? b : (a < b ? b : a);
    }
  }
}

// How a stored element becomes the value an operation works on, and back: itself for the
// native types; f32 for bf16, converted inside the loop, since shifts and integer rounding
// vectorise as well as the operation does. (f16 needs F16C to vectorise; see below.)
template <class T>
struct AsIs {
  using Stored = T;
  BRAID_INLINE static T load(T value) { return value; }
  BRAID_INLINE static T store(T value) { return value; }
};

struct Bf16AsF32 {
  using Stored = std::uint16_t;
  BRAID_INLINE static float load(std::uint16_t bits) { return bfloat_to_float(bits); }
  BRAID_INLINE static std::uint16_t store(float value) { return float_to_bfloat(value); }
};

template <class Element, ReduceOp Op>
BRAID_INLINE typename Element::Stored reduce_one(typename Element::Stored a,
                                                 typename Element::Stored b) {
  return Element::store(combine<Op>(Element::load(a), Element::load(b)));
}

template <class Element, ReduceOp Op>
BRAID_INLINE void reduce_elements(typename Element::Stored* dst, const typename Element::Stored* a,
                                  const typename Element::Stored* b, std::size_t count) {
  std::size_t i = 0;
  for (; i + kVectorStep <= count; i += kVectorStep) {
    BRAID_INDEPENDENT_ITERATIONS
    for (std::size_t j = i; j < i + kVectorStep; ++j) dst[j] = reduce_one<Element, Op>(a[j], b[j]);
  }
  for (; i < count; ++i) dst[i] = reduce_one<Element, Op>(a[i], b[i]);
}

// Calls body with how a float is divided by divisor. Division, not a multiply by the
// reciprocal: it rounds once, so avg of equal values gives that value back. Rank counts are
// exact in float. A power of two has an exact reciprocal, so there the multiply gives the
// same bits, at a fraction of the cost (a 512-bit divide issues every ~10 cycles, a
// multiply every cycle; measured in a DDP step, the division was a third of the
// reduction's time).
template <class Value, class Body>
BRAID_INLINE void with_division_by(int divisor, Body body) {
  if ((divisor & (divisor - 1)) == 0) {
    const Value reciprocal = Value{1} / static_cast<Value>(divisor);
    body([reciprocal](Value x) { return x * reciprocal; });
  } else {
    const auto scale = static_cast<Value>(divisor);
    body([scale](Value x) { return x / scale; });
  }
}

template <class Element>
BRAID_INLINE void divide_elements(typename Element::Stored* data, std::size_t count, int divisor) {
  using Value = decltype(Element::load(*data));
  if constexpr (std::is_floating_point_v<Value>) {
    with_division_by<Value>(divisor, [&](auto divided) {
      std::size_t i = 0;
      for (; i + kVectorStep <= count; i += kVectorStep) {
        for (std::size_t j = i; j < i + kVectorStep; ++j) {
          data[j] = Element::store(divided(Element::load(data[j])));
        }
      }
      for (; i < count; ++i) data[i] = Element::store(divided(Element::load(data[i])));
    });
  } else {
    // Truncates toward zero. No SIMD integer division exists, so this runs scalar; integer
    // avg is rare. divisor > 0 rules out the one overflow, INT_MIN / -1.
    using Wide = std::common_type_t<Value, int>;
    const auto scale = static_cast<Wide>(divisor);
    for (std::size_t i = 0; i < count; ++i) {
      data[i] = static_cast<Value>(static_cast<Wide>(data[i]) / scale);
    }
  }
}

// reduce_elements<Element, sum> then divide_elements, in one pass: the sum is stored
// (rounded to the element type) and loaded again before the division, so the bits are
// those of the two passes.
template <class Element>
BRAID_INLINE void sum_and_divide_elements(typename Element::Stored* dst,
                                          const typename Element::Stored* a,
                                          const typename Element::Stored* b, std::size_t count,
                                          int divisor) {
  using Value = decltype(Element::load(*dst));
  with_division_by<Value>(divisor, [&](auto divided) {
    auto one = [&](std::size_t j) {
      return Element::store(divided(Element::load(reduce_one<Element, ReduceOp::sum>(a[j], b[j]))));
    };
    std::size_t i = 0;
    for (; i + kVectorStep <= count; i += kVectorStep) {
      BRAID_INDEPENDENT_ITERATIONS
      for (std::size_t j = i; j < i + kVectorStep; ++j) dst[j] = one(j);
    }
    for (; i < count; ++i) dst[i] = one(i);
  });
}

// ------------------------------------------------------------------ f16 through f32

// f16 codecs widen blocks of bit patterns to f32 and narrow them back: with F16C on x86
// (reduce_kernels_x86.cpp), one element at a time elsewhere (its exponent and subnormal
// cases make portable code branchy).
struct ScalarF16Codec {
  BRAID_INLINE static void widen(float* dst, const std::uint16_t* src, std::size_t count) {
    for (std::size_t i = 0; i < count; ++i) dst[i] = half_to_float(src[i]);
  }
  BRAID_INLINE static void narrow(std::uint16_t* dst, const float* src, std::size_t count) {
    for (std::size_t i = 0; i < count; ++i) dst[i] = float_to_half(src[i]);
  }
};

// f16 is widened a block at a time into f32 buffers on the stack: 2 x 2 KiB stays
// in L1, so the extra passes over them cost cache bandwidth, not memory bandwidth.
constexpr std::size_t kWideBlock = 512;

template <class Codec, ReduceOp Op>
BRAID_INLINE void reduce_through_f32(std::uint16_t* dst, const std::uint16_t* a,
                                     const std::uint16_t* b, std::size_t count) {
  alignas(64) float wide_a[kWideBlock];
  alignas(64) float wide_b[kWideBlock];
  // Block k of dst is written only after block k of a and b has been read, so dst == a or
  // dst == b is safe.
  for (std::size_t start = 0; start < count; start += kWideBlock) {
    const std::size_t n = std::min(kWideBlock, count - start);
    Codec::widen(wide_a, a + start, n);
    Codec::widen(wide_b, b + start, n);
    reduce_elements<AsIs<float>, Op>(wide_a, wide_a, wide_b, n);
    Codec::narrow(dst + start, wide_a, n);
  }
}

template <class Codec>
BRAID_INLINE void divide_through_f32(std::uint16_t* data, std::size_t count, int divisor) {
  alignas(64) float wide[kWideBlock];
  for (std::size_t start = 0; start < count; start += kWideBlock) {
    const std::size_t n = std::min(kWideBlock, count - start);
    Codec::widen(wide, data + start, n);
    divide_elements<AsIs<float>>(wide, n, divisor);
    Codec::narrow(data + start, wide, n);
  }
}

template <class F16Codec, DType D, ReduceOp Op>
BRAID_INLINE void reduce_any(void* dst, const void* a, const void* b, std::size_t count) {
  using T = typename Storage<D>::type;
  auto* typed_dst = static_cast<T*>(dst);
  const auto* typed_a = static_cast<const T*>(a);
  const auto* typed_b = static_cast<const T*>(b);
  if constexpr (D == DType::f16) {
    reduce_through_f32<F16Codec, Op>(typed_dst, typed_a, typed_b, count);
  } else if constexpr (D == DType::bf16) {
    reduce_elements<Bf16AsF32, Op>(typed_dst, typed_a, typed_b, count);
  } else {
    reduce_elements<AsIs<T>, Op>(typed_dst, typed_a, typed_b, count);
  }
}

template <class F16Codec, DType D>
BRAID_INLINE void divide_any(void* data, std::size_t count, int divisor) {
  using T = typename Storage<D>::type;
  auto* typed = static_cast<T*>(data);
  if constexpr (D == DType::f16) {
    divide_through_f32<F16Codec>(typed, count, divisor);
  } else if constexpr (D == DType::bf16) {
    divide_elements<Bf16AsF32>(typed, count, divisor);
  } else {
    divide_elements<AsIs<T>>(typed, count, divisor);
  }
}

template <class F16Codec, DType D>
BRAID_INLINE void reduce_and_divide_any(void* dst, const void* a, const void* b, std::size_t count,
                                        int divisor) {
  using T = typename Storage<D>::type;
  if constexpr (D == DType::f32 || D == DType::f64) {
    sum_and_divide_elements<AsIs<T>>(static_cast<T*>(dst), static_cast<const T*>(a),
                                     static_cast<const T*>(b), count, divisor);
  } else if constexpr (D == DType::bf16) {
    sum_and_divide_elements<Bf16AsF32>(static_cast<T*>(dst), static_cast<const T*>(a),
                                       static_cast<const T*>(b), count, divisor);
  } else {
    reduce_any<F16Codec, D, ReduceOp::sum>(dst, a, b, count);
    divide_any<F16Codec, D>(dst, count, divisor);
  }
}

}  // namespace braid::collectives::reduce_loops
