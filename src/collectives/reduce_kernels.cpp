// The reduction kernels' entry points (<braid/collectives/reduce_kernels.hpp>): operand
// checks, and the instruction set's kernel table (reduce_kernel_table.hpp) chosen at the first
// call from CPUID; after that a call costs an indirect call and a few range checks. The
// loops themselves are in reduce_loops.hpp, compiled once per instruction set.
#include <cstdint>
#include <string_view>

#include <braid/collectives/reduce_kernels.hpp>
#include <braid/core/enforce.hpp>

#if defined(__x86_64__)
#include <cpuid.h>
#endif

#include "collectives/reduce_kernel_table.hpp"
#include "collectives/reduce_loops.hpp"

namespace braid::collectives {
namespace {

using detail::kDTypeCount;
using detail::KernelTable;
using detail::kReduceOpCount;

#if defined(__x86_64__)
// F16C is read from CPUID directly: not every compiler's __builtin_cpu_supports knows it
// (clang 14 does not). Its instructions use the AVX state, whose OS support the avx2 check
// below already covers.
bool cpu_has_f16c() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  return __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && (ecx & bit_F16C) != 0;
}
#endif

const KernelTable& table_for_this_cpu() {
#if defined(__x86_64__)
  // Called before main (from a static initialiser) the CPU model may not be read yet.
  __builtin_cpu_init();
  const bool avx2 = __builtin_cpu_supports("avx2") && cpu_has_f16c();
  if (avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl")) {
    return detail::avx512_kernels();
  }
  if (avx2) return detail::avx2_kernels();
#endif
  return detail::baseline_kernels();
}

const KernelTable& kernels() {
  static const KernelTable& table = table_for_this_cpu();
  return table;
}

// Exact aliasing is allowed (reduce in place); any other overlap would read elements after
// they were overwritten. Compared as integers: relational operators on pointers into
// different objects are unspecified.
bool partially_overlaps(const void* x, const void* y, std::size_t bytes) {
  const auto first = reinterpret_cast<std::uintptr_t>(x);
  const auto second = reinterpret_cast<std::uintptr_t>(y);
  return first != second && first < second + bytes && second < first + bytes;
}

// reduce()'s and reduce_and_divide()'s operands: a known dtype (its table index), and dst
// exactly a, exactly b, or apart from both.
std::size_t checked_operands(std::string_view what, const void* dst, const void* a, const void* b,
                             std::size_t count, DType dtype) {
  const auto dtype_index = static_cast<std::size_t>(dtype);
  BRAID_ENFORCE(dtype_index < kDTypeCount, "{}: unknown DType {}", what, dtype_index);
  const std::size_t bytes = count * dtype_size(dtype);
  BRAID_ENFORCE(!partially_overlaps(dst, a, bytes) && !partially_overlaps(dst, b, bytes),
                "{}: dst must be a, b, or disjoint from both", what);
  return dtype_index;
}

}  // namespace

void reduce(void* dst, const void* a, const void* b, std::size_t count, DType dtype, ReduceOp op) {
  const auto op_index = static_cast<std::size_t>(op);
  BRAID_ENFORCE(op_index < kReduceOpCount, "reduce: unknown ReduceOp {}", op_index);
  const std::size_t dtype_index = checked_operands("reduce", dst, a, b, count, dtype);
  if (count == 0) return;
  kernels().reduce[dtype_index][op_index](dst, a, b, count);
}

void divide(void* data, std::size_t count, DType dtype, int divisor) {
  const auto dtype_index = static_cast<std::size_t>(dtype);
  BRAID_ENFORCE(dtype_index < kDTypeCount, "divide: unknown DType {}", dtype_index);
  BRAID_ENFORCE(divisor > 0, "divide: divisor must be positive, got {}", divisor);
  if (count == 0) return;
  kernels().divide[dtype_index](data, count, divisor);
}

void reduce_and_divide(void* dst, const void* a, const void* b, std::size_t count, DType dtype,
                       int divisor) {
  const std::size_t dtype_index = checked_operands("reduce_and_divide", dst, a, b, count, dtype);
  BRAID_ENFORCE(divisor > 0, "reduce_and_divide: divisor must be positive, got {}", divisor);
  if (count == 0) return;
  kernels().reduce_and_divide[dtype_index](dst, a, b, count, divisor);
}

float f16_to_f32(std::uint16_t bits) noexcept {
  return reduce_loops::half_to_float(bits);
}
std::uint16_t f32_to_f16(float value) noexcept {
  return reduce_loops::float_to_half(value);
}
float bf16_to_f32(std::uint16_t bits) noexcept {
  return reduce_loops::bfloat_to_float(bits);
}
std::uint16_t f32_to_bf16(float value) noexcept {
  return reduce_loops::float_to_bfloat(value);
}

}  // namespace braid::collectives
