#include "collectives/algorithms/ring_phases.hpp"

#include <algorithm>

#include <braid/core/config.hpp>

namespace braid::collectives::detail {

std::size_t ring_piece_bytes() {
  static const std::size_t bytes = config::kib_value("BRAID_RING_PIECE_KIB", 1, 1 << 20);
  return bytes;
}

RingLayout::RingLayout(std::span<const std::size_t> counts, DType dtype)
    : counts_(counts.begin(), counts.end()) {
  std::size_t offset = 0;
  for (std::size_t count : counts_) {
    offsets_.push_back(offset);
    offset += count;
    max_count_ = std::max(max_count_, count);
  }
  choose_pieces(dtype);
}

RingLayout::RingLayout(std::size_t count, int world_size, DType dtype) {
  const EvenSplit split{count, static_cast<std::size_t>(world_size)};
  for (std::size_t b = 0; b < split.parts; ++b) {
    counts_.push_back(split.size(b));
    offsets_.push_back(split.offset(b));
  }
  max_count_ = split.size(0);
  choose_pieces(dtype);
}

void RingLayout::choose_pieces(DType dtype) {
  const std::size_t steps = counts_.size() > 1 ? 2 * (counts_.size() - 1) : 1;
  const std::size_t most = std::max<std::size_t>(1, kAlgorithmSteps / steps);
  const std::size_t bytes = max_count_ * dtype_size(dtype);
  const std::size_t piece = ring_piece_bytes();
  pieces_ = std::clamp<std::size_t>((bytes + piece - 1) / piece, 1, most);
  // Never more pieces than elements, so no piece is empty for lack of data.
  pieces_ = std::max<std::size_t>(1, std::min(pieces_, max_count_));
}

std::size_t RingLayout::wrap(int block) const noexcept {
  const int p = blocks();
  return static_cast<std::size_t>(((block % p) + p) % p);
}

Buffer RingLayout::block(const Buffer& whole, int block) const {
  const std::size_t b = wrap(block);
  return whole.slice(offsets_[b], counts_[b]);
}

Buffer RingLayout::piece(const Buffer& block, std::size_t k) const {
  const EvenSplit split{block.count(), pieces_};
  return block.slice(split.offset(k), split.size(k));
}

asio::awaitable<void> ring_reduce_scatter_phase(CollectiveOp& op, const Buffer& input,
                                                const RingLayout& layout, ReduceOp reduce_op,
                                                const PartialBlock& partial,
                                                std::uint32_t first_step) {
  const int world = op.size();
  const int rank = op.rank();
  if (world == 1) co_return;
  const trace::AsyncSpan phase = op.phase("ring.reduce_scatter", input.size_bytes());
  const int right = (rank + 1) % world;
  const int left = (rank + world - 1) % world;
  const std::size_t pieces = layout.pieces();
  const DType dtype = input.dtype();
  const std::size_t block_bytes = layout.max_block_count() * dtype_size(dtype);

  // Two landing areas for incoming partials: step s+1's receives are posted into one
  // while step s's are reduced out of the other.
  ScratchPool::Lease scratch = op.scratch(2 * block_bytes);
  auto landing = [&](int step, int block) {
    return Buffer(scratch.data() + static_cast<std::size_t>(step % 2) * block_bytes,
                  layout.block_count(block), dtype);
  };
  // A local copy: lambdas in a coroutine must not capture its by-value parameters (GCC 12
  // can bind them to the caller's copy; docs/layers/core.md, "Coroutine pitfalls").
  const std::uint32_t base_step = first_step;
  auto message_step = [&](int step, std::size_t piece) {
    return base_step + static_cast<std::uint32_t>(static_cast<std::size_t>(step) * pieces + piece);
  };

  std::vector<Message> receiving;
  std::vector<Message> next_receiving;
  std::vector<Message> sending;
  std::vector<Message> next_sending;
  auto post_receives = [&](int step, std::vector<Message>& into) {
    const int block = rank - step - 2;
    const Buffer area = landing(step, block);
    for (std::size_t k = 0; k < pieces; ++k) {
      into.push_back(op.recv(left, layout.piece(area, k), message_step(step, k)));
    }
  };

  post_receives(0, receiving);
  const Buffer first = layout.block(input, rank - 1);
  for (std::size_t k = 0; k < pieces; ++k) {
    sending.push_back(op.send(right, layout.piece(first, k), message_step(0, k)));
  }
  for (int step = 0; step < world - 1; ++step) {
    const bool last = step == world - 2;
    if (!last) post_receives(step + 1, next_receiving);
    const int block = rank - step - 2;
    const Buffer mine = layout.block(input, block);
    const Buffer arrived = landing(step, block);
    const Buffer result = partial(block, step);
    for (std::size_t k = 0; k < pieces; ++k) {
      co_await op.wait(receiving[k]);
      const Buffer piece = layout.piece(result, k);
      combine(piece, layout.piece(mine, k), layout.piece(arrived, k), reduce_op);
      if (!last) next_sending.push_back(op.send(right, piece, message_step(step + 1, k)));
    }
    co_await op.wait_all(sending);
    sending = std::move(next_sending);
    next_sending.clear();
    receiving = std::move(next_receiving);
    next_receiving.clear();
  }
}

asio::awaitable<void> ring_all_gather_phase(CollectiveOp& op, const Buffer& output,
                                            const RingLayout& layout, std::uint32_t first_step) {
  const int world = op.size();
  const int rank = op.rank();
  if (world == 1) co_return;
  const trace::AsyncSpan phase = op.phase("ring.all_gather", output.size_bytes());
  const int right = (rank + 1) % world;
  const int left = (rank + world - 1) % world;
  const std::size_t pieces = layout.pieces();
  // A local copy: lambdas in a coroutine must not capture its by-value parameters (GCC 12
  // can bind them to the caller's copy; docs/layers/core.md, "Coroutine pitfalls").
  const std::uint32_t base_step = first_step;
  auto message_step = [&](int step, std::size_t piece) {
    return base_step + static_cast<std::uint32_t>(static_cast<std::size_t>(step) * pieces + piece);
  };

  // Every block lands in its own place in the output, so all receives go up at once.
  std::vector<Message> receiving;
  receiving.reserve(static_cast<std::size_t>(world - 1) * pieces);
  for (int step = 0; step < world - 1; ++step) {
    const Buffer block = layout.block(output, rank - step - 1);
    for (std::size_t k = 0; k < pieces; ++k) {
      receiving.push_back(op.recv(left, layout.piece(block, k), message_step(step, k)));
    }
  }
  std::vector<Message> sending;
  sending.reserve(static_cast<std::size_t>(world - 1) * pieces);
  const Buffer own = layout.block(output, rank);
  for (std::size_t k = 0; k < pieces; ++k) {
    sending.push_back(op.send(right, layout.piece(own, k), message_step(0, k)));
  }
  for (int step = 0; step < world - 1; ++step) {
    const Buffer block = layout.block(output, rank - step - 1);
    for (std::size_t k = 0; k < pieces; ++k) {
      co_await op.wait(receiving[static_cast<std::size_t>(step) * pieces + k]);
      if (step + 1 < world - 1) {
        sending.push_back(op.send(right, layout.piece(block, k), message_step(step + 1, k)));
      }
    }
  }
  co_await op.wait_all(sending);
}

}  // namespace braid::collectives::detail
