// Which gradients travel together. Parameters go into buckets in the order their
// gradients are expected to be ready (reverse declaration order at first, since backward
// runs from the last layer to the first; then the order actually seen in the first
// iteration), one bucket per (dtype, memory, device) at a time, closed once it holds at
// least its limit: `first_bucket_bytes` for the first bucket of each kind (so the first
// all-reduce starts early in backward), `bucket_cap_bytes` after. A parameter is never
// split, so a bucket may pass its limit by one parameter's size. Buckets are numbered by
// when their first parameter is expected, which is the order they launch in on every rank.
//
// Why these sizes (PyTorch DDP's): a 25 MiB bucket is long enough that the per-collective
// latency is noise against its transfer, and short enough that the last bucket -- the
// communication nothing can hide -- stays small.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include <braid/core/buffer.hpp>
#include <braid/core/dtype.hpp>

namespace braid::dp {

// What the reducer knows of a parameter: enough to place its gradient in a bucket.
struct ParameterSpec {
  std::string name;  // for messages ("layers.2.weight")
  std::size_t count = 0;
  DType dtype = DType::f32;
  MemoryKind memory = MemoryKind::host;
  int device = 0;
  // The tensor's shape, outermost first (empty: treat as a vector). Comm hooks that
  // factor matrices (PowerSGD) read it; bucketing does not.
  std::vector<std::int64_t> shape;
  friend bool operator==(const ParameterSpec&, const ParameterSpec&) = default;
};

struct BucketLimits {
  std::size_t first_bucket_bytes = std::size_t{1} << 20;
  std::size_t bucket_cap_bytes = std::size_t{25} << 20;
};

struct BucketLayout {
  std::vector<std::size_t> parameters;  // indices into the spec list, in placement order
  std::vector<std::size_t> offsets;     // element offset of each parameter in the bucket
  std::size_t count = 0;                // elements in all
  DType dtype = DType::f32;
  MemoryKind memory = MemoryKind::host;
  int device = 0;
};

// The buckets for `parameters` filled in `ready_order` (a permutation of their indices).
// Throws braid::Error(Errc::invalid_argument) when ready_order is not a permutation or a
// limit is zero.
std::vector<BucketLayout> plan_buckets(std::span<const ParameterSpec> parameters,
                                       std::span<const std::size_t> ready_order,
                                       BucketLimits limits);

// n-1, n-2, ..., 0: the order backward usually produces gradients in.
std::vector<std::size_t> reverse_order(std::size_t n);

}  // namespace braid::dp
