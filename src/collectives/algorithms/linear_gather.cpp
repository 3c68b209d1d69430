// Linear gather: every rank sends its block straight to the root, which posts all the
// receives at once, each into its place in the output.
//
// Cost (P ranks, n bytes of output at the root): time ~ alpha + (P-1)/P n beta at the
// root's link, which every byte must cross anyway. A tree would cut the latency terms to
// log2(P) at the price of copies through intermediate ranks; with the few ranks per node
// braid targets, the root's P-1 concurrent receives are cheaper.
#include "collectives/algorithms/algorithms.hpp"

namespace braid::collectives::detail {

asio::awaitable<void> linear_gather(CollectiveOp& op, Buffer input, Buffer output, int root) {
  const int world = op.size();
  if (op.rank() != root) {
    Message sent = op.send(root, input, 0);
    co_await op.wait(sent);
    co_return;
  }
  const std::size_t block = input.count();
  std::vector<Message> receiving;
  for (int r = 0; r < world; ++r) {
    if (r != root) {
      receiving.push_back(op.recv(r, output.slice(static_cast<std::size_t>(r) * block, block), 0));
    }
  }
  copy(output.slice(static_cast<std::size_t>(root) * block, block), input);
  co_await op.wait_all(receiving);
}

}  // namespace braid::collectives::detail
