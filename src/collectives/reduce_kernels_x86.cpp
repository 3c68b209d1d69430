// The reduction kernels for x86-64 CPUs with AVX2 and F16C, and with AVX-512 (F, BW, DQ,
// VL): reduce_loops.hpp compiled inside functions marked with those targets, into which its
// always_inline helpers are inlined, and the F16C codecs through which f16 is reduced in
// f32. Both sets are in one file: the AVX-512 codec finishes its blocks with the AVX2 one,
// and GCC 12 inlines the codecs into the kernels only with both sets in one unit (compiled
// apart, the AVX-512 f16 kernels called narrow() out of line and ran about 5% slower in
// reduce_kernels_bench).
#include <cstddef>
#include <cstdint>

#include "collectives/reduce_kernel_table.hpp"
#include "collectives/reduce_loops.hpp"

#if defined(__x86_64__)
#include <immintrin.h>

namespace braid::collectives::detail {
namespace {

using reduce_loops::divide_any;
using reduce_loops::float_to_half;
using reduce_loops::half_to_float;
using reduce_loops::reduce_and_divide_any;
using reduce_loops::reduce_any;

// Not always_inline: the helpers between a kernel and its codec carry no target attribute,
// and GCC refuses to force a target function into them. Once those helpers are inlined into
// the kernel, the codec may be inlined too; if not, it is one call per block.
#define BRAID_TARGET_AVX2 [[gnu::target("avx2,f16c")]]
#define BRAID_TARGET_AVX512 [[gnu::target("avx512f,avx512bw,avx512dq,avx512vl,avx2,f16c")]]

struct Avx2F16Codec {
  BRAID_TARGET_AVX2 static void widen(float* dst, const std::uint16_t* src, std::size_t count) {
    std::size_t i = 0;
    for (; i + 8 <= count; i += 8) {
      const __m128i half = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
      _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(half));
    }
    for (; i < count; ++i) dst[i] = half_to_float(src[i]);
  }
  BRAID_TARGET_AVX2 static void narrow(std::uint16_t* dst, const float* src, std::size_t count) {
    std::size_t i = 0;
    for (; i + 8 <= count; i += 8) {
      const __m128i half = _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), half);
    }
    for (; i < count; ++i) dst[i] = float_to_half(src[i]);
  }
};

struct Avx512F16Codec {
  // The masked forms with every lane on: GCC 12's unmasked _mm512_cvtph_ps/_mm512_cvtps_ph
  // start from _mm512_undefined_*, which trips -Wmaybe-uninitialized (GCC bug 105593).
  static constexpr __mmask16 kAllLanes = 0xFFFF;
  BRAID_TARGET_AVX512 static void widen(float* dst, const std::uint16_t* src, std::size_t count) {
    std::size_t i = 0;
    for (; i + 16 <= count; i += 16) {
      const __m256i half = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i));
      _mm512_storeu_ps(dst + i, _mm512_maskz_cvtph_ps(kAllLanes, half));
    }
    Avx2F16Codec::widen(dst + i, src + i, count - i);
  }
  BRAID_TARGET_AVX512 static void narrow(std::uint16_t* dst, const float* src, std::size_t count) {
    std::size_t i = 0;
    for (; i + 16 <= count; i += 16) {
      const __m256i half =
          _mm512_maskz_cvtps_ph(kAllLanes, _mm512_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), half);
    }
    Avx2F16Codec::narrow(dst + i, src + i, count - i);
  }
};

struct Avx2Kernels {
  template <DType D, ReduceOp Op>
  BRAID_TARGET_AVX2 static void reduce(void* dst, const void* a, const void* b, std::size_t count) {
    reduce_any<Avx2F16Codec, D, Op>(dst, a, b, count);
  }
  template <DType D>
  BRAID_TARGET_AVX2 static void divide(void* data, std::size_t count, int divisor) {
    divide_any<Avx2F16Codec, D>(data, count, divisor);
  }
  template <DType D>
  BRAID_TARGET_AVX2 static void reduce_and_divide(void* dst, const void* a, const void* b,
                                                  std::size_t count, int divisor) {
    reduce_and_divide_any<Avx2F16Codec, D>(dst, a, b, count, divisor);
  }
};

constexpr KernelTable kAvx2Table = make_table<Avx2Kernels>(std::make_index_sequence<kDTypeCount>{});

struct Avx512Kernels {
  template <DType D, ReduceOp Op>
  BRAID_TARGET_AVX512 static void reduce(void* dst, const void* a, const void* b,
                                         std::size_t count) {
    reduce_any<Avx512F16Codec, D, Op>(dst, a, b, count);
  }
  template <DType D>
  BRAID_TARGET_AVX512 static void divide(void* data, std::size_t count, int divisor) {
    divide_any<Avx512F16Codec, D>(data, count, divisor);
  }
  template <DType D>
  BRAID_TARGET_AVX512 static void reduce_and_divide(void* dst, const void* a, const void* b,
                                                    std::size_t count, int divisor) {
    reduce_and_divide_any<Avx512F16Codec, D>(dst, a, b, count, divisor);
  }
};

constexpr KernelTable kAvx512Table =
    make_table<Avx512Kernels>(std::make_index_sequence<kDTypeCount>{});

}  // namespace

const KernelTable& avx2_kernels() {
  return kAvx2Table;
}
const KernelTable& avx512_kernels() {
  return kAvx512Table;
}

}  // namespace braid::collectives::detail
#endif
