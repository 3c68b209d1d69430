// Hierarchical all-reduce: within each node first, across nodes second, in the shapes of
// HierarchyPlan (hierarchy.hpp). Chosen by the selection table when a communicator's
// members span several nodes and some node holds several of them.
//
// Uniform (N nodes of L ranks each, P = N L; alpha_l, beta_l within a node, alpha_x,
// beta_x across nodes), pipelined over chunks. The vector is cut into P blocks, block r
// owned by rank r, and every block into C chunks of about BRAID_RING_PIECE_KIB; rank
// (k, i) is local rank i of node k. For each chunk, as soon as the chunk before allows:
//   1. node reduce-scatter: rank (k, i) sends each node member (k, j) its chunk of the
//      blocks {(k', j)} and sums the members' chunks of its blocks {(k', i)} in place;
//   2. rail reduce-scatter: it sends its node's sum of block (k', i) to (k', i) and sums
//      the other nodes' sums of its own block, in node order: the chunk is final;
//   3. rail all-gather: it sends the final chunk to every (k', i) and receives theirs;
//   4. node all-gather: it sends the N final chunks {(k', i)} to every node member and
//      receives theirs.
//   time ~ 2(N-1) alpha_x + 2 (N-1)/N n beta_x  (the link's share, each node sending
//          2 (N-1)/N n, its L rails at once)
//          + the first and last chunks' node phases, about 2 (L-1)/L (n/C) beta_l
// The node phases of one chunk run while the rails carry the others, so the link is idle
// only while the pipeline fills and drains; the unpipelined shape (ring reduce-scatter in
// the node, all-reduce on the rail, ring all-gather in the node) ran them one after
// another: 83% of a 1 Gbit/s link at 16 MiB on 2 nodes of 2 ranks. Every message of a
// phase is posted as soon as its data exists; a buffer a receive lands in is one whose
// send has completed. Plans with 2N steps or more per chunk beyond the tag's range keep
// the unpipelined shape (over 2000 nodes), and so do vectors of one chunk a block on more
// than 2 nodes (pipelines_rails).
//
// Uneven nodes (leaders): binomial reduce to each node's first rank, all-reduce among the
// leaders, binomial broadcast within each node:
//   time ~ 2 log2(L) (alpha_l + n beta_l) + 2(N-1) alpha_x + 2 (N-1)/N n beta_x
//
// Every rank ends bit-identical: each block is reduced once, on one rail, then copied.
// avg sums through all phases and divides once by P. Scratch: that of the phases.
#include <algorithm>

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

// The vector's blocks (one per rank) and their chunks, alike on every rank.
class ChunkedBlocks {
 public:
  ChunkedBlocks(const Buffer& whole, int ranks, std::size_t chunks)
      : whole_(whole), blocks_{whole.count(), static_cast<std::size_t>(ranks)}, chunks_(chunks) {}
  std::size_t chunks() const noexcept { return chunks_; }
  Buffer chunk(int block, std::size_t c) const {
    const auto b = static_cast<std::size_t>(block);
    const EvenSplit within{blocks_.size(b), chunks_};
    return whole_.slice(blocks_.offset(b) + within.offset(c), within.size(c));
  }
  std::size_t largest_chunk() const noexcept { return EvenSplit{blocks_.size(0), chunks_}.size(0); }

 private:
  Buffer whole_;
  EvenSplit blocks_;
  std::size_t chunks_;
};

// How many chunks each block of `out` is cut into: one per BRAID_RING_PIECE_KIB, as many
// as the tag's steps allow (2N a chunk) and the block's elements.
std::size_t rail_chunks(const Buffer& out, int everyone, const HierarchyPlan& plan) {
  const auto ranks = static_cast<std::size_t>(everyone);
  const std::size_t block_bytes = EvenSplit{out.count(), ranks}.size(0) * dtype_size(out.dtype());
  const std::size_t most_chunks =
      (kAlgorithmSteps - 1) / (2 * static_cast<std::size_t>(plan.nodes));
  return std::clamp<std::size_t>(
      (block_bytes + ring_piece_bytes() - 1) / ring_piece_bytes(), 1,
      std::max<std::size_t>(1, std::min(most_chunks, out.count() / ranks)));
}

// The uniform plan, pipelined over chunks (see the top of this file). `out` holds this
// rank's input.
asio::awaitable<void> pipelined_rails(CollectiveOp& op, const Buffer& out, ReduceOp reduce_op,
                                      const HierarchyPlan& plan) {
  const int everyone = op.size();
  const ReduceOp phase_op = reduce_op == ReduceOp::avg ? ReduceOp::sum : reduce_op;
  const auto nodes = static_cast<std::size_t>(plan.nodes);
  const auto local_size = plan.local_group.size();
  const auto me_local = static_cast<std::size_t>(plan.local_rank);
  const std::size_t my_node = static_cast<std::size_t>(plan.cross_rank);
  const std::vector<std::vector<int>> members = members_by_node(plan);
  const ChunkedBlocks blocks(out, everyone, rail_chunks(out, everyone, plan));
  const std::size_t chunks = blocks.chunks();
  auto owner = [&](std::size_t node, std::size_t local) { return members[node][local]; };
  const int me = owner(my_node, me_local);
  auto node_step = [&](std::size_t c, std::size_t k) {
    return static_cast<std::uint32_t>(c * nodes + k);
  };
  auto node_gather_step = [&](std::size_t c, std::size_t k) {
    return static_cast<std::uint32_t>(chunks * nodes + c * nodes + k);
  };
  auto rail_gather_step = [&](std::size_t c) { return static_cast<std::uint32_t>(chunks + c); };

  // Landing areas: what node members send of this rank's blocks (others x nodes x chunks),
  // and what the other nodes send of its own block (nodes x chunks).
  const std::size_t piece_bytes = blocks.largest_chunk() * dtype_size(out.dtype());
  const std::size_t others = local_size - 1;
  ScratchPool::Lease scratch = op.scratch((others * nodes + nodes) * chunks * piece_bytes);
  auto area = [&](std::size_t slot, const Buffer& like) {
    return Buffer(scratch.data() + slot * piece_bytes, like.count(), like.dtype());
  };
  auto landed = [&](std::size_t other, std::size_t k, std::size_t c) {
    return area((other * nodes + k) * chunks + c, blocks.chunk(owner(k, me_local), c));
  };
  auto from_rail = [&](std::size_t k, std::size_t c) {
    return area((others * nodes + k) * chunks + c, blocks.chunk(me, c));
  };
  auto other_index = [&](std::size_t j) { return j < me_local ? j : j - 1; };
  auto per_chunk = [&] { return std::vector<std::vector<Message>>(chunks); };

  auto pipeline = op.phase(trace::Name("pipelined rails"), out.size_bytes());
  // 1. Node reduce-scatter, every chunk posted at once (memory is fast beside the link).
  auto node_in = per_chunk(), node_out = per_chunk(), rail_in = per_chunk(), rail_out = per_chunk(),
       rail_gather_in = per_chunk(), gathered = per_chunk();
  {
    const CollectiveOp::Subgroup node(op, plan.local_group);
    for (std::size_t c = 0; c < chunks; ++c) {
      for (std::size_t j = 0; j < local_size; ++j) {
        if (j == me_local) continue;
        for (std::size_t k = 0; k < nodes; ++k) {
          node_in[c].push_back(
              op.recv(static_cast<int>(j), landed(other_index(j), k, c), node_step(c, k)));
          node_out[c].push_back(
              op.send(static_cast<int>(j), blocks.chunk(owner(k, j), c), node_step(c, k)));
        }
      }
    }
  }
  {
    const CollectiveOp::Subgroup rail(op, plan.cross_group);
    for (std::size_t c = 0; c < chunks; ++c) {
      for (std::size_t k = 0; k < nodes; ++k) {
        if (k != my_node) {
          rail_in[c].push_back(
              op.recv(static_cast<int>(k), from_rail(k, c), static_cast<std::uint32_t>(c)));
        }
      }
    }
  }
  // 2. Each chunk summed over the node goes out on the rail at once.
  for (std::size_t c = 0; c < chunks; ++c) {
    co_await op.wait_all(node_in[c]);
    for (std::size_t k = 0; k < nodes; ++k) {
      const Buffer sum = blocks.chunk(owner(k, me_local), c);
      for (std::size_t o = 0; o < others; ++o) combine(sum, sum, landed(o, k, c), phase_op);
    }
    const CollectiveOp::Subgroup rail(op, plan.cross_group);
    for (std::size_t k = 0; k < nodes; ++k) {
      if (k != my_node) {
        rail_out[c].push_back(op.send(static_cast<int>(k), blocks.chunk(owner(k, me_local), c),
                                      static_cast<std::uint32_t>(c)));
      }
    }
  }
  // 3. and 4. Each chunk of this rank's block, once final, goes to the rail; each chunk the
  // rail has gathered goes to the node, one chunk behind.
  auto gather_in_node = [&](std::size_t c) -> asio::awaitable<void> {
    co_await op.wait_all(rail_gather_in[c]);
    co_await op.wait_all(node_out[c]);  // their buffers now take the node's final chunks
    const CollectiveOp::Subgroup node(op, plan.local_group);
    for (std::size_t j = 0; j < local_size; ++j) {
      if (j == me_local) continue;
      for (std::size_t k = 0; k < nodes; ++k) {
        gathered[c].push_back(
            op.recv(static_cast<int>(j), blocks.chunk(owner(k, j), c), node_gather_step(c, k)));
        gathered[c].push_back(op.send(static_cast<int>(j), blocks.chunk(owner(k, me_local), c),
                                      node_gather_step(c, k)));
      }
    }
  };
  for (std::size_t c = 0; c < chunks; ++c) {
    co_await op.wait_all(rail_in[c]);
    const Buffer mine = blocks.chunk(me, c);
    for (std::size_t k = 0; k < nodes; ++k) {
      if (k != my_node) combine(mine, mine, from_rail(k, c), phase_op);
    }
    finish_average(mine, reduce_op, everyone);
    co_await op.wait_all(rail_out[c]);  // their buffers now take the other nodes' results
    {
      const CollectiveOp::Subgroup rail(op, plan.cross_group);
      for (std::size_t k = 0; k < nodes; ++k) {
        if (k == my_node) continue;
        rail_gather_in[c].push_back(
            op.recv(static_cast<int>(k), blocks.chunk(owner(k, me_local), c), rail_gather_step(c)));
        rail_gather_in[c].push_back(op.send(static_cast<int>(k), mine, rail_gather_step(c)));
      }
    }
    if (c > 0) co_await gather_in_node(c - 1);
  }
  co_await gather_in_node(chunks - 1);
  for (auto& chunk : gathered) co_await op.wait_all(chunk);
}

// Pipelining needs two chunks or more to overlap anything. With one, on more than 2 nodes
// the rails' direct exchanges (N-1 flows a rank at once) lose to the cross-node algorithm
// the table picks (4 emulated nodes of 2 ranks, 1 Gbit/s: 1 MiB in 23 ms against 15.5); on 2
// nodes the two are the same exchange.
bool pipelines_rails(const Buffer& out, int everyone, const HierarchyPlan& plan) {
  return plan.uniform && 2 * static_cast<std::size_t>(plan.nodes) < kAlgorithmSteps &&
         (plan.nodes == 2 || rail_chunks(out, everyone, plan) >= 2);
}

}  // namespace

asio::awaitable<void> hierarchical_all_reduce(CollectiveOp& op, Buffer input, Buffer output,
                                              ReduceOp reduce_op, const HierarchyPlan& plan,
                                              const SelectionTable& selection) {
  const Buffer out = output;
  const int everyone = op.size();
  copy(out, input);
  if (pipelines_rails(out, everyone, plan)) {
    co_await pipelined_rails(op, out, reduce_op, plan);
    co_return;
  }
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
