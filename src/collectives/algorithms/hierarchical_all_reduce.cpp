// Hierarchical all-reduce: within each node first, across nodes second, in the shapes of
// HierarchyPlan (hierarchy.hpp). Chosen by the selection table when a communicator's
// members span several nodes and some node holds several of them.
//
// Uniform (N nodes of L ranks each, P = N L; alpha_l, beta_l within a node, alpha_x,
// beta_x across nodes):
//   1. ring reduce-scatter within the node: rank i of the node ends with block i;
//   2. all-reduce of block i (n/L bytes) across the rail of ranks i, by the algorithm the
//      selection table gives its size and ranks;
//   3. ring all-gather within the node.
//   time ~ 2(L-1) alpha_l + 2 (L-1)/L n beta_l + 2(N-1) alpha_x + 2 (N-1)/N (n/L) beta_x
//          + gamma terms
// Against a flat ring (2(P-1) alpha_x + 2 (P-1)/P n beta_x, as every step waits for the
// slowest link): the cross-node latency terms drop from 2(P-1) to 2(N-1), and each rank
// sends only n/L of its vector through the node's network link, all L rails at once.
//
// Uneven nodes (leaders): binomial reduce to each node's first rank, all-reduce among the
// leaders, binomial broadcast within each node:
//   time ~ 2 log2(L) (alpha_l + n beta_l) + 2(N-1) alpha_x + 2 (N-1)/N n beta_x
//
// Every rank ends bit-identical: each block is reduced once, on one rail, then copied.
// avg sums through all phases and divides once by P. Scratch: that of the phases.
#include <braid/collectives/hierarchy.hpp>
#include <braid/collectives/selection.hpp>

#include "collectives/algorithms/algorithms.hpp"
#include "collectives/algorithms/ring_phases.hpp"

namespace braid::collectives::detail {
namespace {

// Steps of the second intra-node phase start here: the first used fewer (RingLayout keeps
// an operation's steps under the tag's width), and the cross-node phase talks to other
// peers.
constexpr std::uint32_t kSecondLocalPhaseStep = kAlgorithmSteps / 2;

// The all-reduce among the rail (or the leaders), run as the selection table says for
// its bytes and ranks placed on separate nodes: latency-bound sizes recursive doubling,
// then halving-doubling, then ring (docs/algorithms.md), or what BRAID_ALGO sets.
asio::awaitable<void> cross_node_all_reduce(CollectiveOp& op, const Buffer& data, ReduceOp op_kind,
                                            const SelectionTable& selection) {
  co_await message_all_reduce(
      op, data, data, op_kind,
      selection.select(CollectiveKind::all_reduce, data.size_bytes(), op.size(),
                       {.one_node = false, .grouped_nodes = false}));
}

}  // namespace

asio::awaitable<void> hierarchical_all_reduce(CollectiveOp& op, Buffer input, Buffer output,
                                              ReduceOp reduce_op, const HierarchyPlan& plan,
                                              const SelectionTable& selection) {
  const Buffer out = output;
  const int everyone = op.size();
  copy(out, input);
  // Every phase sums; the one division by P happens after the last reduction.
  const ReduceOp phase_op = reduce_op == ReduceOp::avg ? ReduceOp::sum : reduce_op;
  const int local_size = static_cast<int>(plan.local_group.size());

  if (plan.uniform) {
    const RingLayout layout(out.count(), local_size, out.dtype());
    const PartialBlock in_place = [&layout, out](int block, int) {
      return layout.block(out, block);
    };
    if (local_size > 1) {
      const CollectiveOp::Subgroup node(op, plan.local_group);
      auto reducing = op.phase(trace::Name("node reduce-scatter"), out.size_bytes());
      co_await ring_reduce_scatter_phase(op, out, layout, phase_op, in_place, 0);
    }
    const Buffer mine = layout.block(out, plan.local_rank);
    if (plan.cross_group.size() > 1) {
      const CollectiveOp::Subgroup rail(op, plan.cross_group);
      auto crossing = op.phase(trace::Name("cross-node all-reduce"), mine.size_bytes());
      co_await cross_node_all_reduce(op, mine, phase_op, selection);
    }
    finish_average(mine, reduce_op, everyone);
    if (local_size > 1) {
      const CollectiveOp::Subgroup node(op, plan.local_group, kSecondLocalPhaseStep);
      auto gathering = op.phase(trace::Name("node all-gather"), out.size_bytes());
      co_await ring_all_gather_phase(op, out, layout, 0);
    }
    co_return;
  }

  if (local_size > 1) {
    const CollectiveOp::Subgroup node(op, plan.local_group);
    auto reducing = op.phase(trace::Name("node reduce"), out.size_bytes());
    co_await binomial_tree_reduce(op, out, out, phase_op, 0);
  }
  if (plan.is_leader()) {
    if (plan.cross_group.size() > 1) {
      const CollectiveOp::Subgroup leaders(op, plan.cross_group);
      auto crossing = op.phase(trace::Name("cross-node all-reduce"), out.size_bytes());
      co_await cross_node_all_reduce(op, out, phase_op, selection);
    }
    finish_average(out, reduce_op, everyone);
  }
  if (local_size > 1) {
    const CollectiveOp::Subgroup node(op, plan.local_group, kSecondLocalPhaseStep);
    auto broadcasting = op.phase(trace::Name("node broadcast"), out.size_bytes());
    co_await binomial_tree_broadcast(op, out, 0);
  }
}

}  // namespace braid::collectives::detail
