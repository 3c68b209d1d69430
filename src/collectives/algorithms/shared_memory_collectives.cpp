// The other collectives through shared memory, for members on one node whose kernel lets
// them read each other's memory (single copy, arena_turn.hpp). Each starts as every
// shared-memory operation does (a turn; every rank's record posted and checked), moves
// each byte once with cross-memory reads, and ends when every rank is done reading
// (release), so buffers may be reused. Costs (P ranks, n bytes per rank's block):
//   broadcast       each non-root reads the root's n bytes;
//   all_gather      each rank reads (P-1) blocks;
//   gather/scatter  the root reads (P-1) blocks / each non-root reads its block;
//   reduce_scatter  each rank folds its block of every input, peers' read into cache:
//                   (P-1) n read, n written;
//   reduce          as all-reduce's first step, each rank folding 1/P of the vector and
//                   writing it into the root's output: the root does not reduce alone;
//   all_to_all      each rank reads its block from every peer; in place, into scratch
//                   first, with one extra wait before anyone overwrites what others read.
// Two waits each (posted, released), three for all_to_all, and one system call per block
// moved: against the message algorithms they replace, every byte crosses memory once
// instead of twice through UCX's shared-memory FIFO.
//
// Where the members cannot read each other's memory (the kernel forbids it, or
// BRAID_SHM_SINGLE_COPY=0), and for the variable-count forms, these return false
// without touching the arena and the Communicator runs the message algorithm.
#include <cstring>

#include "algorithms.hpp"
#include "arena_turn.hpp"

namespace braid::collectives::detail {
namespace {

std::byte* bytes_of(const Buffer& buffer) {
  return static_cast<std::byte*>(buffer.data());
}

asio::awaitable<void> run_single_copy(ArenaTurn& turn, CollectiveOp& op,
                                      const CollectiveCall& call) {
  const int world = op.size();
  const int me = op.rank();
  const int root = call.root;
  using enum CollectiveKind;
  switch (call.kind) {
    case broadcast:
      if (me != root && call.output.size_bytes() != 0) {
        turn.read_output(root, 0, call.output.data(), call.output.size_bytes());
      }
      break;
    case all_gather: {
      const std::size_t block = call.input.size_bytes();
      for (int step = 1; step < world; ++step) {
        const int peer = (me + step) % world;
        turn.read_input(peer, 0, bytes_of(call.output) + peer * block, block);
      }
      copy(call.output.slice(me * call.input.count(), call.input.count()), call.input);
      break;
    }
    case gather:
      if (me == root) {
        const std::size_t block = call.input.size_bytes();
        for (int peer = 0; peer < world; ++peer) {
          if (peer != me) turn.read_input(peer, 0, bytes_of(call.output) + peer * block, block);
        }
        copy(call.output.slice(me * call.input.count(), call.input.count()), call.input);
      }
      break;
    case scatter: {
      const std::size_t block = call.output.size_bytes();
      if (me == root) {
        copy(call.output, call.input.slice(me * call.output.count(), call.output.count()));
      } else {
        turn.read_input(root, me * block, call.output.data(), block);
      }
      break;
    }
    case reduce_scatter: {
      const std::size_t count = call.output.count();
      fold_block(turn, op, call.input, static_cast<std::size_t>(me) * count, count, call.reduce_op,
                 bytes_of(call.output), -1);
      break;
    }
    case reduce: {
      const EvenSplit blocks{call.input.count(), static_cast<std::size_t>(world)};
      const std::size_t first = blocks.offset(static_cast<std::size_t>(me));
      fold_block(
          turn, op, call.input, first, blocks.size(static_cast<std::size_t>(me)), call.reduce_op,
          me == root ? bytes_of(call.output) + first * dtype_size(call.input.dtype()) : nullptr,
          root);
      break;
    }
    case all_to_all: {
      const std::size_t block = call.input.size_bytes() / static_cast<std::size_t>(world);
      const bool in_place = call.input.data() == call.output.data();
      // In place, peers still read our blocks while we gather theirs: land them in scratch
      // and overwrite only once every rank has read.
      ScratchPool::Lease landing;
      if (in_place) landing = op.scratch(call.input.size_bytes());
      std::byte* into = in_place ? landing.data() : bytes_of(call.output);
      for (int step = 1; step < world; ++step) {
        const int peer = (me + step) % world;
        turn.read_input(peer, me * block, into + peer * block, block);
      }
      if (!in_place) std::memcpy(into + me * block, bytes_of(call.input) + me * block, block);
      turn.raise(Stage::reduced);
      co_await turn.wait_all(Stage::reduced, "every rank's reads of the blocks");
      if (in_place) {
        for (int peer = 0; peer < world; ++peer) {
          if (peer != me)
            std::memcpy(bytes_of(call.output) + peer * block, into + peer * block, block);
        }
      }
      break;
    }
    default:
      BRAID_ENFORCE(false, "{} has no shared-memory algorithm", to_string(call.kind));
  }
  co_await turn.release();
}

}  // namespace

asio::awaitable<bool> shared_memory_collective(CollectiveOp& op, const CollectiveCall& call) {
  ArenaTurn turn(op, *call.arena, call.arena_ticket);
  co_await turn.start();
  // Every rank reaches the same answer: single copy was agreed by all, and the variable
  // forms are part of the call every rank makes.
  if (op.size() == 1 || !turn.single_copy() || call.variable) {
    turn.finish();
    co_return false;
  }
  const trace::AsyncSpan moved = op.phase("shared_memory.single_copy", call.bytes);
  co_await turn.post(fingerprint_of(call), call.input, call.output);
  co_await run_single_copy(turn, op, call);
  turn.finish();
  co_return true;
}

}  // namespace braid::collectives::detail
