// Dissemination barrier (Hensgen, Finkel, Manber): in round i every rank signals the rank
// 2^i above it and waits for the rank 2^i below. After ceil(log2 P) rounds every rank has
// heard, directly or through others, from every rank.
//
// Cost (P ranks): ceil(log2 P) rounds of empty messages: time ~ ceil(log2 P) alpha, for
// any P (no power-of-two folding needed).
#include "collectives/algorithms/algorithms.hpp"

namespace braid::collectives::detail {

asio::awaitable<void> dissemination_barrier(CollectiveOp& op) {
  const int world = op.size();
  const int rank = op.rank();
  std::uint32_t round = 0;
  for (int distance = 1; distance < world; distance <<= 1, ++round) {
    Message received = op.recv((rank - distance + world) % world, Buffer{}, round);
    Message sent = op.send((rank + distance) % world, Buffer{}, round);
    co_await op.wait(sent);
    co_await op.wait(received);
  }
}

}  // namespace braid::collectives::detail
