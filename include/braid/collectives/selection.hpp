// Which algorithm runs a collective: a table of rules by (kind, message size, world
// size), like OpenMPI's tuned decision rules or UCC's tune strings, overridable with
// BRAID_ALGO and printable (`braid-bench algorithms`).
//
// BRAID_ALGO syntax: rules for one kind are `kind:range:algorithm`, several ranges of one
// kind joined with '#', kinds separated by ';':
//
//   BRAID_ALGO="allreduce:0-64k:recursive_doubling#64k-inf:ring;broadcast:0-inf:binomial_tree"
//
// A range is `lo-hi` in bytes, lo inclusive, hi exclusive; sizes take k, m, g (powers of
// 1024) and `inf`. A rule may end with `@lo-hi` to apply only to world sizes in [lo, hi]
// ("allreduce:0-inf:ring@3-8"). Override rules are tried first, in the order written;
// sizes and worlds they do not cover fall through to the built-in table. A malformed
// string, an unknown kind or algorithm, or an algorithm braid does not have for that kind
// is an Error(Errc::invalid_environment) naming BRAID_ALGO.
//
// Placement. Rules depend on where the members run (MemberPlacement): rules naming
// shared_memory apply only when every member is on this node, and rules naming
// hierarchical only when the members span several nodes and some node holds several;
// hierarchical all-gather and reduce-scatter also need every node to hold as many.
//
// "Size" is the per-rank buffer as nccl-tests counts it: the buffer of all_reduce,
// broadcast and reduce, the full output of all_gather and gather, the full input of
// reduce_scatter and scatter, the send buffer of all_to_all.
#pragma once

#include <cstddef>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

#include <braid/collectives/algorithm.hpp>

namespace braid::collectives {

// Where a communicator's members run, as far as choosing an algorithm is concerned.
struct MemberPlacement {
  bool one_node = true;        // every member on this node: shared memory reaches them all
  bool grouped_nodes = false;  // several nodes, at least one holding several members
  bool even_nodes = false;     // grouped_nodes, every node holding as many members
};

struct SelectionRule {
  CollectiveKind kind;
  std::size_t min_bytes = 0;                                        // inclusive
  std::size_t max_bytes = std::numeric_limits<std::size_t>::max();  // exclusive
  int min_world = 1;                                                // inclusive
  int max_world = std::numeric_limits<int>::max();                  // inclusive
  Algorithm algorithm;
};

class SelectionTable {
 public:
  // The built-in rules alone.
  static SelectionTable built_in();
  // The built-in rules under the overrides in `overrides` (BRAID_ALGO syntax); throws
  // Error(Errc::invalid_environment) for a malformed string.
  static SelectionTable with_overrides(std::string_view overrides);
  // The built-in rules under BRAID_ALGO, parsed once per process.
  static const SelectionTable& from_environment();

  // The first rule that covers (kind, bytes, world_size) and suits `placement`.
  Algorithm select(CollectiveKind kind, std::size_t bytes, int world_size,
                   MemberPlacement placement = {}) const;

  // The rules in force, overrides first, one per line.
  std::string describe() const;
  const std::vector<SelectionRule>& rules() const noexcept { return rules_; }

 private:
  std::vector<SelectionRule> rules_;
};

// Parses BRAID_ALGO syntax into rules; `what` names the source in errors.
std::vector<SelectionRule> parse_selection_rules(std::string_view text, std::string_view what);

}  // namespace braid::collectives
