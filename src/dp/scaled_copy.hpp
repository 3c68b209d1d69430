// dst = src * factor, element-wise, for the floating dtypes gradients come in: the copy
// of a gradient into its bucket with the 1/W (or batch-share) scaling fused in, one pass
// over memory instead of a copy and a scale. f32 and f64 loops vectorise; f16 and bf16
// go through f32 per element. factor == 1 is a plain copy.
#pragma once

#include <span>

#include <braid/core/buffer.hpp>

namespace braid::dp::detail {

// Throws Error(invalid_argument) for integer dtypes or counts that differ.
void scaled_copy(const Buffer& dst, const Buffer& src, double factor);

// `data` as f32 values into `out` (out.size() == data.count()).
void widen(const Buffer& data, std::span<float> out);

// Sets every element of `data` to zero.
void zero(const Buffer& data);

}  // namespace braid::dp::detail
