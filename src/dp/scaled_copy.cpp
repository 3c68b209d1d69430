#include "dp/scaled_copy.hpp"

#include <cstring>

#include <fmt/format.h>

#include <braid/collectives/reduce_kernels.hpp>
#include <braid/core/error.hpp>

namespace braid::dp::detail {
namespace {

// dst may be src (scaling in place), never a partial overlap. Written in blocks of a
// constant trip count, with ivdep for the exact alias, because GCC 12 at -O2 vectorises
// nothing else (src/collectives/reduce_loops.hpp): the plain loop ran scalar, at about
// 4 GB/s.
template <class T>
void scale_loop(T* dst, const T* src, std::size_t count, T factor) {
  constexpr std::size_t kBlock = 64;
  std::size_t i = 0;
  for (; i + kBlock <= count; i += kBlock) {
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC ivdep
#endif
    for (std::size_t j = i; j < i + kBlock; ++j) dst[j] = src[j] * factor;
  }
  for (; i < count; ++i) dst[i] = src[i] * factor;
}

template <float (*ToFloat)(std::uint16_t), std::uint16_t (*FromFloat)(float)>
void scale_half(std::uint16_t* dst, const std::uint16_t* src, std::size_t count, float factor) {
  for (std::size_t i = 0; i < count; ++i) dst[i] = FromFloat(ToFloat(src[i]) * factor);
}

}  // namespace

void scaled_copy(const Buffer& dst, const Buffer& src, double factor) {
  if (dst.dtype() != src.dtype() || dst.count() != src.count()) {
    throw Error(Errc::invalid_argument,
                fmt::format("scaled copy of {} {} elements into {} {} elements", src.count(),
                            to_string(src.dtype()), dst.count(), to_string(dst.dtype())),
                {.operation = "dp::scaled_copy"});
  }
  const std::size_t n = src.count();
  if (n == 0) return;
  if (factor == 1.0 && dst.data() == src.data()) return;
  if (factor == 1.0) {
    std::memcpy(dst.data(), src.data(), src.size_bytes());
    return;
  }
  switch (src.dtype()) {
    case DType::f32:
      scale_loop(static_cast<float*>(dst.data()), static_cast<const float*>(src.data()), n,
                 static_cast<float>(factor));
      return;
    case DType::f64:
      scale_loop(static_cast<double*>(dst.data()), static_cast<const double*>(src.data()), n,
                 factor);
      return;
    case DType::f16:
      scale_half<collectives::f16_to_f32, collectives::f32_to_f16>(
          static_cast<std::uint16_t*>(dst.data()), static_cast<const std::uint16_t*>(src.data()), n,
          static_cast<float>(factor));
      return;
    case DType::bf16:
      scale_half<collectives::bf16_to_f32, collectives::f32_to_bf16>(
          static_cast<std::uint16_t*>(dst.data()), static_cast<const std::uint16_t*>(src.data()), n,
          static_cast<float>(factor));
      return;
    default:
      throw Error(Errc::invalid_argument,
                  fmt::format("gradients must be floating point; got {}", to_string(src.dtype())),
                  {.operation = "dp::scaled_copy"});
  }
}

void widen(const Buffer& data, std::span<float> out) {
  const std::size_t n = data.count();
  switch (data.dtype()) {
    case DType::f32:
      std::memcpy(out.data(), data.data(), n * sizeof(float));
      return;
    case DType::f64:
      for (std::size_t i = 0; i < n; ++i)
        out[i] = static_cast<float>(static_cast<const double*>(data.data())[i]);
      return;
    case DType::f16:
      for (std::size_t i = 0; i < n; ++i)
        out[i] = collectives::f16_to_f32(static_cast<const std::uint16_t*>(data.data())[i]);
      return;
    case DType::bf16:
      for (std::size_t i = 0; i < n; ++i)
        out[i] = collectives::bf16_to_f32(static_cast<const std::uint16_t*>(data.data())[i]);
      return;
    default:
      throw Error(Errc::invalid_argument, "gradients must be floating point",
                  {.operation = "dp::widen"});
  }
}

void zero(const Buffer& data) {
  if (data.count() != 0) std::memset(data.data(), 0, data.size_bytes());
}

}  // namespace braid::dp::detail
