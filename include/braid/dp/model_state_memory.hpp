// How many bytes of model state (parameters, gradients, optimizer state) one data-parallel
// rank holds under each sharding strategy: the ZeRO paper's formulas (Rajbhandari et al.,
// "ZeRO: Memory Optimizations Toward Training Trillion Parameter Models", section 5),
// generalised from mixed precision's 2-byte parameters and gradients to any element sizes.
// Pure arithmetic, for the tools to print before training and set beside what they measure.
//
// With Ψ parameters, N_d ranks, p and g bytes per parameter and gradient element and K bytes
// of optimizer state per parameter, one rank holds:
//
//   strategy                          parameters   gradients    optimizer state
//   replicated (DDP, FSDP NO_SHARD)   pΨ           gΨ           KΨ
//   optimizer  (ZeRO-1)               pΨ           gΨ           KΨ/N_d
//   gradients  (ZeRO-2, SHARD_GRAD_OP) pΨ          gΨ/N_d       KΨ/N_d
//   parameters (ZeRO-3, FULL_SHARD)   pΨ/N_d       gΨ/N_d       KΨ/N_d
//
// In mixed precision (p = g = 2, K = 12: an f32 master copy and Adam's two f32 moments) these
// are the paper's (2+2+K)Ψ, (2+2)Ψ + KΨ/N_d, 2Ψ + (2+K)Ψ/N_d and (2+2+K)Ψ/N_d. Ψ/N_d is
// rounded up to whole elements (a rank's shard, padded); per-unit padding (under N_d elements
// a unit) is left out.
//
// What the formulas leave out, the transient: where gradients are sharded, a unit's whole
// gradients live until their reduce-scatter (g x the largest unit); where parameters are
// sharded too, a unit's whole parameters while it runs (p x the largest unit) as well. The
// largest unit is an input (0 where the model is not cut into units), as are activations'
// bytes, which are not model state and are not counted at all.
#pragma once

#include <cstdint>

namespace braid::dp {

// What the ranks shard, each strategy sharding what the one before does and one thing more.
enum class ShardedState {
  none,        // DDP, FSDP NO_SHARD: every rank holds the whole model state
  optimizer,   // ZeRO-1: optimizer state
  gradients,   // ZeRO-2, FSDP SHARD_GRAD_OP: optimizer state and gradients
  parameters,  // ZeRO-3, FSDP FULL_SHARD: optimizer state, gradients and parameters
};

// K, optimizer state bytes per parameter, of the common optimizers.
inline constexpr int kPlainSgdStateBytes = 0;        // no state
inline constexpr int kSgdMomentumStateBytes = 4;     // an f32 momentum buffer
inline constexpr int kAdamStateBytes = 8;            // two f32 moments
inline constexpr int kMixedPrecisionAdamBytes = 12;  // f32 master copy and two f32 moments

struct ModelStateShape {
  std::int64_t parameters = 0;                  // Ψ, elements
  int ranks = 1;                                // N_d
  int parameter_bytes = 4;                      // p: per parameter element as the ranks hold it
  int gradient_bytes = 4;                       // g
  int optimizer_state_bytes = kAdamStateBytes;  // K: per parameter
  std::int64_t largest_unit = 0;  // elements of the largest unit gathered at once (0: none)
};

// Bytes one rank holds.
struct ModelStateMemory {
  std::int64_t parameters = 0;
  std::int64_t gradients = 0;
  std::int64_t optimizer_state = 0;
  std::int64_t transient = 0;  // a unit's whole gradients, and parameters, while it runs

  // The formula's figure: what a rank holds throughout.
  std::int64_t total() const noexcept { return parameters + gradients + optimizer_state; }
  // With the transient on top: the model state's peak.
  std::int64_t peak() const noexcept { return total() + transient; }
};

// The bytes for `shape` under `sharded`. Throws braid::Error(Errc::invalid_argument) for a
// negative count or size, fewer than one rank, or a largest unit of more than Ψ elements.
ModelStateMemory estimate_model_state_memory(const ModelStateShape& shape, ShardedState sharded);

}  // namespace braid::dp
