// Ring broadcast (a pipelined chain): ranks in ring order from the root; each receives the
// vector in ~256 KiB pieces from the rank before it and forwards every piece to the rank
// after it as soon as it has it, as NCCL's ring broadcast does.
//
// Cost (P ranks, n bytes, k pieces): P - 1 hops:
//   time ~ (P - 2 + k) (alpha + n/k beta), every rank sending n bytes once
// Against the binomial tree, whose root sends n to each of its ceil(log2 P) children, the
// chain sends every byte over every link once: on N nodes of one rank, the tree's root link
// carries log2(N) n and the chain's n, so at large sizes across nodes the chain reaches the
// link's rate where the tree reaches 1/log2(N) of it. The price is P - 2 more piece
// latencies to fill the pipe, which the selection table keeps to large vectors.
#include "collectives/algorithms/algorithms.hpp"

namespace braid::collectives::detail {

asio::awaitable<void> ring_broadcast(CollectiveOp& op, Buffer data, int root) {
  const int world = op.size();
  if (world == 1) co_return;
  const Buffer all = data;
  const int relative = (op.rank() - root + world) % world;
  const int before = (op.rank() - 1 + world) % world;
  const int after = (op.rank() + 1) % world;
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
