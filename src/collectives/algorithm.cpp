#include <braid/collectives/algorithm.hpp>

namespace braid::collectives {

std::string_view to_string(CollectiveKind kind) noexcept {
  switch (kind) {
    case CollectiveKind::all_reduce:
      return "all_reduce";
    case CollectiveKind::reduce_scatter:
      return "reduce_scatter";
    case CollectiveKind::all_gather:
      return "all_gather";
    case CollectiveKind::broadcast:
      return "broadcast";
    case CollectiveKind::reduce:
      return "reduce";
    case CollectiveKind::gather:
      return "gather";
    case CollectiveKind::scatter:
      return "scatter";
    case CollectiveKind::all_to_all:
      return "all_to_all";
    case CollectiveKind::barrier:
      return "barrier";
  }
  return "?";
}

std::string_view to_string(Algorithm algorithm) noexcept {
  switch (algorithm) {
    case Algorithm::ring:
      return "ring";
    case Algorithm::recursive_doubling:
      return "recursive_doubling";
    case Algorithm::halving_doubling:
      return "halving_doubling";
    case Algorithm::binomial_tree:
      return "binomial_tree";
    case Algorithm::linear:
      return "linear";
    case Algorithm::pairwise:
      return "pairwise";
    case Algorithm::dissemination:
      return "dissemination";
    case Algorithm::shared_memory:
      return "shared_memory";
    case Algorithm::hierarchical:
      return "hierarchical";
  }
  return "?";
}

std::optional<CollectiveKind> parse_collective_kind(std::string_view name) noexcept {
  for (CollectiveKind kind : all_collective_kinds) {
    const std::string_view canonical = to_string(kind);
    if (name == canonical) return kind;
    // Also without underscores: "allreduce", "reducescatter", "alltoall".
    std::size_t i = 0;
    bool same = true;
    for (char c : canonical) {
      if (c == '_') continue;
      if (i >= name.size() || name[i] != c) {
        same = false;
        break;
      }
      ++i;
    }
    if (same && i == name.size()) return kind;
  }
  return std::nullopt;
}

std::optional<Algorithm> parse_algorithm(std::string_view name) noexcept {
  for (Algorithm algorithm : all_algorithms) {
    if (name == to_string(algorithm)) return algorithm;
  }
  return std::nullopt;
}

bool implements(CollectiveKind kind, Algorithm algorithm) noexcept {
  switch (kind) {
    case CollectiveKind::all_reduce:
      return algorithm == Algorithm::ring || algorithm == Algorithm::recursive_doubling ||
             algorithm == Algorithm::halving_doubling || algorithm == Algorithm::shared_memory ||
             algorithm == Algorithm::hierarchical;
    case CollectiveKind::reduce_scatter:
    case CollectiveKind::all_gather:
      return algorithm == Algorithm::ring || algorithm == Algorithm::shared_memory ||
             algorithm == Algorithm::hierarchical;
    case CollectiveKind::broadcast:
      return algorithm == Algorithm::binomial_tree || algorithm == Algorithm::ring ||
             algorithm == Algorithm::shared_memory;
    case CollectiveKind::reduce:
      return algorithm == Algorithm::binomial_tree || algorithm == Algorithm::shared_memory;
    case CollectiveKind::gather:
    case CollectiveKind::scatter:
      return algorithm == Algorithm::linear || algorithm == Algorithm::shared_memory;
    case CollectiveKind::all_to_all:
      return algorithm == Algorithm::pairwise || algorithm == Algorithm::shared_memory;
    case CollectiveKind::barrier:
      return algorithm == Algorithm::dissemination || algorithm == Algorithm::shared_memory;
  }
  return false;
}

}  // namespace braid::collectives
