// Reducer::clip_grad_norm (<braid/dp/reducer.hpp>): every rank's gradient norm, their
// largest agreed by an all-reduce, and the gradients scaled down where it exceeds max_norm.
#include <cmath>
#include <vector>

#include <fmt/format.h>

#include <braid/dp/reducer.hpp>

#include "dp/reducer_internal.hpp"
#include "dp/scaled_copy.hpp"

namespace braid::dp {

using detail::misuse;

double Reducer::clip_grad_norm(double max_norm) {
  if (!(max_norm > 0)) misuse(*comm_, fmt::format("clip_grad_norm: max_norm {} <= 0", max_norm));
  if (state_ == State::backward) misuse(*comm_, "clip_grad_norm before the backward finished");
  if (device_ != nullptr) {
    misuse(*comm_,
           "clip_grad_norm reads gradients in host memory; for gradients in CUDA memory "
           "use the framework's (torch::nn::utils::clip_grad_norm_), which every rank "
           "computes alike on the averaged gradients");
  }
  double squares = 0;
  std::vector<Buffer> gradients;
  for (std::size_t i = 0; i < parameters_.size(); ++i) {
    const std::optional<Buffer> g = access_.gradient(i, false);
    if (!g) continue;
    gradients.push_back(*g);
    std::vector<float> widened(g->count());
    detail::widen(*g, widened);
    for (const float x : widened) squares += double{x} * x;
  }
  std::vector<double> norm{std::sqrt(squares)};
  comm_->launch(comm_->all_reduce(Buffer(norm), ReduceOp::max)).get();
  const double factor = max_norm / (norm[0] + 1e-6);
  if (factor < 1.0) {
    for (const Buffer& g : gradients) detail::scaled_copy(g, g, factor);
  }
  return norm[0];
}

}  // namespace braid::dp
