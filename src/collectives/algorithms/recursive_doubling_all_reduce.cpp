// Recursive doubling all-reduce: in round i every rank swaps its whole vector with the
// rank 2^i away and combines the two.
//
// Cost (P ranks, n bytes; p2 the power of two <= P):
//   time ~ log2(p2) (alpha + n beta + n gamma), plus 2 (alpha + n beta) when P is not a
//   power of two (power_of_two_fold.hpp)
// The fewest rounds of any all-reduce, so it wins while messages are latency-bound (a
// few KiB); it moves n log2(P) bytes per rank, so it loses to ring and halving-doubling
// beyond. Both partners combine the same two vectors, and every operator is commutative
// bit for bit (IEEE a+b == b+a), so all ranks end bit-identical. Scratch: n.
#include "collectives/algorithms/algorithms.hpp"
#include "collectives/algorithms/power_of_two_fold.hpp"

namespace braid::collectives::detail {

asio::awaitable<void> recursive_doubling_all_reduce(CollectiveOp& op, Buffer input, Buffer output,
                                                    ReduceOp reduce_op) {
  const Buffer data = output;
  copy(data, input);
  const PowerOfTwoFold fold(op.rank(), op.size());
  co_await fold_in(op, fold, data, reduce_op);
  if (fold.new_rank >= 0) {
    ScratchPool::Lease scratch = op.scratch(data.size_bytes());
    const Buffer arrived = scratch.buffer(data.dtype(), data.count());
    std::uint32_t step = 1;
    for (int distance = 1; distance < fold.power; distance <<= 1, ++step) {
      const int partner = fold.rank_of(fold.new_rank ^ distance);
      Message received = op.recv(partner, arrived, step);
      Message sent = op.send(partner, data, step);
      co_await op.wait(sent);
      co_await op.wait(received);
      combine(data, data, arrived, reduce_op);
    }
    finish_average(data, reduce_op, op.size());
  }
  co_await fold_out(op, fold, data, static_cast<std::uint32_t>(fold.rounds() + 1));
}

}  // namespace braid::collectives::detail
