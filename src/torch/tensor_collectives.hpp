// Collectives on libtorch tensors for the adapters (SyncBatchNorm, the tensor-parallel
// mappings and layers): each takes what autograd hands it, makes it contiguous where the
// collective needs that, and returns a new tensor, so the caller's tensors are never
// written. The blocking forms wait on the calling thread; the start_ forms return a
// Reduction to wait on later, so a backward can compute while its reduction runs.
//
// A communicator travels in the autograd graph as a HeldCommunicator capsule in the
// context's saved_data: the graph keeps it alive until backward has run, however long
// after the module that made the graph is gone.
#pragma once

#include <memory>
#include <string>
#include <utility>

#include <torch/csrc/autograd/custom_function.h>
#include <torch/types.h>

#include <braid/collectives/communicator.hpp>
#include <braid/core/future.hpp>
#include <braid/core/reduce_op.hpp>

namespace braid::torch::detail {

struct HeldCommunicator : ::torch::CustomClassHolder {
  explicit HeldCommunicator(std::shared_ptr<collectives::Communicator> c) : comm(std::move(c)) {}
  std::shared_ptr<collectives::Communicator> comm;
};

// Saves `comm` in `ctx` under `key`, and reads it back in backward.
void save_communicator(::torch::autograd::AutogradContext* ctx,
                       std::shared_ptr<collectives::Communicator> comm,
                       const std::string& key = "comm");
std::shared_ptr<collectives::Communicator> saved_communicator(
    ::torch::autograd::AutogradContext* ctx, const std::string& key = "comm");

// A collective started on tensors it owns; result() waits for it (if it had to run: an
// invalid `done` is a result already there) and returns the output. Dropped without
// result() (an exception between start and wait), it waits for the collective to end
// before its tensors go, since the transport writes into them until then.
class TensorCollective {
 public:
  TensorCollective(::torch::Tensor result, Future<void> done = {}, ::torch::Tensor input = {})
      : result_(std::move(result)), input_(std::move(input)), done_(std::move(done)) {}
  TensorCollective(TensorCollective&&) = default;
  TensorCollective& operator=(TensorCollective&&) = delete;
  ~TensorCollective() {
    if (done_.valid()) done_.wait();
  }
  // Whether result() would return without waiting.
  bool ready() const { return !done_.valid() || done_.ready(); }
  ::torch::Tensor result() {
    if (done_.valid()) std::exchange(done_, Future<void>()).get();
    return result_;
  }

 private:
  ::torch::Tensor result_;
  ::torch::Tensor input_;  // alive until the collective is done
  Future<void> done_;
};

// op over every rank's `tensor` (same shape everywhere).
::torch::Tensor reduce_over_ranks(collectives::Communicator& comm, const ::torch::Tensor& tensor,
                                  ReduceOp op = ReduceOp::sum);
TensorCollective start_reduce_over_ranks(collectives::Communicator& comm,
                                         const ::torch::Tensor& tensor,
                                         ReduceOp op = ReduceOp::sum);

// Every rank's `tensor` concatenated along dimension 0, in rank order.
::torch::Tensor gather_first_dim(collectives::Communicator& comm, const ::torch::Tensor& tensor);
// The sum over ranks of `tensor`, of which this rank keeps its slice along dimension 0
// (size(0) / ranks rows; a size(0) that does not divide is an Error naming both).
TensorCollective start_reduce_scatter_first_dim(collectives::Communicator& comm,
                                                const ::torch::Tensor& tensor);
::torch::Tensor reduce_scatter_first_dim(collectives::Communicator& comm,
                                         const ::torch::Tensor& tensor);
// Every rank's `tensor` concatenated along the last dimension, in rank order.
::torch::Tensor gather_last_dim(collectives::Communicator& comm, const ::torch::Tensor& tensor);

// This rank's slice of `tensor` along `dim` (size / ranks wide; an Error naming the size
// and the ranks where it does not divide). Local: nothing is communicated. A view.
::torch::Tensor slice_for_rank(const collectives::Communicator& comm, const ::torch::Tensor& tensor,
                               std::int64_t dim, const char* operation);

}  // namespace braid::torch::detail
