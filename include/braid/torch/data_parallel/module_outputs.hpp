// The tensors a module's forward returned, found in a tensor, a vector or a tuple of them
// (anything else holds none): what DistributedDataParallel and FullyShardedDataParallel
// watch for unused parameters and backward's start.
#pragma once

#include <tuple>
#include <vector>

#include <torch/types.h>

namespace braid::torch::detail {

inline void collect_tensors(const at::Tensor& t, std::vector<at::Tensor>& out) {
  out.push_back(t);
}
inline void collect_tensors(const std::vector<at::Tensor>& ts, std::vector<at::Tensor>& out) {
  out.insert(out.end(), ts.begin(), ts.end());
}
template <class... T>
void collect_tensors(const std::tuple<T...>& tuple, std::vector<at::Tensor>& out) {
  std::apply([&](const auto&... element) { (collect_tensors(element, out), ...); }, tuple);
}
template <class T>
void collect_tensors(const T&, std::vector<at::Tensor>&) {}  // not a tensor: nothing to track

}  // namespace braid::torch::detail
