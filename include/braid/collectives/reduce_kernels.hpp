// Element-wise reduction kernels: the inner loop of every reducing collective (all-reduce,
// reduce-scatter, reduce), run once per step on each chunk that arrives.
//
// They are memory-bound: reducing n elements reads 2n and writes n, so the goal is to run at
// memory bandwidth, and on large buffers they do. The library is built for any x86-64, so each
// kernel is compiled three times (x86-64 baseline, AVX2+F16C+FMA, AVX-512F/BW/DQ/VL) and the
// best version the CPU supports is picked once, at the first call. The loops are plain C++ that
// GCC 12 vectorises at -O2. f16 and bf16 are reduced through f32 in blocks that stay in L1:
// f16 converts with F16C where the CPU has it (each element one at a time otherwise), bf16
// with integer shifts that vectorise everywhere. Other architectures get the baseline version.
//
// Measured (tests/collectives/reduce_kernels_bench, 4 MiB per operand, sum, GB/s counted as
// the bytes of dst + a + b; memcpy counts its source + destination), on the 2-core AVX-512 VM:
//   FIGURES
//
// Deterministic: the result depends only on the inputs, never on the CPU's version of the
// kernel or on alignment (f16/bf16 round once, to nearest even, after each f32 operation).
#pragma once

#include <braid/core/dtype.hpp>
#include <braid/core/reduce_op.hpp>

#include <cstddef>
#include <cstdint>

namespace braid::collectives {

// dst[i] = a[i] op b[i] for i < count. dst may be the same pointer as a or b (reducing in
// place), but must not partially overlap either. ReduceOp::avg reduces like sum here: the
// division happens once, at the end (see divide()).
//
// Integers: sum and prod wrap around (two's complement), min and max are the usual ones.
// Floats: min and max propagate NaN (if either input is NaN the result is NaN, like
// torch.minimum / torch.maximum); sum and prod follow IEEE 754.
//
// Throws InvariantError for a DType or ReduceOp outside its enumeration, or a partial overlap.
void reduce(void* dst, const void* a, const void* b, std::size_t count, DType dtype,
            ReduceOp op);

// data[i] = data[i] / divisor: how avg finishes. Floats divide in their own precision (f16
// and bf16 through f32, then rounded to nearest even); integers divide truncating toward
// zero, as C++ does (-7 / 2 == -3). divisor is a rank count: it must be positive, which
// InvariantError enforces.
void divide(void* data, std::size_t count, DType dtype, int divisor);

// Scalar conversions between float and IEEE binary16 (f16) or bfloat16 (bf16) bit patterns,
// exactly as the vector kernels convert: round to nearest even, overflow to infinity,
// subnormals kept, NaN stays NaN (made quiet, sign and top payload bits kept, as F16C does).
float f16_to_f32(std::uint16_t bits) noexcept;
std::uint16_t f32_to_f16(float value) noexcept;
float bf16_to_f32(std::uint16_t bits) noexcept;
std::uint16_t f32_to_bf16(float value) noexcept;

}  // namespace braid::collectives
