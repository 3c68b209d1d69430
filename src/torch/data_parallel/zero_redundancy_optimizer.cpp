#include <algorithm>

#include <fmt/format.h>
#include <torch/torch.h>

#include <braid/core/error.hpp>
#include <braid/torch/data_parallel/zero_redundancy_optimizer.hpp>
#include <braid/torch/tensor_buffer.hpp>

namespace braid::torch {
namespace {

using ::torch::Tensor;

[[noreturn]] void refuse(const collectives::Communicator& comm, std::string what) {
  throw Error(Errc::invalid_argument, std::move(what),
              {.rank = comm.world_rank(comm.rank()), .operation = "ZeroRedundancyOptimizer"});
}

}  // namespace

ZeroRedundancyOptimizer::ZeroRedundancyOptimizer(std::vector<Tensor> parameters,
                                                 std::shared_ptr<collectives::Communicator> comm,
                                                 OptimizerFactory make)
    : parameters_(std::move(parameters)), comm_(std::move(comm)) {
  if (parameters_.empty()) refuse(*comm_, "no parameters to optimize");
  const auto dtype = parameters_.front().scalar_type();
  for (std::size_t i = 0; i < parameters_.size(); ++i) {
    const Tensor& p = parameters_[i];
    if (!p.is_contiguous() || !p.device().is_cpu() || !p.is_floating_point() ||
        p.scalar_type() != dtype) {
      refuse(*comm_, fmt::format("parameter {} must be a contiguous CPU floating tensor of the "
                                 "first parameter's dtype {} (it is {} on {})",
                                 i, c10::toString(dtype), c10::toString(p.scalar_type()),
                                 p.device().str()));
    }
    total_ += p.numel();
  }
  // Every rank's model the same: count, elements and dtype, against the maximum and the
  // minimum over the ranks.
  std::vector<std::int64_t> said{static_cast<std::int64_t>(parameters_.size()), total_,
                                 static_cast<std::int64_t>(dtype)};
  std::vector<std::int64_t> low = said, high = said;
  comm_->launch(comm_->all_reduce(Buffer(low), ReduceOp::min)).get();
  comm_->launch(comm_->all_reduce(Buffer(high), ReduceOp::max)).get();
  if (low != high) {
    refuse(*comm_, fmt::format("the ranks' models differ: this rank has {} parameters of {} "
                               "elements; across the ranks, {}-{} parameters of {}-{} elements",
                               said[0], said[1], low[0], high[0], low[1], high[1]));
  }
  const int ranks = comm_->size();
  slice_size_ = (total_ + ranks - 1) / ranks;
  slice_begin_ = slice_size_ * comm_->rank();
  // Where each parameter's elements fall in this rank's slice.
  std::int64_t offset = 0;
  for (std::size_t i = 0; i < parameters_.size(); ++i) {
    const std::int64_t begin = std::max(offset, slice_begin_);
    const std::int64_t end = std::min(offset + parameters_[i].numel(), slice_begin_ + slice_size_);
    if (begin < end) {
      pieces_.push_back({.parameter = i,
                         .parameter_offset = begin - offset,
                         .slice_offset = begin - slice_begin_,
                         .size = end - begin});
    }
    offset += parameters_[i].numel();
  }
  // The slice is empty (shape [0], no gradient) outside step(), which fills it from the
  // parameters: the optimizer keys its state by the tensor, which stays, and its state is
  // made at the first step, at the slice's size.
  slice_ = ::torch::empty({0}, parameters_.front().options().requires_grad(false));
  slice_.set_requires_grad(true);
  optimizer_ = make({slice_});
}

void ZeroRedundancyOptimizer::zero_grad() {
  for (Tensor& p : parameters_) {
    if (p.grad().defined()) p.mutable_grad().zero_();
  }
}

void ZeroRedundancyOptimizer::step() {
  ::torch::NoGradGuard no_grad;
  // The slice from the parameters as they are now (weights loaded since the last step
  // count), then its gradient.
  const auto options = slice_.options().requires_grad(false);
  slice_.set_data(::torch::empty({slice_size_}, options));
  slice_.mutable_grad() = ::torch::zeros({slice_size_}, options);
  for (const Piece& piece : pieces_) {
    slice_.narrow(0, piece.slice_offset, piece.size)
        .copy_(parameters_[piece.parameter].detach().reshape({-1}).narrow(0, piece.parameter_offset,
                                                                          piece.size));
  }
  Tensor& grad = slice_.mutable_grad();
  // Parameters without a gradient this step keep their values, as the whole optimizer
  // leaves them (their optimizer state still sees a zero gradient).
  std::vector<std::pair<const Piece*, Tensor>> kept;
  for (const Piece& piece : pieces_) {
    const Tensor& g = parameters_[piece.parameter].grad();
    if (!g.defined()) {
      kept.emplace_back(&piece, slice_.narrow(0, piece.slice_offset, piece.size).clone());
      continue;
    }
    grad.narrow(0, piece.slice_offset, piece.size)
        .copy_(g.reshape({-1}).narrow(0, piece.parameter_offset, piece.size));
  }
  optimizer_->step();
  for (const auto& [piece, values] : kept) {
    slice_.narrow(0, piece->slice_offset, piece->size).copy_(values);
  }
  slice_.mutable_grad() = Tensor();
  // Every rank's slice, gathered into a buffer that lives for this call only.
  Tensor gathered =
      ::torch::empty({slice_size_ * comm_->size()}, slice_.options().requires_grad(false));
  comm_->launch(comm_->all_gather(as_buffer(slice_.detach()), as_buffer(gathered))).get();
  slice_.set_data(::torch::empty({0}, options));
  std::int64_t offset = 0;
  for (Tensor& p : parameters_) {
    p.detach().view({-1}).copy_(gathered.narrow(0, offset, p.numel()));
    offset += p.numel();
  }
}

}  // namespace braid::torch
