#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include <gtest/gtest.h>

#include <braid/collectives/reduce_kernels.hpp>
#include <braid/core/enforce.hpp>

namespace braid::collectives {
namespace {

constexpr DType kAllDTypes[] = {DType::f32, DType::f64, DType::f16, DType::bf16,
                                DType::i32, DType::i64, DType::u8};
constexpr ReduceOp kAllOps[] = {ReduceOp::sum, ReduceOp::avg, ReduceOp::min, ReduceOp::max,
                                ReduceOp::prod};

// Empty, shorter than any vector, not a multiple of any vector width, and long enough to run
// the vector loops over several f16/bf16 blocks with a tail.
constexpr std::size_t kOddCounts[] = {0, 1, 7, 33, 1000 + 3};

// ------------------------------------------------------------------ a scalar reference

// Written independently of the kernels: integers wrap by computing in uint64_t and keeping
// the low bits; float min/max say NaN explicitly.
template <class T>
T reference_op(ReduceOp op, T a, T b) {
  if constexpr (std::is_integral_v<T>) {
    const auto wide_a = static_cast<std::uint64_t>(a);
    const auto wide_b = static_cast<std::uint64_t>(b);
    switch (op) {
      case ReduceOp::sum:
      case ReduceOp::avg:
        return static_cast<T>(wide_a + wide_b);
      case ReduceOp::prod:
        return static_cast<T>(wide_a * wide_b);
      case ReduceOp::min:
        return std::min(a, b);
      case ReduceOp::max:
        return std::max(a, b);
    }
  } else {
    if (op == ReduceOp::min || op == ReduceOp::max) {
      if (std::isnan(a) || std::isnan(b)) return std::numeric_limits<T>::quiet_NaN();
      return op == ReduceOp::min ? std::min(a, b) : std::max(a, b);
    }
    return op == ReduceOp::prod ? a * b : a + b;
  }
  return T{};
}

template <class T>
T load(const std::vector<std::byte>& bytes, std::size_t i) {
  T value;
  std::memcpy(&value, bytes.data() + i * sizeof(T), sizeof(T));
  return value;
}

template <class T>
void store(std::vector<std::byte>& bytes, std::size_t i, T value) {
  std::memcpy(bytes.data() + i * sizeof(T), &value, sizeof(T));
}

// Element i as a double (f16/bf16 decoded), for messages and NaN checks.
double element(const std::vector<std::byte>& bytes, std::size_t i, DType dtype) {
  switch (dtype) {
    case DType::f32:
      return load<float>(bytes, i);
    case DType::f64:
      return load<double>(bytes, i);
    case DType::f16:
      return f16_to_f32(load<std::uint16_t>(bytes, i));
    case DType::bf16:
      return bf16_to_f32(load<std::uint16_t>(bytes, i));
    case DType::i32:
      return load<std::int32_t>(bytes, i);
    case DType::i64:
      return static_cast<double>(load<std::int64_t>(bytes, i));
    case DType::u8:
      return load<std::uint8_t>(bytes, i);
  }
  return 0;
}

std::vector<std::byte> reference_reduce(const std::vector<std::byte>& a,
                                        const std::vector<std::byte>& b, std::size_t count,
                                        DType dtype, ReduceOp op) {
  std::vector<std::byte> dst(a.size());
  for (std::size_t i = 0; i < count; ++i) {
    switch (dtype) {
      case DType::f32:
        store(dst, i, reference_op(op, load<float>(a, i), load<float>(b, i)));
        break;
      case DType::f64:
        store(dst, i, reference_op(op, load<double>(a, i), load<double>(b, i)));
        break;
      case DType::f16:
        store(dst, i,
              f32_to_f16(reference_op(op, static_cast<float>(element(a, i, dtype)),
                                      static_cast<float>(element(b, i, dtype)))));
        break;
      case DType::bf16:
        store(dst, i,
              f32_to_bf16(reference_op(op, static_cast<float>(element(a, i, dtype)),
                                       static_cast<float>(element(b, i, dtype)))));
        break;
      case DType::i32:
        store(dst, i, reference_op(op, load<std::int32_t>(a, i), load<std::int32_t>(b, i)));
        break;
      case DType::i64:
        store(dst, i, reference_op(op, load<std::int64_t>(a, i), load<std::int64_t>(b, i)));
        break;
      case DType::u8:
        store(dst, i, reference_op(op, load<std::uint8_t>(a, i), load<std::uint8_t>(b, i)));
        break;
    }
  }
  return dst;
}

// Half the elements are random bit patterns (for floats: NaN, infinities, subnormals, huge
// and tiny values; for integers: sums and products that wrap), half small values whose sums
// and products are ordinary.
std::vector<std::byte> random_operand(DType dtype, std::size_t count, std::uint32_t seed) {
  std::mt19937_64 random(seed);
  const std::size_t size = dtype_size(dtype);
  std::vector<std::byte> bytes(count * size);
  for (std::size_t i = 0; i < count; ++i) {
    const std::uint64_t bits = random();
    const bool ordinary = (bits & 1) != 0;
    const auto small = static_cast<int>(bits >> 59) - 16;  // -16..15
    const double fraction = small + static_cast<double>((bits >> 40) & 0xFF) / 256;
    switch (dtype) {
      case DType::f32:
        if (ordinary)
          store(bytes, i, static_cast<float>(fraction));
        else
          store(bytes, i, static_cast<std::uint32_t>(bits >> 1));
        break;
      case DType::f64:
        if (ordinary)
          store(bytes, i, fraction);
        else
          store(bytes, i, bits >> 1 | bits << 63);
        break;
      case DType::f16:
        if (ordinary)
          store(bytes, i, f32_to_f16(static_cast<float>(fraction)));
        else
          store(bytes, i, static_cast<std::uint16_t>(bits >> 1));
        break;
      case DType::bf16:
        if (ordinary)
          store(bytes, i, f32_to_bf16(static_cast<float>(fraction)));
        else
          store(bytes, i, static_cast<std::uint16_t>(bits >> 1));
        break;
      case DType::i32:
        store(bytes, i, ordinary ? small : static_cast<std::int32_t>(bits >> 1));
        break;
      case DType::i64:
        store(bytes, i, ordinary ? std::int64_t{small} : static_cast<std::int64_t>(bits));
        break;
      case DType::u8:
        store(bytes, i, static_cast<std::uint8_t>(ordinary ? small + 16 : bits >> 1));
        break;
    }
  }
  return bytes;
}

bool is_float(DType dtype) {
  return dtype == DType::f32 || dtype == DType::f64 || dtype == DType::f16 || dtype == DType::bf16;
}

// Bit-for-bit equal, except that any NaN equals any NaN: which payload a NaN carries after
// an operation is the hardware's choice.
::testing::AssertionResult same_elements(const std::vector<std::byte>& expected,
                                         const std::vector<std::byte>& actual, std::size_t count,
                                         DType dtype) {
  const std::size_t size = dtype_size(dtype);
  for (std::size_t i = 0; i < count; ++i) {
    const double want = element(expected, i, dtype);
    const double got = element(actual, i, dtype);
    if (is_float(dtype) && std::isnan(want) && std::isnan(got)) continue;
    if (std::memcmp(expected.data() + i * size, actual.data() + i * size, size) != 0) {
      return ::testing::AssertionFailure()
             << "element " << i << " of " << count << ": expected " << want << ", got " << got;
    }
  }
  return ::testing::AssertionSuccess();
}

// ------------------------------------------------------------------ every dtype x op

class ReduceEveryDTypeAndOp : public ::testing::TestWithParam<std::tuple<DType, ReduceOp>> {};

TEST_P(ReduceEveryDTypeAndOp, MatchesScalarReferenceForOddCounts) {
  const auto [dtype, op] = GetParam();
  for (std::size_t count : kOddCounts) {
    SCOPED_TRACE("count " + std::to_string(count));
    const std::vector<std::byte> a = random_operand(dtype, count, 1);
    const std::vector<std::byte> b = random_operand(dtype, count, 2);
    std::vector<std::byte> dst(a.size());
    reduce(dst.data(), a.data(), b.data(), count, dtype, op);
    EXPECT_TRUE(same_elements(reference_reduce(a, b, count, dtype, op), dst, count, dtype));
  }
}

TEST_P(ReduceEveryDTypeAndOp, InPlaceIntoEitherOperandMatchesReference) {
  const auto [dtype, op] = GetParam();
  for (std::size_t count : kOddCounts) {
    SCOPED_TRACE("count " + std::to_string(count));
    const std::vector<std::byte> a = random_operand(dtype, count, 3);
    const std::vector<std::byte> b = random_operand(dtype, count, 4);
    const std::vector<std::byte> expected = reference_reduce(a, b, count, dtype, op);

    std::vector<std::byte> into_a = a;
    reduce(into_a.data(), into_a.data(), b.data(), count, dtype, op);
    EXPECT_TRUE(same_elements(expected, into_a, count, dtype)) << "dst == a";

    std::vector<std::byte> into_b = b;
    reduce(into_b.data(), a.data(), into_b.data(), count, dtype, op);
    EXPECT_TRUE(same_elements(expected, into_b, count, dtype)) << "dst == b";

    std::vector<std::byte> all_three = a;
    reduce(all_three.data(), all_three.data(), all_three.data(), count, dtype, op);
    EXPECT_TRUE(same_elements(reference_reduce(a, a, count, dtype, op), all_three, count, dtype))
        << "dst == a == b";
  }
}

INSTANTIATE_TEST_SUITE_P(ReduceKernels, ReduceEveryDTypeAndOp,
                         ::testing::Combine(::testing::ValuesIn(kAllDTypes),
                                            ::testing::ValuesIn(kAllOps)),
                         [](const auto& info) {
                           return std::string(to_string(std::get<0>(info.param))) + "_" +
                                  std::string(to_string(std::get<1>(info.param)));
                         });

// ------------------------------------------------------------------ integer and float semantics

TEST(ReduceKernels, IntegerSumAndProdWrapAround) {
  const std::int32_t i32_a[] = {std::numeric_limits<std::int32_t>::max(), 65536};
  const std::int32_t i32_b[] = {1, 65536};
  std::int32_t i32_sum[2];
  std::int32_t i32_prod[2];
  reduce(i32_sum, i32_a, i32_b, 2, DType::i32, ReduceOp::sum);
  reduce(i32_prod, i32_a, i32_b, 2, DType::i32, ReduceOp::prod);
  EXPECT_EQ(i32_sum[0], std::numeric_limits<std::int32_t>::min());
  EXPECT_EQ(i32_prod[1], 0);

  const std::int64_t i64_a[] = {std::numeric_limits<std::int64_t>::min()};
  const std::int64_t i64_b[] = {-1};
  std::int64_t i64_sum[1];
  reduce(i64_sum, i64_a, i64_b, 1, DType::i64, ReduceOp::sum);
  EXPECT_EQ(i64_sum[0], std::numeric_limits<std::int64_t>::max());

  const std::uint8_t u8_a[] = {250, 16};
  const std::uint8_t u8_b[] = {10, 17};
  std::uint8_t u8_sum[2];
  std::uint8_t u8_prod[2];
  reduce(u8_sum, u8_a, u8_b, 2, DType::u8, ReduceOp::sum);
  reduce(u8_prod, u8_a, u8_b, 2, DType::u8, ReduceOp::prod);
  EXPECT_EQ(u8_sum[0], 4);
  EXPECT_EQ(u8_prod[1], (16 * 17) % 256);
}

TEST(ReduceKernels, FloatMinAndMaxPropagateNaNFromEitherSide) {
  // Long enough that the NaNs at the start meet the vector loop and the last ones the tail.
  constexpr std::size_t count = 1000 + 3;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> a(count, 1.0f);
  std::vector<float> b(count, 2.0f);
  for (std::size_t i : {std::size_t{0}, count - 2}) a[i] = nan;
  for (std::size_t i : {std::size_t{1}, count - 1}) b[i] = nan;
  for (ReduceOp op : {ReduceOp::min, ReduceOp::max}) {
    std::vector<float> dst(count);
    reduce(dst.data(), a.data(), b.data(), count, DType::f32, op);
    for (std::size_t i : {std::size_t{0}, std::size_t{1}, count - 2, count - 1}) {
      EXPECT_TRUE(std::isnan(dst[i])) << to_string(op) << " at " << i;
    }
    EXPECT_EQ(dst[2], op == ReduceOp::min ? 1.0f : 2.0f);
  }
}

TEST(ReduceKernels, AvgReducesLikeSum) {
  const double a[] = {1.5, -2};
  const double b[] = {2.5, 7};
  double dst[2];
  reduce(dst, a, b, 2, DType::f64, ReduceOp::avg);
  EXPECT_EQ(dst[0], 4.0);
  EXPECT_EQ(dst[1], 5.0);
}

TEST(ReduceKernels, F16AndBf16KernelsConvertEveryBitPatternLikeTheScalarConversions) {
  // x + (-0) == x for every x, so this is a round trip of all 65536 patterns through the
  // vector conversions (F16C where the CPU has it), compared with the scalar ones bit for bit.
  std::vector<std::uint16_t> every_pattern(65536);
  for (std::size_t i = 0; i < every_pattern.size(); ++i) {
    every_pattern[i] = static_cast<std::uint16_t>(i);
  }
  for (DType dtype : {DType::f16, DType::bf16}) {
    const std::vector<std::uint16_t> negative_zero(every_pattern.size(), 0x8000);
    std::vector<std::uint16_t> dst(every_pattern.size());
    reduce(dst.data(), every_pattern.data(), negative_zero.data(), dst.size(), dtype,
           ReduceOp::sum);
    for (std::size_t i = 0; i < dst.size(); ++i) {
      const auto pattern = static_cast<std::uint16_t>(i);
      const std::uint16_t expected =
          dtype == DType::f16 ? f32_to_f16(f16_to_f32(pattern)) : f32_to_bf16(bf16_to_f32(pattern));
      ASSERT_EQ(dst[i], expected) << to_string(dtype) << " pattern " << i;
    }
  }
}

// ------------------------------------------------------------------ divide

TEST(ReduceKernels, DivideTruncatesIntegersTowardZero) {
  std::int32_t i32[] = {-7, 7, -1, 0, std::numeric_limits<std::int32_t>::min()};
  divide(i32, 5, DType::i32, 2);
  EXPECT_EQ(i32[0], -3);
  EXPECT_EQ(i32[1], 3);
  EXPECT_EQ(i32[2], 0);
  EXPECT_EQ(i32[3], 0);
  EXPECT_EQ(i32[4], std::numeric_limits<std::int32_t>::min() / 2);

  std::int64_t i64[] = {-9, 9};
  divide(i64, 2, DType::i64, 4);
  EXPECT_EQ(i64[0], -2);
  EXPECT_EQ(i64[1], 2);

  std::uint8_t u8[] = {255, 7};
  divide(u8, 2, DType::u8, 2);
  EXPECT_EQ(u8[0], 127);
  EXPECT_EQ(u8[1], 3);
  std::uint8_t u8_by_more_than_255[] = {255};
  divide(u8_by_more_than_255, 1, DType::u8, 300);
  EXPECT_EQ(u8_by_more_than_255[0], 0);
}

// By 3, and by powers of two, which multiply by their exact reciprocal instead: the same
// bits as the division, subnormal results included.
TEST(ReduceKernels, DivideFloatsRoundsTheQuotientOnce) {
  for (const int divisor : {3, 2, 4, 8}) {
    const float by = static_cast<float>(divisor);
    for (DType dtype : {DType::f32, DType::f64, DType::f16, DType::bf16}) {
      SCOPED_TRACE(std::string(to_string(dtype)) + " / " + std::to_string(divisor));
      for (std::size_t count : kOddCounts) {
        std::vector<std::byte> data = random_operand(dtype, count, 5);
        std::vector<std::byte> expected(data.size());
        for (std::size_t i = 0; i < count; ++i) {
          switch (dtype) {
            case DType::f32:
              store(expected, i, load<float>(data, i) / by);
              break;
            case DType::f64:
              store(expected, i, load<double>(data, i) / divisor);
              break;
            case DType::f16:
              store(expected, i, f32_to_f16(f16_to_f32(load<std::uint16_t>(data, i)) / by));
              break;
            case DType::bf16:
              store(expected, i, f32_to_bf16(bf16_to_f32(load<std::uint16_t>(data, i)) / by));
              break;
            default:
              FAIL() << "not a float dtype";
          }
        }
        divide(data.data(), count, dtype, divisor);
        EXPECT_TRUE(same_elements(expected, data, count, dtype)) << "count " << count;
      }
    }
  }
  float tiny[] = {std::numeric_limits<float>::denorm_min() * 3,
                  std::numeric_limits<float>::min() * 1.5f};
  const float tiny_expected[] = {tiny[0] / 4, tiny[1] / 4};
  divide(tiny, 2, DType::f32, 4);
  EXPECT_EQ(tiny[0], tiny_expected[0]);
  EXPECT_EQ(tiny[1], tiny_expected[1]);
  // The point of dividing rather than multiplying by 1/3: the average of equal values is
  // that value.
  float equal_sum[] = {3 * 0.1f};
  divide(equal_sum, 1, DType::f32, 3);
  EXPECT_EQ(equal_sum[0], 3 * 0.1f / 3);
}

// The fused last step of an average gives the bits of the two passes it replaces, for
// every dtype (f16 and the integers run the two passes), divisors that multiply by their
// reciprocal and one that divides, out of place and in place.
TEST(ReduceKernels, ReduceAndDivideEqualsReduceThenDivide) {
  for (const int divisor : {1, 2, 3, 4, 7}) {
    for (DType dtype : kAllDTypes) {
      SCOPED_TRACE(std::string(to_string(dtype)) + " / " + std::to_string(divisor));
      for (std::size_t count : kOddCounts) {
        const std::vector<std::byte> a = random_operand(dtype, count, 6);
        const std::vector<std::byte> b = random_operand(dtype, count, 7);
        std::vector<std::byte> expected(a.size());
        reduce(expected.data(), a.data(), b.data(), count, dtype, ReduceOp::sum);
        divide(expected.data(), count, dtype, divisor);

        std::vector<std::byte> fused(a.size());
        reduce_and_divide(fused.data(), a.data(), b.data(), count, dtype, divisor);
        EXPECT_TRUE(same_elements(expected, fused, count, dtype)) << "count " << count;

        std::vector<std::byte> into_b = b;
        reduce_and_divide(into_b.data(), a.data(), into_b.data(), count, dtype, divisor);
        EXPECT_TRUE(same_elements(expected, into_b, count, dtype)) << "in place, count " << count;
      }
    }
  }
  float data[4] = {};
  EXPECT_THROW(reduce_and_divide(data, data, data, 1, DType::f32, 0), InvariantError);
  EXPECT_THROW(reduce_and_divide(data + 1, data, data + 2, 2, DType::f32, 2), InvariantError);
}

// ------------------------------------------------------------------ misuse

TEST(ReduceKernels, RejectsUnknownEnumeratorsPartialOverlapAndNonPositiveDivisors) {
  float data[8] = {};
  EXPECT_THROW(reduce(data, data, data, 1, static_cast<DType>(99), ReduceOp::sum), InvariantError);
  EXPECT_THROW(reduce(data, data, data, 1, DType::f32, static_cast<ReduceOp>(99)), InvariantError);
  EXPECT_THROW(reduce(data + 1, data, data + 4, 2, DType::f32, ReduceOp::sum), InvariantError);
  EXPECT_THROW(reduce(data, data + 4, data + 1, 2, DType::f32, ReduceOp::sum), InvariantError);
  EXPECT_NO_THROW(reduce(data, data + 4, data + 5, 2, DType::f32, ReduceOp::sum))
      << "a and b may overlap each other: they are only read";
  EXPECT_THROW(divide(data, 1, DType::f32, 0), InvariantError);
  EXPECT_THROW(divide(data, 1, DType::f32, -2), InvariantError);
  EXPECT_THROW(divide(data, 1, static_cast<DType>(99), 2), InvariantError);
}

// ------------------------------------------------------------------ scalar conversions

bool is_f16_nan(std::uint16_t bits) {
  return (bits & 0x7C00) == 0x7C00 && (bits & 0x3FF) != 0;
}
bool is_bf16_nan(std::uint16_t bits) {
  return (bits & 0x7F80) == 0x7F80 && (bits & 0x7F) != 0;
}

TEST(HalfConversions, F16DecodesAndRoundTripsEveryBitPattern) {
  for (std::uint32_t pattern = 0; pattern <= 0xFFFF; ++pattern) {
    const auto bits = static_cast<std::uint16_t>(pattern);
    const float value = f16_to_f32(bits);
    if (is_f16_nan(bits)) {
      EXPECT_TRUE(std::isnan(value)) << pattern;
      EXPECT_TRUE(is_f16_nan(f32_to_f16(value))) << pattern;
      continue;
    }
    // The value by the definition of binary16, computed another way.
    const int exponent = (pattern >> 10) & 0x1F;
    const int mantissa = pattern & 0x3FF;
    const double magnitude = exponent == 0x1F ? std::numeric_limits<double>::infinity()
                             : exponent == 0  ? std::ldexp(mantissa, -24)
                                              : std::ldexp(1024 + mantissa, exponent - 25);
    ASSERT_EQ(value, (pattern & 0x8000) != 0 ? -magnitude : magnitude) << pattern;
    ASSERT_EQ(std::signbit(value), (pattern & 0x8000) != 0) << pattern;
    ASSERT_EQ(f32_to_f16(value), bits) << pattern;
  }
}

TEST(HalfConversions, Bf16DecodesAndRoundTripsEveryBitPattern) {
  for (std::uint32_t pattern = 0; pattern <= 0xFFFF; ++pattern) {
    const auto bits = static_cast<std::uint16_t>(pattern);
    const float value = bf16_to_f32(bits);
    std::uint32_t value_bits;
    std::memcpy(&value_bits, &value, sizeof value);
    ASSERT_EQ(value_bits, pattern << 16) << pattern;
    if (is_bf16_nan(bits)) {
      EXPECT_TRUE(is_bf16_nan(f32_to_bf16(value))) << pattern;
    } else {
      ASSERT_EQ(f32_to_bf16(value), bits) << pattern;
    }
  }
}

TEST(HalfConversions, F16RoundsToNearestEven) {
  // Exactly halfway between two f16 values goes to the one with an even mantissa.
  EXPECT_EQ(f32_to_f16(1.0f + 0x1p-11f), 0x3C00);             // 1.0 (even) vs 1 + 2^-10
  EXPECT_EQ(f32_to_f16(1.0f + 3 * 0x1p-11f), 0x3C02);         // 1 + 2^-10 (odd) vs 1 + 2^-9
  EXPECT_EQ(f32_to_f16(1.0f + 0x1p-11f + 0x1p-20f), 0x3C01);  // just past halfway
  EXPECT_EQ(f32_to_f16(1.0f + 0x1p-11f - 0x1p-20f), 0x3C00);  // just short of it
  EXPECT_EQ(f32_to_f16(-(1.0f + 3 * 0x1p-11f)), 0xBC02);
  // Subnormals: steps of 2^-24.
  EXPECT_EQ(f32_to_f16(0x1p-25f), 0x0000);  // halfway to the smallest: to zero
  EXPECT_EQ(f32_to_f16(0x1p-25f * 1.0001f), 0x0001);
  EXPECT_EQ(f32_to_f16(3 * 0x1p-25f), 0x0002);         // 1 (odd) vs 2
  EXPECT_EQ(f32_to_f16(0x1p-14f - 0x1p-25f), 0x0400);  // largest subnormal up to normal
  EXPECT_EQ(f32_to_f16(0x1p-30f), 0x0000);
  EXPECT_EQ(f32_to_f16(-0x1p-30f), 0x8000);  // the sign survives underflow
}

TEST(HalfConversions, F16OverflowsToInfinity) {
  EXPECT_EQ(f32_to_f16(65504.0f), 0x7BFF);  // the largest f16
  EXPECT_EQ(f32_to_f16(65519.0f), 0x7BFF);  // below halfway to 65536
  EXPECT_EQ(f32_to_f16(65520.0f), 0x7C00);  // halfway: the even neighbour is infinity
  EXPECT_EQ(f32_to_f16(1e6f), 0x7C00);
  EXPECT_EQ(f32_to_f16(-1e6f), 0xFC00);
  EXPECT_EQ(f32_to_f16(std::numeric_limits<float>::infinity()), 0x7C00);
  EXPECT_TRUE(is_f16_nan(f32_to_f16(std::numeric_limits<float>::quiet_NaN())));
  EXPECT_TRUE(is_f16_nan(f32_to_f16(std::numeric_limits<float>::signaling_NaN())));
}

TEST(HalfConversions, Bf16RoundsToNearestEvenAndOverflowsToInfinity) {
  EXPECT_EQ(f32_to_bf16(1.0f + 0x1p-8f), 0x3F80);             // 1.0 (even) vs 1 + 2^-7
  EXPECT_EQ(f32_to_bf16(1.0f + 3 * 0x1p-8f), 0x3F82);         // 1 + 2^-7 (odd) vs 1 + 2^-6
  EXPECT_EQ(f32_to_bf16(1.0f + 0x1p-8f + 0x1p-20f), 0x3F81);  // just past halfway
  // Subnormals: steps of 2^-133.
  EXPECT_EQ(f32_to_bf16(0x1p-134f), 0x0000);      // halfway to the smallest: to zero
  EXPECT_EQ(f32_to_bf16(3 * 0x1p-134f), 0x0002);  // 1 (odd) vs 2
  EXPECT_EQ(f32_to_bf16(std::numeric_limits<float>::max()), 0x7F80);
  EXPECT_EQ(f32_to_bf16(-std::numeric_limits<float>::max()), 0xFF80);
  // A NaN whose payload sits in the bits rounding drops must not round into infinity.
  EXPECT_TRUE(is_bf16_nan(f32_to_bf16(std::numeric_limits<float>::signaling_NaN())));
  std::uint32_t low_payload_nan_bits = 0x7F800001;
  float low_payload_nan;
  std::memcpy(&low_payload_nan, &low_payload_nan_bits, sizeof low_payload_nan);
  EXPECT_TRUE(is_bf16_nan(f32_to_bf16(low_payload_nan)));
}

}  // namespace
}  // namespace braid::collectives
