#include "torch/tensor_collectives.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/torch.h>

#include <braid/core/error.hpp>
#include <braid/torch/tensor_buffer.hpp>

namespace braid::torch::detail {
namespace {

using collectives::Communicator;

[[noreturn]] void refuse(const Communicator& comm, std::string what, const char* operation) {
  throw Error(Errc::invalid_argument, std::move(what),
              {.rank = comm.world_rank(comm.rank()), .operation = operation});
}

// `tensor` as a contiguous tensor this module may write: a copy unless the caller's
// tensor is already one nobody else holds (autograd's gradients usually are).
::torch::Tensor owned_contiguous(const ::torch::Tensor& tensor) {
  return tensor.detach().contiguous().clone(::torch::MemoryFormat::Contiguous);
}

}  // namespace

void save_communicator(::torch::autograd::AutogradContext* ctx, std::shared_ptr<Communicator> comm,
                       const std::string& key) {
  ctx->saved_data[key] = c10::IValue::make_capsule(c10::make_intrusive<HeldCommunicator>(comm));
}

std::shared_ptr<Communicator> saved_communicator(::torch::autograd::AutogradContext* ctx,
                                                 const std::string& key) {
  return c10::static_intrusive_pointer_cast<HeldCommunicator>(ctx->saved_data[key].toCapsule())
      ->comm;
}

TensorCollective start_reduce_over_ranks(Communicator& comm, const ::torch::Tensor& tensor,
                                         ReduceOp op) {
  ::torch::Tensor result = owned_contiguous(tensor);
  if (comm.size() == 1) return TensorCollective(result);
  Future<void> done = comm.launch(comm.all_reduce(as_buffer(result), op));
  return TensorCollective(result, std::move(done));
}

::torch::Tensor reduce_over_ranks(Communicator& comm, const ::torch::Tensor& tensor, ReduceOp op) {
  return start_reduce_over_ranks(comm, tensor, op).result();
}

::torch::Tensor gather_first_dim(Communicator& comm, const ::torch::Tensor& tensor) {
  if (comm.size() == 1) return tensor.detach();
  const ::torch::Tensor input = tensor.detach().contiguous();
  std::vector<std::int64_t> shape = input.sizes().vec();
  if (shape.empty()) refuse(comm, "gathering a 0-dimensional tensor", "gather_first_dim");
  shape[0] *= comm.size();
  ::torch::Tensor output = ::torch::empty(shape, input.options());
  comm.launch(comm.all_gather(as_buffer(input), as_buffer(output))).get();
  return output;
}

TensorCollective start_reduce_scatter_first_dim(Communicator& comm, const ::torch::Tensor& tensor) {
  const ::torch::Tensor input = tensor.detach().contiguous();
  if (input.dim() == 0 || input.size(0) % comm.size() != 0) {
    refuse(comm,
           fmt::format("reduce-scatter along dimension 0 of a tensor of shape [{}] over {} ranks: "
                       "the first dimension must divide by the ranks",
                       fmt::join(input.sizes(), ", "), comm.size()),
           "reduce_scatter_first_dim");
  }
  if (comm.size() == 1) return TensorCollective(input.clone());
  std::vector<std::int64_t> shape = input.sizes().vec();
  shape[0] /= comm.size();
  ::torch::Tensor output = ::torch::empty(shape, input.options());
  Future<void> done =
      comm.launch(comm.reduce_scatter(as_buffer(input), as_buffer(output), ReduceOp::sum));
  return TensorCollective(output, std::move(done), input);
}

::torch::Tensor reduce_scatter_first_dim(Communicator& comm, const ::torch::Tensor& tensor) {
  return start_reduce_scatter_first_dim(comm, tensor).result();
}

::torch::Tensor gather_last_dim(Communicator& comm, const ::torch::Tensor& tensor) {
  if (comm.size() == 1) return tensor.detach();
  // Gathered along dimension 0 (contiguous chunks, one per rank), then the chunks laid
  // side by side along the last dimension: one copy beside the collective.
  const ::torch::Tensor stacked = gather_first_dim(comm, tensor.unsqueeze(0));
  return ::torch::cat(stacked.unbind(0), -1);
}

::torch::Tensor slice_for_rank(const Communicator& comm, const ::torch::Tensor& tensor,
                               std::int64_t dim, const char* operation) {
  const std::int64_t d = dim < 0 ? dim + tensor.dim() : dim;
  if (tensor.dim() == 0 || d < 0 || d >= tensor.dim() || tensor.size(d) % comm.size() != 0) {
    refuse(comm,
           fmt::format("splitting dimension {} of a tensor of shape [{}] over {} ranks: it must "
                       "exist and divide by the ranks",
                       dim, fmt::join(tensor.sizes(), ", "), comm.size()),
           operation);
  }
  const std::int64_t width = tensor.size(d) / comm.size();
  return tensor.narrow(d, width * comm.rank(), width);
}

}  // namespace braid::torch::detail
