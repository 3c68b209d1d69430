// The reduction kernels for the x86-64 baseline (SSE2), and for every other architecture:
// reduce_loops.hpp compiled without a target attribute, f16 converted one element at a time.
#include "collectives/reduce_kernel_table.hpp"
#include "collectives/reduce_loops.hpp"

namespace braid::collectives::detail {
namespace {

using reduce_loops::divide_any;
using reduce_loops::reduce_and_divide_any;
using reduce_loops::reduce_any;
using reduce_loops::ScalarF16Codec;

struct BaselineKernels {
  template <DType D, ReduceOp Op>
  static void reduce(void* dst, const void* a, const void* b, std::size_t count) {
    reduce_any<ScalarF16Codec, D, Op>(dst, a, b, count);
  }
  template <DType D>
  static void divide(void* data, std::size_t count, int divisor) {
    divide_any<ScalarF16Codec, D>(data, count, divisor);
  }
  template <DType D>
  static void reduce_and_divide(void* dst, const void* a, const void* b, std::size_t count,
                                int divisor) {
    reduce_and_divide_any<ScalarF16Codec, D>(dst, a, b, count, divisor);
  }
};

constexpr KernelTable kBaselineTable =
    make_table<BaselineKernels>(std::make_index_sequence<kDTypeCount>{});

}  // namespace

const KernelTable& baseline_kernels() {
  return kBaselineTable;
}

}  // namespace braid::collectives::detail
