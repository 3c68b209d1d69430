// Linear scatter: the root sends block r straight to rank r, all sends posted at once.
//
// Cost (P ranks, n bytes of input at the root): time ~ alpha + (P-1)/P n beta at the
// root's link (see linear_gather.cpp for why not a tree).
#include "collectives/algorithms/algorithms.hpp"

namespace braid::collectives::detail {

asio::awaitable<void> linear_scatter(CollectiveOp& op, Buffer input, Buffer output, int root) {
  const int world = op.size();
  if (op.rank() != root) {
    Message received = op.recv(root, output, 0);
    co_await op.wait(received);
    co_return;
  }
  const std::size_t block = output.count();
  std::vector<Message> sending;
  for (int r = 0; r < world; ++r) {
    if (r != root) {
      sending.push_back(op.send(r, input.slice(static_cast<std::size_t>(r) * block, block), 0));
    }
  }
  copy(output, input.slice(static_cast<std::size_t>(root) * block, block));
  co_await op.wait_all(sending);
}

}  // namespace braid::collectives::detail
