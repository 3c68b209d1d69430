#include <algorithm>
#include <map>
#include <numeric>
#include <tuple>

#include <fmt/format.h>

#include <braid/core/error.hpp>
#include <braid/dp/bucket_plan.hpp>

namespace braid::dp {

std::vector<std::size_t> reverse_order(std::size_t n) {
  std::vector<std::size_t> order(n);
  std::iota(order.rbegin(), order.rend(), std::size_t{0});
  return order;
}

std::vector<BucketLayout> plan_buckets(std::span<const ParameterSpec> parameters,
                                       std::span<const std::size_t> ready_order,
                                       BucketLimits limits) {
  auto refuse = [](std::string what) {
    throw Error(Errc::invalid_argument, std::move(what), {.operation = "plan_buckets"});
  };
  if (limits.first_bucket_bytes == 0 || limits.bucket_cap_bytes == 0) {
    refuse("bucket limits must be positive");
  }
  if (ready_order.size() != parameters.size()) {
    refuse(fmt::format("the ready order names {} parameters, the model has {}", ready_order.size(),
                       parameters.size()));
  }
  std::vector<bool> seen(parameters.size(), false);
  for (const std::size_t index : ready_order) {
    if (index >= parameters.size() || seen[index]) {
      refuse(fmt::format("the ready order is not a permutation: index {} {}", index,
                         index >= parameters.size() ? "is out of range" : "appears twice"));
    }
    seen[index] = true;
  }

  using Kind = std::tuple<DType, MemoryKind, int>;
  struct Open {
    BucketLayout layout;
    std::size_t first_position = 0;  // where its first parameter is in ready_order
    bool first_of_kind = true;
  };
  std::map<Kind, Open> open;
  std::map<Kind, bool> kind_started;
  std::vector<std::pair<std::size_t, BucketLayout>> closed;  // (first position, layout)
  auto close = [&](const Kind& kind) {
    auto it = open.find(kind);
    closed.emplace_back(it->second.first_position, std::move(it->second.layout));
    open.erase(it);
  };
  for (std::size_t position = 0; position < ready_order.size(); ++position) {
    const std::size_t index = ready_order[position];
    const ParameterSpec& p = parameters[index];
    const Kind kind{p.dtype, p.memory, p.device};
    auto it = open.find(kind);
    if (it == open.end()) {
      Open fresh;
      fresh.layout.dtype = p.dtype;
      fresh.layout.memory = p.memory;
      fresh.layout.device = p.device;
      fresh.first_position = position;
      fresh.first_of_kind = !kind_started[kind];
      kind_started[kind] = true;
      it = open.emplace(kind, std::move(fresh)).first;
    }
    BucketLayout& bucket = it->second.layout;
    bucket.parameters.push_back(index);
    bucket.offsets.push_back(bucket.count);
    bucket.count += p.count;
    const std::size_t limit =
        it->second.first_of_kind ? limits.first_bucket_bytes : limits.bucket_cap_bytes;
    if (bucket.count * dtype_size(p.dtype) >= limit) close(kind);
  }
  while (!open.empty()) close(open.begin()->first);
  std::stable_sort(closed.begin(), closed.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<BucketLayout> buckets;
  buckets.reserve(closed.size());
  for (auto& [position, layout] : closed) buckets.push_back(std::move(layout));
  return buckets;
}

}  // namespace braid::dp
