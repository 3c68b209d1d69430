// The two halves of every ring algorithm, shared by ring all-reduce (both), ring
// reduce-scatter (the first) and ring all-gather (the second).
//
// The vector is cut into P blocks, one per rank; each block into `pieces` pieces that
// travel as separate messages, so that a rank reduces or forwards piece k while piece
// k+1 is still on the wire (the pipelining that keeps a ring near link speed). Pieces
// are about ring_piece_bytes() (BRAID_RING_PIECE_KIB); fewer, larger ones when a whole operation
// would otherwise need more message steps than the tag holds.
//
// Reduce-scatter phase: P-1 steps. At step s rank r sends block r-s-1 (its input at step
// 0, its running partial after) to rank r+1 and receives block r-s-2 from rank r-1, which
// it combines with its own input of that block. After the last step rank r holds block r
// fully reduced.
// All-gather phase: P-1 steps. At step t rank r sends block r-t (its own first, then what
// it received) to r+1 and receives block r-t-1 from r-1, straight into the output.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include <boost/asio/awaitable.hpp>

#include <braid/core/buffer.hpp>
#include <braid/core/reduce_op.hpp>

#include "collectives/collective_op.hpp"

namespace braid::collectives::detail {

// The pipelining granule: BRAID_RING_PIECE_KIB, read once.
std::size_t ring_piece_bytes();

class RingLayout {
 public:
  // Blocks of counts[b] elements, consecutive in rank order.
  RingLayout(std::span<const std::size_t> counts, DType dtype);
  // `count` elements cut into P nearly equal blocks.
  RingLayout(std::size_t count, int world_size, DType dtype);

  int blocks() const noexcept { return static_cast<int>(counts_.size()); }
  std::size_t pieces() const noexcept { return pieces_; }
  std::size_t block_count(int block) const { return counts_[wrap(block)]; }
  std::size_t max_block_count() const noexcept { return max_count_; }
  // Block `block` (taken modulo P) of a buffer holding all blocks.
  Buffer block(const Buffer& whole, int block) const;
  // Piece k of one block's buffer.
  Buffer piece(const Buffer& block, std::size_t k) const;
  std::size_t wrap(int block) const noexcept;

 private:
  void choose_pieces(DType dtype);

  std::vector<std::size_t> counts_;
  std::vector<std::size_t> offsets_;
  std::size_t max_count_ = 0;
  std::size_t pieces_ = 1;
};

// Where the running partial of `block` is kept once step `step` has reduced it. It must
// stay untouched until the next step's send of it completes (the step after next).
using PartialBlock = std::function<Buffer(int block, int step)>;

// Steps first_step .. first_step + (P-1) * pieces - 1 carry the phase's messages.
asio::awaitable<void> ring_reduce_scatter_phase(CollectiveOp& op, const Buffer& input,
                                                const RingLayout& layout, ReduceOp reduce_op,
                                                const PartialBlock& partial,
                                                std::uint32_t first_step);
// `output` holds this rank's block already; the others arrive.
asio::awaitable<void> ring_all_gather_phase(CollectiveOp& op, const Buffer& output,
                                            const RingLayout& layout, std::uint32_t first_step);

}  // namespace braid::collectives::detail
