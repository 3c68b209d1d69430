// Pairwise all-to-all (equal and variable blocks): rank r sends its block j to rank j and
// receives block r of every rank i, each into its own place. Receives are posted first,
// in the order (r-1, r-2, ...), and sends in the order (r+1, r+2, ...), so at any moment
// the ranks' first messages pair up instead of all converging on rank 0.
//
// Cost (P ranks, n bytes sent per rank): time ~ (P-1) alpha + (P-1)/P n beta, the
// latency terms overlapping since every message is posted at once. Scratch: none out of
// place; n in place (the input is copied aside first).
#include "collectives/algorithms/algorithms.hpp"

namespace braid::collectives::detail {

asio::awaitable<void> pairwise_all_to_all(CollectiveOp& op, Buffer input,
                                          std::span<const std::size_t> send_counts, Buffer output,
                                          std::span<const std::size_t> recv_counts) {
  const int world = op.size();
  const int rank = op.rank();
  Buffer source = input;
  ScratchPool::Lease aside;
  if (input.data() == output.data() && input.count() != 0) {
    aside = op.scratch(input.size_bytes());
    source = aside.buffer(input.dtype(), input.count());
    copy(source, input);
  }
  std::vector<std::size_t> send_offsets(static_cast<std::size_t>(world) + 1, 0);
  std::vector<std::size_t> recv_offsets(static_cast<std::size_t>(world) + 1, 0);
  for (std::size_t r = 0; r < static_cast<std::size_t>(world); ++r) {
    send_offsets[r + 1] = send_offsets[r] + send_counts[r];
    recv_offsets[r + 1] = recv_offsets[r] + recv_counts[r];
  }
  auto block_of = [](const Buffer& whole, const std::vector<std::size_t>& offsets, int r) {
    const auto i = static_cast<std::size_t>(r);
    return whole.slice(offsets[i], offsets[i + 1] - offsets[i]);
  };
  std::vector<Message> messages;
  messages.reserve(2 * static_cast<std::size_t>(world));
  for (int distance = 1; distance < world; ++distance) {
    const int from = (rank - distance + world) % world;
    messages.push_back(op.recv(from, block_of(output, recv_offsets, from), 0));
  }
  for (int distance = 1; distance < world; ++distance) {
    const int to = (rank + distance) % world;
    messages.push_back(op.send(to, block_of(source, send_offsets, to), 0));
  }
  copy(block_of(output, recv_offsets, rank), block_of(source, send_offsets, rank));
  co_await op.wait_all(messages);
}

}  // namespace braid::collectives::detail
