// Work sharing in a single-copy all-reduce (arena_turn.hpp, shared_memory_all_reduce.cpp):
// the claim counters through which any rank takes the next piece of any block, and
// fold_block, the P-way fold of a piece in rank order, the same whoever does it.
#include <algorithm>
#include <atomic>

#include <braid/core/enforce.hpp>

#include "collectives/algorithms/arena_turn.hpp"

namespace braid::collectives::detail {
namespace {

// fold_block reads peers' elements in pieces this size, so the reduction reads them from
// cache (two pieces and the output's piece stay well inside a 2 MiB L2).
constexpr std::size_t kFoldPieceBytes = std::size_t{256} << 10;

// A claim counter holds the generation's low 40 bits above the number of pieces claimed
// (24 bits): a value tagged with an earlier generation means none claimed yet. No rank
// claims in the next operation before every rank has posted it, which each does only
// after its last claim in this one, so a counter never holds a later generation.
constexpr int kClaimIndexBits = 24;
constexpr std::uint64_t kClaimIndexMask = (std::uint64_t{1} << kClaimIndexBits) - 1;

std::uint64_t claimed_in(std::uint64_t counter, std::uint64_t generation) noexcept {
  return (counter & ~kClaimIndexMask) == generation << kClaimIndexBits ? counter & kClaimIndexMask
                                                                       : 0;
}

}  // namespace

std::size_t ArenaTurn::claimed(int owner) noexcept {
  return claimed_in(arena_.claims(owner).load(std::memory_order_relaxed), generation_);
}

std::optional<std::size_t> ArenaTurn::claim_piece(int owner, std::size_t pieces) {
  BRAID_ENFORCE(pieces <= kClaimIndexMask, "an all-reduce block of {} pieces", pieces);
  const std::uint64_t tag = generation_ << kClaimIndexBits;
  std::atomic_ref<std::uint64_t> counter = arena_.claims(owner);
  std::uint64_t seen = counter.load(std::memory_order_relaxed);
  for (;;) {
    const std::uint64_t claimed = claimed_in(seen, generation_);
    if (claimed >= pieces) return std::nullopt;
    if (counter.compare_exchange_weak(seen, tag | (claimed + 1), std::memory_order_relaxed)) {
      return claimed;
    }
  }
}

void fold_block(ArenaTurn& turn, CollectiveOp& op, const Buffer& input, std::size_t first,
                std::size_t count, ReduceOp reduce_op, const FoldTarget& target) {
  const int world = op.size();
  const int me = op.rank();
  const DType dtype = input.dtype();
  const std::size_t element = dtype_size(dtype);
  const std::size_t piece_elements = kFoldPieceBytes / element;
  // Two landing pieces, and a third for the result when it has no place of ours.
  ScratchPool::Lease scratch =
      op.scratch((target.local == nullptr ? 3 : 2) * piece_elements * element);
  std::byte* const landing[2] = {scratch.data(), scratch.data() + piece_elements * element};
  std::byte* const result = scratch.data() + 2 * piece_elements * element;
  const auto* in = static_cast<const std::byte*>(input.data());
  for (std::size_t done = 0; done < count; done += piece_elements) {
    const std::size_t n = std::min(piece_elements, count - done);
    const std::size_t at = (first + done) * element;
    // Rank r's piece: our own input, a peer's through our mapping of it, or a peer's
    // read into landing[which].
    auto piece = [&](int r, int which) -> std::byte* {
      if (r == me) return const_cast<std::byte*>(in + at);
      if (turn.mapped()) return const_cast<std::byte*>(turn.mapped_input(r) + at);
      turn.read_input(r, at, landing[which], n * element);
      return landing[which];
    };
    std::byte* const destination = target.local != nullptr ? target.local + done * element : result;
    // Accumulate in landing[0] up to the last rank, whose fold writes the destination: an
    // in-place output is our input, read for the last time in that same fold.
    // The last fold divides an average as it writes.
    std::byte* accumulated = piece(0, 0);
    for (int r = 1; r < world; ++r) {
      std::byte* next = piece(r, 1);
      const Buffer a(accumulated, n, dtype), b(next, n, dtype);
      if (r == world - 1) {
        combine_and_finish(Buffer(destination, n, dtype), a, b, reduce_op, world);
      } else {
        combine(Buffer(landing[0], n, dtype), a, b, reduce_op);
      }
      accumulated = landing[0];
    }
    if (target.root >= 0 && target.root != me) {
      turn.write_output(target.root, at, destination, n * element);
    }
    if (target.every_peer) {
      // Only we read or write these elements of any rank's buffers (each piece is folded
      // by the one rank that claimed it): a peer's in-place input here was read above,
      // for the last time.
      for (int step = 1; step < world; ++step) {
        turn.write_output((me + step) % world, at, destination, n * element);
      }
    }
  }
}

}  // namespace braid::collectives::detail
