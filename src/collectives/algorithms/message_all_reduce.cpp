// The message-based all-reduces by name: what the Communicator runs for a flat group and
// what the hierarchical all-reduce runs across nodes, from one table lookup each.
#include "collectives/algorithms/algorithms.hpp"

namespace braid::collectives::detail {

asio::awaitable<void> message_all_reduce(CollectiveOp& op, Buffer input, Buffer output,
                                         ReduceOp reduce_op, Algorithm algorithm) {
  switch (algorithm) {
    case Algorithm::recursive_doubling:
      co_await recursive_doubling_all_reduce(op, input, output, reduce_op);
      co_return;
    case Algorithm::halving_doubling:
      co_await halving_doubling_all_reduce(op, input, output, reduce_op);
      co_return;
    default:
      co_await ring_all_reduce(op, input, output, reduce_op);
  }
}

}  // namespace braid::collectives::detail
