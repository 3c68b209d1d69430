// The names of braid's collectives and of the algorithms that carry them out, as used by
// the selection table (selection.hpp), BRAID_ALGO, traces and error messages.
//
// Each algorithm lives in its own file under src/collectives/algorithms/, with its cost
// in its header comment; docs/algorithms.md collects the costs in one table.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string_view>

namespace braid::collectives {

enum class CollectiveKind : std::uint8_t {
  all_reduce,
  reduce_scatter,
  all_gather,
  broadcast,
  reduce,
  gather,
  scatter,
  all_to_all,
  barrier,
};

inline constexpr std::array all_collective_kinds = {
    CollectiveKind::all_reduce, CollectiveKind::reduce_scatter, CollectiveKind::all_gather,
    CollectiveKind::broadcast,  CollectiveKind::reduce,         CollectiveKind::gather,
    CollectiveKind::scatter,    CollectiveKind::all_to_all,     CollectiveKind::barrier,
};

enum class Algorithm : std::uint8_t {
  ring,                // reduce-scatter then all-gather around a ring, chunked and pipelined
  recursive_doubling,  // log2(P) full-vector exchanges; latency-bound sizes
  halving_doubling,    // Rabenseifner: recursive-halving reduce-scatter, doubling all-gather
  binomial_tree,       // rooted: log2(P) levels, chunks pipelined down (or up) the tree
  linear,              // rooted: the root exchanges with every rank directly
  pairwise,            // all-to-all: every pair exchanges its blocks, all posted at once
  dissemination,       // barrier: log2(P) rounds of zero-byte messages
  shared_memory,       // members on one node: peers' buffers read directly (all-reduce also
                       // through a mapped segment); elsewhere, the message algorithm
  hierarchical,        // all-reduce within each node, across nodes, within again
};

inline constexpr std::array all_algorithms = {
    Algorithm::ring,
    Algorithm::recursive_doubling,
    Algorithm::halving_doubling,
    Algorithm::binomial_tree,
    Algorithm::linear,
    Algorithm::pairwise,
    Algorithm::dissemination,
    Algorithm::shared_memory,
    Algorithm::hierarchical,
};

// snake_case names: "all_reduce", "ring". BRAID_ALGO also accepts the kinds without the
// underscore ("allreduce"), as UCC and NCCL spell them.
std::string_view to_string(CollectiveKind kind) noexcept;
std::string_view to_string(Algorithm algorithm) noexcept;
std::optional<CollectiveKind> parse_collective_kind(std::string_view name) noexcept;
std::optional<Algorithm> parse_algorithm(std::string_view name) noexcept;

// Whether braid has `algorithm` for `kind` (ring all-reduce: yes; ring barrier: no).
bool implements(CollectiveKind kind, Algorithm algorithm) noexcept;

}  // namespace braid::collectives
