// Ring all-gather: the second half of ring all-reduce (ring_phases.hpp), with blocks of
// any sizes (all_gather_v).
//
// Cost (P ranks, n bytes of output per rank): P-1 steps:
//   time ~ (P-1) alpha + (P-1)/P n beta
// Every rank sends and receives (P-1)/P n bytes, the least possible; blocks land directly
// in the output, so there is no scratch and no copy besides this rank's own block.
#include "collectives/algorithms/algorithms.hpp"
#include "collectives/algorithms/ring_phases.hpp"

namespace braid::collectives::detail {

asio::awaitable<void> ring_all_gather(CollectiveOp& op, Buffer input, Buffer output,
                                      std::span<const std::size_t> counts) {
  const RingLayout layout(counts, output.dtype());
  const Buffer out = output;
  copy(layout.block(out, op.rank()), input);
  co_await ring_all_gather_phase(op, out, layout, 0);
}

}  // namespace braid::collectives::detail
