// Element-wise reduction kernels: the inner loop of every reducing collective (all-reduce,
// reduce-scatter, reduce), run once per step on each chunk that arrives.
//
// They are memory-bound: reducing n elements reads 2n and writes n, so the goal is to run at
// memory bandwidth, which they do. The library is built for any x86-64, so each kernel is
// compiled three times (x86-64 baseline, AVX2+F16C, AVX-512F/BW/DQ/VL) from the same plain
// C++ loops, which GCC 12 vectorises at -O2, and the best version the CPU supports is picked
// at the first call. f16 converts with F16C, a block at a time through an f32 buffer in L1;
// bf16 converts in the loop itself with integer shifts, which vectorise everywhere. Other
// architectures get the baseline version.
//
// Measured with tests/collectives/reduce_kernels_bench: sum, 4 MiB per operand, GB/s counting
// the bytes of dst + a + b, best of 15 rounds, on the 2-core AVX-512 development VM (whose
// 300 MiB L3 holds the operands; runs vary by about 10%):
//
//   dtype   dst = a + b   a += b (in place)
//   f32        24.4          36.3
//   f64        24.5          35.2
//   f16        22.3          29.3
//   bf16       22.6          27.9
//   i32        24.0          35.6
//   i64        23.5          33.9
//   u8         23.4          31.2
//   memcpy     22-25 (source + destination), for comparison
//
// So every dtype runs at memcpy speed; in place is faster because dst is already in cache
// (no read-for-ownership). On a CPU with AVX2 but no AVX-512, f16 and bf16 drop to about
// 15 GB/s here, f32 stays at memcpy speed; without AVX2, f16 converts one element at a time
// (about 1 GB/s) and bf16 runs at about 8 GB/s.
//
// Deterministic: the result depends only on the inputs, never on which version of a kernel
// runs or on alignment (except which payload a NaN result carries). f16 and bf16 are computed
// in f32 and rounded once, to nearest even, which gives the correctly rounded f16/bf16 result
// for sum, prod and divide.
#pragma once

#include <cstddef>
#include <cstdint>

#include <braid/core/dtype.hpp>
#include <braid/core/reduce_op.hpp>

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
void reduce(void* dst, const void* a, const void* b, std::size_t count, DType dtype, ReduceOp op);

// data[i] = data[i] / divisor: how avg finishes. Floats divide in their own precision (f16
// and bf16 through f32, then rounded to nearest even); integers divide truncating toward
// zero, as C++ does (-7 / 2 == -3). divisor is a rank count: it must be positive, which
// InvariantError enforces.
void divide(void* data, std::size_t count, DType dtype, int divisor);

// dst[i] = (a[i] + b[i]) / divisor: the last step of an avg, bit for bit what reduce() with
// ReduceOp::sum and then divide() give, in one pass over memory instead of two (f32, f64
// and bf16 fuse the two; f16 and integers run them one after the other). The same aliasing
// rules as reduce(); divisor as for divide().
void reduce_and_divide(void* dst, const void* a, const void* b, std::size_t count, DType dtype,
                       int divisor);

// Scalar conversions between float and IEEE binary16 (f16) or bfloat16 (bf16) bit patterns,
// bit for bit as the vector kernels convert. To f16/bf16: round to nearest even, overflow to
// infinity, subnormals kept, NaN stays NaN (made quiet, sign and top payload bits kept, as
// F16C does). To float: exact; an f16 NaN is made quiet, a bf16 NaN keeps its bits.
float f16_to_f32(std::uint16_t bits) noexcept;
std::uint16_t f32_to_f16(float value) noexcept;
float bf16_to_f32(std::uint16_t bits) noexcept;
std::uint16_t f32_to_bf16(float value) noexcept;

}  // namespace braid::collectives
