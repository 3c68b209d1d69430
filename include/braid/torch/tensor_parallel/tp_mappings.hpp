// The conjugate mappings of tensor parallelism (Megatron-Core's tensor_parallel/mappings.py),
// as libtorch autograd functions whose collectives are braid's. Each is its partner's
// transpose: what one does in forward, the other does in backward.
//
//   auto x = braid::torch::tp::copy_to_region(tp, input);     // identity; grad all-reduced
//   auto y = braid::torch::tp::reduce_from_region(tp, part);  // all-reduced; grad identity
//
// "Region" is the tensor-parallel group `tp`: every rank of it calls each mapping, in the
// same order, with tensors of the same shape (a collective, in forward and in backward).
// The sequence-parallel mappings cut dimension 0, the sequence: braid's TP layers take
// activations sequence-first, [s, b, h], as Megatron-Core's do, so a slice of the
// sequence is a contiguous block and the all-gather and reduce-scatter move it without a
// copy. The last-dimension mappings cut the hidden (or vocabulary) dimension and cost one
// copy beside the collective to lay the ranks' pieces side by side.
//
// Costs, for a tensor of B bytes over t ranks (docs/algorithms.md gives each collective's):
//   copy_to_region              forward nothing;        backward all-reduce of B
//   reduce_from_region          forward all-reduce of B; backward nothing
//   scatter_to_region           forward a view;         backward all-gather to t*B, a copy
//   gather_from_region          forward all-gather to t*B, a copy; backward a view
//   scatter_to_sequence_region  forward a view;         backward all-gather to t*B
//   gather_from_sequence_region forward all-gather to t*B; backward reduce-scatter of t*B
//                               (or a view, with grad_is_partial = false)
//   reduce_scatter_to_sequence_region forward reduce-scatter of B; backward all-gather
// Each collective is a comm span on the communicator's track (tracing on).
//
// Errors: a dimension that does not divide by the ranks is Error(invalid_argument) naming
// the shape and the ranks, on the rank that called; ranks whose shapes disagree fail in
// the collective (Errc::size_mismatch), or with BRAID_DEBUG=detail before data moves
// (Errc::desync). A peer that dies fails the collective naming it (Errc::peer_failed),
// in forward or in backward. CPU tensors (CUDA tensors go through the communicator's
// staging, or its NCCL route where one is set).
#pragma once

#include <memory>

#include <torch/types.h>

#include <braid/collectives/communicator.hpp>

namespace braid::torch::tp {

using TensorParallelGroup = std::shared_ptr<collectives::Communicator>;

// Forward: the input. Backward: the sum over ranks of the gradient (the input was used
// by every rank, each with its shard of the weights).
::torch::Tensor copy_to_region(TensorParallelGroup tp, const ::torch::Tensor& input);
// Forward: the sum over ranks. Backward: the gradient, unchanged, to every rank.
::torch::Tensor reduce_from_region(TensorParallelGroup tp, const ::torch::Tensor& input);
// Forward: this rank's slice of the last dimension. Backward: the ranks' gradients side by
// side along the last dimension.
::torch::Tensor scatter_to_region(TensorParallelGroup tp, const ::torch::Tensor& input);
// Forward: the ranks' inputs side by side along the last dimension. Backward: this rank's
// slice of the gradient.
::torch::Tensor gather_from_region(TensorParallelGroup tp, const ::torch::Tensor& input);
// Forward: this rank's slice of the sequence (dimension 0). Backward: the ranks' gradients
// concatenated along the sequence.
::torch::Tensor scatter_to_sequence_region(TensorParallelGroup tp, const ::torch::Tensor& input);
// Forward: the ranks' sequence slices concatenated. Backward: with grad_is_partial (the
// layer after is tensor-parallel, so each rank's gradient is a partial sum), the sum over
// ranks of the gradient, of which this rank keeps its slice (reduce-scatter); without,
// this rank's slice of the gradient.
::torch::Tensor gather_from_sequence_region(TensorParallelGroup tp, const ::torch::Tensor& input,
                                            bool grad_is_partial = true);
// Forward: the sum over ranks, of which this rank keeps its slice of the sequence
// (reduce-scatter). Backward: the ranks' gradients concatenated along the sequence.
::torch::Tensor reduce_scatter_to_sequence_region(TensorParallelGroup tp,
                                                  const ::torch::Tensor& input);

// Sums each parameter's gradient over the ranks of `tp`, in one all-reduce of them all
// (flattened, one copy in and out). For parameters every TP rank holds whole but whose
// gradients each rank computes from its part of the data: LayerNorm and the row-parallel
// bias under sequence parallelism. Call it once per step, after the last backward and
// before the optimizer (with gradient accumulation, after the last microbatch). Parameters
// without a gradient count as zero. A collective.
void all_reduce_replicated_gradients(TensorParallelGroup tp,
                                     const std::vector<::torch::Tensor>& parameters);

}  // namespace braid::torch::tp
