// Ring broadcast (a pipelined chain): each rank receives the vector in ~256 KiB pieces from
// the rank before it and forwards every piece to the rank after it as soon as it has it,
// as NCCL's ring broadcast does. The chain goes node by node (the plan's node order, then
// rank order within a node) from the root's place, so it crosses each node boundary once
// whatever the placement (round-robin ranks would otherwise cross at every hop).
//
// Cost (P ranks, n bytes, k pieces): P - 1 hops:
//   time ~ (P - 2 + k) (alpha + n/k beta), every rank sending n bytes once
// Against the binomial tree, whose root sends n to each of its ceil(log2 P) children, the
// chain sends every byte over every link once: on N nodes of one rank, the tree's root link
// carries log2(N) n and the chain's n, so at large sizes across nodes the chain reaches the
// link's rate where the tree reaches 1/log2(N) of it. The price is P - 2 more piece
// latencies to fill the pipe, which the selection table keeps to large vectors.
#include <algorithm>

#include <braid/collectives/hierarchy.hpp>

#include "collectives/algorithms/algorithms.hpp"

namespace braid::collectives::detail {

asio::awaitable<void> ring_broadcast(CollectiveOp& op, Buffer data, int root,
                                     const HierarchyPlan& plan) {
  const int world = op.size();
  if (world == 1) co_return;
  const Buffer all = data;
  // The chain: ranks by node, then by rank, rotated to start at the root.
  std::vector<int> chain(static_cast<std::size_t>(world));
  for (int r = 0; r < world; ++r) chain[static_cast<std::size_t>(r)] = r;
  const std::vector<int>& node_of = plan.node_of;  // lambdas take no coroutine parameter
  std::stable_sort(chain.begin(), chain.end(), [&node_of](int a, int b) {
    return node_of[static_cast<std::size_t>(a)] < node_of[static_cast<std::size_t>(b)];
  });
  std::rotate(chain.begin(), std::find(chain.begin(), chain.end(), root), chain.end());
  const auto place =
      static_cast<int>(std::find(chain.begin(), chain.end(), op.rank()) - chain.begin());
  const int before = chain[static_cast<std::size_t>((place - 1 + world) % world)];
  const int after = chain[static_cast<std::size_t>((place + 1) % world)];
  const int relative = place;
  const bool forwards = relative != world - 1;
  const EvenSplit split = broadcast_pieces(all);

  std::vector<Message> receiving;
  if (relative != 0) {
    for (std::size_t k = 0; k < split.parts; ++k) {
      receiving.push_back(op.recv(before, all.slice(split.offset(k), split.size(k)),
                                  static_cast<std::uint32_t>(k)));
    }
  }
  std::vector<Message> sending;
  for (std::size_t k = 0; k < split.parts; ++k) {
    if (relative != 0) co_await op.wait(receiving[k]);
    if (forwards) {
      sending.push_back(
          op.send(after, all.slice(split.offset(k), split.size(k)), static_cast<std::uint32_t>(k)));
    }
  }
  co_await op.wait_all(sending);
}

}  // namespace braid::collectives::detail
