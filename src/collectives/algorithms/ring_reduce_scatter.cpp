// Ring reduce-scatter: the first half of ring all-reduce (ring_phases.hpp). Rank r ends
// with block r reduced.
//
// Cost (P ranks, n bytes of input per rank): P-1 steps of n/P bytes:
//   time ~ (P-1) alpha + (P-1)/P n beta + (P-1)/P n gamma
// Out of place the running partials of other ranks' blocks live in two scratch blocks
// (2n/P); in place they live in the caller's buffer, whose other blocks are then
// unspecified, as with MPI_Reduce_scatter_block.
#include "collectives/algorithms/algorithms.hpp"
#include "collectives/algorithms/ring_phases.hpp"

namespace braid::collectives::detail {

asio::awaitable<void> ring_reduce_scatter(CollectiveOp& op, Buffer input, Buffer output,
                                          ReduceOp reduce_op) {
  const int world = op.size();
  const int rank = op.rank();
  const RingLayout layout(input.count(), world, input.dtype());
  const Buffer in = input;
  const Buffer out = output;
  const bool in_place = out.data() == layout.block(in, rank).data();
  if (world == 1) {
    copy(out, in);
    co_return;
  }
  const std::size_t block_bytes = out.size_bytes();
  ScratchPool::Lease partials = op.scratch(in_place ? 0 : 2 * block_bytes);
  const DType dtype = in.dtype();
  const PartialBlock partial = [&](int block, int step) {
    if (in_place) return layout.block(in, block);
    if (layout.wrap(block) == static_cast<std::size_t>(rank)) return out;
    return Buffer(partials.data() + static_cast<std::size_t>(step % 2) * block_bytes, out.count(),
                  dtype);
  };
  co_await ring_reduce_scatter_phase(op, in, layout, reduce_op, partial, 0);
  finish_average(out, reduce_op, world);
}

}  // namespace braid::collectives::detail
