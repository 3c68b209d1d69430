// Binomial-tree broadcast, pipelined: ranks are numbered relative to the root; rank v
// receives from v minus its lowest set bit and forwards to v + 2^j for every 2^j below
// that bit, largest subtree first. The vector travels as ~256 KiB pieces, and a rank
// forwards each piece as soon as it has it, so deep trees overlap their levels.
//
// Cost (P ranks, n bytes, k pieces): ceil(log2 P) levels:
//   time ~ (ceil(log2 P) + k - 1) (alpha + n/k beta), with the root sending
//   ceil(log2 P) n bytes
// Small vectors: log2(P) latencies, the fewest for a broadcast. Large: the root's
// log2(P) copies bound it, so large vectors across nodes take the ring (ring_broadcast.cpp).
#include <algorithm>
#include <bit>

#include "collectives/algorithms/algorithms.hpp"

namespace braid::collectives::detail {

EvenSplit broadcast_pieces(const Buffer& data) {
  constexpr std::size_t kPieceBytes = 256 * 1024;
  const std::size_t pieces =
      std::clamp<std::size_t>((data.size_bytes() + kPieceBytes - 1) / kPieceBytes, 1,
                              std::max<std::size_t>(1, data.count()));
  return EvenSplit{data.count(), std::min<std::size_t>(pieces, kAlgorithmSteps)};
}

asio::awaitable<void> binomial_tree_broadcast(CollectiveOp& op, Buffer data, int root) {
  const int world = op.size();
  if (world == 1) co_return;
  const Buffer all = data;
  const int root_rank = root;  // lambdas must not capture coroutine parameters (GCC 12)
  const int relative = (op.rank() - root_rank + world) % world;
  auto actual = [world, root_rank](int v) { return (v + root_rank) % world; };
  const EvenSplit split = broadcast_pieces(all);
  auto piece = [&](std::size_t k) { return all.slice(split.offset(k), split.size(k)); };

  // The root's "lowest bit" is above every rank, so it sends to every level.
  const int lowest_bit = relative == 0
                             ? static_cast<int>(std::bit_ceil(static_cast<unsigned>(world)))
                             : (relative & -relative);
  std::vector<Message> receiving;
  if (relative != 0) {
    const int parent = actual(relative - lowest_bit);
    for (std::size_t k = 0; k < split.parts; ++k) {
      receiving.push_back(op.recv(parent, piece(k), static_cast<std::uint32_t>(k)));
    }
  }
  std::vector<int> children;
  for (int bit = lowest_bit / 2; bit >= 1; bit /= 2) {
    if (relative + bit < world) children.push_back(actual(relative + bit));
  }
  std::vector<Message> sending;
  for (std::size_t k = 0; k < split.parts; ++k) {
    if (relative != 0) co_await op.wait(receiving[k]);
    for (int child : children) {
      sending.push_back(op.send(child, piece(k), static_cast<std::uint32_t>(k)));
    }
  }
  co_await op.wait_all(sending);
}

}  // namespace braid::collectives::detail
