// Binomial-tree reduce: the broadcast tree run backwards. In round i, a rank whose
// relative number has bit i set sends its partial to the rank 2^i below and is done; the
// others receive from the rank 2^i above (if any) and combine.
//
// Cost (P ranks, n bytes): ceil(log2 P) rounds:
//   time ~ ceil(log2 P) (alpha + n beta + n gamma)
// The root receives and combines log2(P) vectors. Non-roots keep their partial in
// scratch, so their buffers are left as they were. Scratch: 2n (root: n).
#include "collectives/algorithms/algorithms.hpp"

namespace braid::collectives::detail {

asio::awaitable<void> binomial_tree_reduce(CollectiveOp& op, Buffer input, Buffer output,
                                           ReduceOp reduce_op, int root) {
  const int world = op.size();
  const int relative = (op.rank() - root + world) % world;
  const Buffer in = input;
  ScratchPool::Lease partial_memory = op.scratch(relative == 0 ? 0 : in.size_bytes());
  const Buffer partial = relative == 0 ? output : partial_memory.buffer(in.dtype(), in.count());
  copy(partial, in);
  ScratchPool::Lease arrived_memory = op.scratch(in.size_bytes());
  const Buffer arrived = arrived_memory.buffer(in.dtype(), in.count());
  std::uint32_t round = 0;
  for (int bit = 1; bit < world; bit <<= 1, ++round) {
    if ((relative & bit) != 0) {
      Message sent = op.send((relative - bit + root) % world, partial, round);
      co_await op.wait(sent);
      co_return;
    }
    if (relative + bit < world) {
      Message received = op.recv((relative + bit + root) % world, arrived, round);
      co_await op.wait(received);
      combine(partial, partial, arrived, reduce_op);
    }
  }
  finish_average(partial, reduce_op, world);  // only the root gets here
}

}  // namespace braid::collectives::detail
