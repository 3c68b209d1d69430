// Ring all-reduce: a ring reduce-scatter, then a ring all-gather (ring_phases.hpp), each
// block cut into ~256 KiB pieces that are pipelined around the ring.
//
// Cost (P ranks, n bytes): 2(P-1) steps, each moving n/P bytes per rank:
//   time ~ 2(P-1) alpha + 2 (P-1)/P n beta + (P-1)/P n gamma
// Bandwidth-optimal: every rank sends and receives 2(P-1)/P n bytes, the least any
// all-reduce can, so it wins for large vectors; its 2(P-1) latency terms lose to
// recursive doubling's log2(P) for small ones. Every block is reduced at one rank and then
// copied, so all ranks end bit-identical. Scratch: 2n/P.
#include "collectives/algorithms/algorithms.hpp"
#include "collectives/algorithms/ring_phases.hpp"

namespace braid::collectives::detail {

asio::awaitable<void> ring_all_reduce(CollectiveOp& op, Buffer input, Buffer output,
                                      ReduceOp reduce_op) {
  if (op.size() == 1) {
    copy(output, input);
    co_return;
  }
  const RingLayout layout(input.count(), op.size(), input.dtype());
  const Buffer out = output;
  const PartialBlock partial = [&layout, out](int block, int) { return layout.block(out, block); };
  co_await ring_reduce_scatter_phase(op, input, layout, reduce_op, partial, 0);
  finish_average(layout.block(out, op.rank()), reduce_op, op.size());
  const auto first_step =
      static_cast<std::uint32_t>(static_cast<std::size_t>(op.size() - 1) * layout.pieces());
  co_await ring_all_gather_phase(op, out, layout, first_step);
}

}  // namespace braid::collectives::detail
