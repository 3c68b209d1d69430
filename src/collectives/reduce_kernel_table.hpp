// One instruction set's reduction kernels as a table of function pointers, one entry per
// (DType, ReduceOp), built from that set's kernel templates; reduce_kernels.cpp picks a
// table from CPUID at the first call. reduce_kernels_baseline.cpp and reduce_kernels_x86.cpp
// (AVX2, AVX-512) instantiate the loops of reduce_loops.hpp for their instruction sets and
// define their tables.
#pragma once

#include <array>
#include <cstddef>
#include <utility>

#include <braid/core/dtype.hpp>
#include <braid/core/reduce_op.hpp>

namespace braid::collectives::detail {

constexpr std::size_t kDTypeCount = static_cast<std::size_t>(DType::u8) + 1;
constexpr std::size_t kReduceOpCount = static_cast<std::size_t>(ReduceOp::prod) + 1;

using ReduceKernel = void (*)(void* dst, const void* a, const void* b, std::size_t count);
using DivideKernel = void (*)(void* data, std::size_t count, int divisor);
using ReduceAndDivideKernel = void (*)(void* dst, const void* a, const void* b, std::size_t count,
                                       int divisor);

struct KernelTable {
  std::array<std::array<ReduceKernel, kReduceOpCount>, kDTypeCount> reduce;  // [dtype][op]
  std::array<DivideKernel, kDTypeCount> divide;                              // [dtype]
  std::array<ReduceAndDivideKernel, kDTypeCount> reduce_and_divide;          // [dtype]
};

// avg reduces like sum; its division is divide()'s job.
constexpr ReduceOp reduced_as(ReduceOp op) {
  return op == ReduceOp::avg ? ReduceOp::sum : op;
}

// Kernels: a struct with templates reduce<DType, ReduceOp>, divide<DType> and
// reduce_and_divide<DType>, all compiled for one instruction set.
template <class Kernels, DType D, std::size_t... Ops>
constexpr std::array<ReduceKernel, kReduceOpCount> reduce_row(std::index_sequence<Ops...>) {
  return {&Kernels::template reduce<D, reduced_as(static_cast<ReduceOp>(Ops))>...};
}

template <class Kernels, std::size_t... DTypes>
constexpr KernelTable make_table(std::index_sequence<DTypes...>) {
  return {
      .reduce = {reduce_row<Kernels, static_cast<DType>(DTypes)>(
          std::make_index_sequence<kReduceOpCount>{})...},
      .divide = {&Kernels::template divide<static_cast<DType>(DTypes)>...},
      .reduce_and_divide = {&Kernels::template reduce_and_divide<static_cast<DType>(DTypes)>...},
  };
}

const KernelTable& baseline_kernels();
#if defined(__x86_64__)
const KernelTable& avx2_kernels();
const KernelTable& avx512_kernels();
#endif

}  // namespace braid::collectives::detail
