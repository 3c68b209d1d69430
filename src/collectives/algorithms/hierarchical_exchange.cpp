// Hierarchical all-gather and reduce-scatter: direct exchanges across nodes on the rails
// and within each node, in the shapes of a uniform HierarchyPlan (hierarchy.hpp). Chosen by
// the selection table when a communicator's members span several nodes and some node holds
// several of them; uneven nodes take the ring instead.
//
// N nodes of L ranks each, P = N L; rank (k, i) is local rank i of node k; b bytes a block.
//
// All-gather (blocks of any sizes):
//   1. rail: rank (k, i) sends its block to every (k', i) and receives theirs, in place in
//      the output;
//   2. node: rank (k, i) sends the N blocks it now holds, {(k', i)}, to every node member
//      (k, j), and receives their N blocks {(k', j)}, in place.
//   time ~ (N-1) alpha_x + (N-1) b beta_x + (L-1) alpha_l + (L-1) N b beta_l, every message
//   of a phase posted at once.
// A flat ring crosses a node's link with (P-1) b of every rank's traffic on the ring edges
// between nodes: on 2 nodes of 2 ranks the edges carry 3 blocks each way where (N-1) L = 2
// must cross, so the ring tops out at 2/3 of the link. Here each node sends exactly the
// (N-1) L b bytes its ranks own to the other nodes, over all L rails at once.
//
// Reduce-scatter (equal blocks):
//   1. node: rank (k, i) sends to every node member (k, j) its input blocks {(k', j)} (one
//      message per block) and receives theirs of its own blocks {(k', i)}; it sums the
//      node's share of each into scratch;
//   2. rail: rank (k, i) sends its node's sum of block (k', i) to each (k', i), receives
//      theirs of block (k, i), and sums them into its output.
//   time ~ (L-1) alpha_l + (L-1) N b (beta_l + gamma) + (N-1) alpha_x + (N-1) b (beta_x + gamma)
// Each node sends (N-1) L b bytes to the others: the least there is. Every output block
// is reduced on one rank, in one order, so results do not depend on timing.
//
// Scratch: none for all-gather; reduce-scatter (L-1) N b + N b + (N-1) b.
#include <braid/collectives/hierarchy.hpp>

#include "collectives/algorithms/algorithms.hpp"

namespace braid::collectives::detail {

std::vector<std::vector<int>> members_by_node(const HierarchyPlan& plan) {
  std::vector<std::vector<int>> members(static_cast<std::size_t>(plan.nodes));
  for (std::size_t r = 0; r < plan.node_of.size(); ++r) {
    members[static_cast<std::size_t>(plan.node_of[r])].push_back(static_cast<int>(r));
  }
  return members;
}

namespace {

// Where member `rank`'s block sits among blocks of `counts` elements laid out in rank order.
struct BlockOffsets {
  explicit BlockOffsets(std::span<const std::size_t> counts) : offsets(counts.size() + 1, 0) {
    for (std::size_t r = 0; r < counts.size(); ++r) offsets[r + 1] = offsets[r] + counts[r];
  }
  Buffer of(const Buffer& whole, int rank) const {
    const auto r = static_cast<std::size_t>(rank);
    return whole.slice(offsets[r], offsets[r + 1] - offsets[r]);
  }
  std::vector<std::size_t> offsets;
};

}  // namespace

bool hierarchical_exchange_fits(const HierarchyPlan& plan) {
  // Steps number the blocks of a message set; they must stay below the tag's range.
  return plan.uniform && plan.worth_it() && plan.nodes < static_cast<int>(kAlgorithmSteps);
}

asio::awaitable<void> hierarchical_all_gather(CollectiveOp& op, Buffer input, Buffer output,
                                              std::span<const std::size_t> counts,
                                              const HierarchyPlan& plan) {
  const BlockOffsets blocks(counts);
  const Buffer out = output;
  const int me = op.rank();
  copy(blocks.of(out, me), input);
  const auto members = members_by_node(plan);
  const int my_node = plan.node_of[static_cast<std::size_t>(me)];
  std::vector<Message> messages;

  {
    const CollectiveOp::Subgroup rail(op, plan.cross_group);
    auto crossing = op.phase(trace::Name("rail all-gather"), out.size_bytes());
    for (int k = 0; k < plan.nodes; ++k) {
      if (k == my_node) continue;
      const int peer = plan.cross_group[static_cast<std::size_t>(k)];
      messages.push_back(op.recv(k, blocks.of(out, peer), 0));
    }
    for (int k = 0; k < plan.nodes; ++k) {
      if (k != my_node) messages.push_back(op.send(k, blocks.of(out, me), 0));
    }
    co_await op.wait_all(messages);
  }

  messages.clear();
  const CollectiveOp::Subgroup node(op, plan.local_group);
  auto gathering = op.phase(trace::Name("node all-gather"), out.size_bytes());
  const int local_size = static_cast<int>(plan.local_group.size());
  for (int j = 0; j < local_size; ++j) {
    if (j == plan.local_rank) continue;
    for (int k = 0; k < plan.nodes; ++k) {
      const int owner = members[static_cast<std::size_t>(k)][static_cast<std::size_t>(j)];
      messages.push_back(op.recv(j, blocks.of(out, owner), static_cast<std::uint32_t>(k)));
    }
  }
  for (int j = 0; j < local_size; ++j) {
    if (j == plan.local_rank) continue;
    for (int k = 0; k < plan.nodes; ++k) {
      const int owner =
          members[static_cast<std::size_t>(k)][static_cast<std::size_t>(plan.local_rank)];
      messages.push_back(op.send(j, blocks.of(out, owner), static_cast<std::uint32_t>(k)));
    }
  }
  co_await op.wait_all(messages);
}

asio::awaitable<void> hierarchical_reduce_scatter(CollectiveOp& op, Buffer input, Buffer output,
                                                  ReduceOp reduce_op, const HierarchyPlan& plan) {
  const Buffer in = input;
  const Buffer out = output;
  const std::size_t count = out.count();
  const DType dtype = out.dtype();
  const std::size_t block_bytes = out.size_bytes();
  const int everyone = op.size();
  const int me = op.rank();
  const auto members = members_by_node(plan);
  const int my_node = plan.node_of[static_cast<std::size_t>(me)];
  const auto nodes = static_cast<std::size_t>(plan.nodes);
  const int local_size = static_cast<int>(plan.local_group.size());
  const auto others_here = static_cast<std::size_t>(local_size - 1);
  // Every phase sums; the one division by P happens with the last reduction.
  const ReduceOp phase_op = reduce_op == ReduceOp::avg ? ReduceOp::sum : reduce_op;
  auto block_of = [&](const Buffer& whole, int rank) {
    return whole.slice(static_cast<std::size_t>(rank) * count, count);
  };
  auto my_block_on = [&](int k) {  // the member of node k with this rank's local index
    return members[static_cast<std::size_t>(k)][static_cast<std::size_t>(plan.local_rank)];
  };

  // landed[j'][k]: node member j' (j' counts the others) sent its block (k, i); node_sum[k]:
  // the node's sum of block (k, i); from_rail[k']: node k''s sum of this rank's block.
  ScratchPool::Lease scratch = op.scratch((others_here * nodes + nodes + nodes) * block_bytes);
  auto area = [&](std::size_t slot) {
    return Buffer(scratch.data() + slot * block_bytes, count, dtype);
  };
  auto landed = [&](std::size_t other, std::size_t k) { return area(other * nodes + k); };
  auto node_sum = [&](std::size_t k) { return area(others_here * nodes + k); };
  auto from_rail = [&](std::size_t k) { return area(others_here * nodes + nodes + k); };

  std::vector<Message> messages;
  {
    const CollectiveOp::Subgroup node(op, plan.local_group);
    auto reducing = op.phase(trace::Name("node reduce-scatter"), in.size_bytes());
    std::size_t other = 0;
    for (int j = 0; j < local_size; ++j) {
      if (j == plan.local_rank) continue;
      for (std::size_t k = 0; k < nodes; ++k) {
        messages.push_back(op.recv(j, landed(other, k), static_cast<std::uint32_t>(k)));
      }
      ++other;
    }
    for (int j = 0; j < local_size; ++j) {
      if (j == plan.local_rank) continue;
      for (std::size_t k = 0; k < nodes; ++k) {
        const int owner = members[k][static_cast<std::size_t>(j)];
        messages.push_back(op.send(j, block_of(in, owner), static_cast<std::uint32_t>(k)));
      }
    }
    co_await op.wait_all(messages);
    for (std::size_t k = 0; k < nodes; ++k) {
      const Buffer sum = node_sum(k);
      const Buffer mine = block_of(in, my_block_on(static_cast<int>(k)));
      if (others_here == 0) {
        copy(sum, mine);
        continue;
      }
      combine(sum, mine, landed(0, k), phase_op);
      for (std::size_t o = 1; o < others_here; ++o) combine(sum, sum, landed(o, k), phase_op);
    }
  }

  messages.clear();
  const CollectiveOp::Subgroup rail(op, plan.cross_group);
  auto crossing = op.phase(trace::Name("rail reduce-scatter"), nodes * block_bytes);
  for (int k = 0; k < plan.nodes; ++k) {
    if (k != my_node) messages.push_back(op.recv(k, from_rail(static_cast<std::size_t>(k)), 0));
  }
  for (int k = 0; k < plan.nodes; ++k) {
    if (k != my_node) messages.push_back(op.send(k, node_sum(static_cast<std::size_t>(k)), 0));
  }
  co_await op.wait_all(messages);
  // Node order, whatever order the messages came in: every run sums alike.
  copy(out, node_sum(static_cast<std::size_t>(my_node)));
  for (int k = 0; k < plan.nodes; ++k) {
    if (k != my_node) combine(out, out, from_rail(static_cast<std::size_t>(k)), phase_op);
  }
  finish_average(out, reduce_op, everyone);
}

}  // namespace braid::collectives::detail
