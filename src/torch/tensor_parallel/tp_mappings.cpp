#include <torch/csrc/autograd/custom_function.h>
#include <torch/torch.h>

#include <braid/torch/tensor_parallel/tp_mappings.hpp>

#include "torch/tensor_collectives.hpp"

namespace braid::torch::tp {
namespace {

using collectives::Communicator;
using ::torch::Tensor;
using ::torch::autograd::AutogradContext;
using ::torch::autograd::variable_list;

// What a mapping does in one direction.
enum class Move {
  identity,
  all_reduce,
  slice_last,
  gather_last,
  slice_first,
  gather_first,
  reduce_scatter_first
};

Tensor apply_move(Move move, Communicator& comm, const Tensor& tensor, const char* operation) {
  switch (move) {
    case Move::identity:
      return tensor;
    case Move::all_reduce:
      return detail::reduce_over_ranks(comm, tensor);
    case Move::slice_last:
      return detail::slice_for_rank(comm, tensor, -1, operation).contiguous();
    case Move::gather_last:
      return detail::gather_last_dim(comm, tensor);
    case Move::slice_first:
      return detail::slice_for_rank(comm, tensor, 0, operation).contiguous();
    case Move::gather_first:
      return detail::gather_first_dim(comm, tensor);
    case Move::reduce_scatter_first:
      return detail::reduce_scatter_first_dim(comm, tensor);
  }
  return tensor;
}

// One autograd function for every mapping: `forward_move` in forward, `backward_move` on
// the gradient. The moves travel as integers (IValues) in the context.
struct Mapping : ::torch::autograd::Function<Mapping> {
  static Tensor forward(AutogradContext* ctx, const Tensor& input, std::int64_t forward_move,
                        std::int64_t backward_move, std::shared_ptr<Communicator> comm) {
    ctx->saved_data["backward_move"] = backward_move;
    detail::save_communicator(ctx, comm);
    return apply_move(static_cast<Move>(forward_move), *comm, input, "tp mapping forward");
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto move = static_cast<Move>(ctx->saved_data["backward_move"].toInt());
    auto comm = detail::saved_communicator(ctx);
    return {apply_move(move, *comm, grads[0], "tp mapping backward"), Tensor(), Tensor(), Tensor()};
  }
};

Tensor map(TensorParallelGroup tp, const Tensor& input, Move forward, Move backward) {
  return Mapping::apply(input, static_cast<std::int64_t>(forward),
                        static_cast<std::int64_t>(backward), std::move(tp));
}

}  // namespace

Tensor copy_to_region(TensorParallelGroup tp, const Tensor& input) {
  return map(std::move(tp), input, Move::identity, Move::all_reduce);
}

Tensor reduce_from_region(TensorParallelGroup tp, const Tensor& input) {
  return map(std::move(tp), input, Move::all_reduce, Move::identity);
}

Tensor scatter_to_region(TensorParallelGroup tp, const Tensor& input) {
  return map(std::move(tp), input, Move::slice_last, Move::gather_last);
}

Tensor gather_from_region(TensorParallelGroup tp, const Tensor& input) {
  return map(std::move(tp), input, Move::gather_last, Move::slice_last);
}

Tensor scatter_to_sequence_region(TensorParallelGroup tp, const Tensor& input) {
  return map(std::move(tp), input, Move::slice_first, Move::gather_first);
}

Tensor gather_from_sequence_region(TensorParallelGroup tp, const Tensor& input,
                                   bool grad_is_partial) {
  return map(std::move(tp), input, Move::gather_first,
             grad_is_partial ? Move::reduce_scatter_first : Move::slice_first);
}

Tensor reduce_scatter_to_sequence_region(TensorParallelGroup tp, const Tensor& input) {
  return map(std::move(tp), input, Move::reduce_scatter_first, Move::gather_first);
}

void all_reduce_replicated_gradients(TensorParallelGroup tp,
                                     const std::vector<Tensor>& parameters) {
  if (parameters.empty() || tp->size() == 1) return;
  std::vector<Tensor> grads;
  grads.reserve(parameters.size());
  for (const Tensor& p : parameters) {
    Tensor& grad = p.mutable_grad();
    if (!grad.defined()) grad = ::torch::zeros_like(p);
    grads.push_back(grad.reshape({-1}));
  }
  ::torch::NoGradGuard no_grad;
  const Tensor summed = detail::reduce_over_ranks(*tp, ::torch::cat(grads));
  std::int64_t offset = 0;
  for (const Tensor& p : parameters) {
    p.mutable_grad().copy_(summed.narrow(0, offset, p.numel()).view_as(p));
    offset += p.numel();
  }
}

}  // namespace braid::torch::tp
