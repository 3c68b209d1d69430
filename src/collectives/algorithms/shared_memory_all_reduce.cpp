// Shared-memory all-reduce, for members on one node (shared_memory_arena.hpp). It starts
// as every shared-memory operation does (arena_turn.hpp: a turn, every rank's record
// posted and checked against the others'), then takes one of two paths, the same on
// every rank:
//
// Single copy (the members read each other's memory, cross_memory.hpp, the vector is
// 64 KiB or more, and rank 0's timings favour it for the size: SingleCopy in
// shared_memory_arena.hpp, path_timings.hpp; or every rank's buffers lie in one
// Communicator::allocate_shared allocation, which every rank maps):
//   1. each rank reduces its 1/P block of the vector, a piece at a time (claimed through
//      the block's counter in the arena): it reads every peer's piece into a cache-sized
//      scratch and folds it in (ranks in order 0..P-1, so the result does not depend on
//      who reduces), writing each finished piece into its own output and, while it is
//      still in cache, into every peer's output (process_vm_writev);
//   2. then, where blocks have several pieces or some rank says it computes
//      (Communicator::set_computing), it takes the pieces of other ranks' blocks that
//      nobody has claimed yet, and raises `reduced` when nothing is left to claim;
//   3. it returns once every rank has reduced: by then every block of its output has
//      arrived, and nobody reads or writes its buffers any more.
//   Why step 2: in data-parallel training the ranks reach a bucket's all-reduce at
//   different moments of their backward passes. With fixed shares, a rank that finished
//   its backward waited for the share of a rank still computing, which reduced it on a
//   core its own backward needed: that share was all exposed. Now the free rank reduces
//   most of the vector while the busy one computes (measured in docs/layers/collectives.md,
//   "Work-sharing reductions and the computing hint"). Whoever folds a piece, it is the same sum
//   bit for bit. In place works: piece j of every rank's buffer is read and written by the one rank
//   that claimed it, each piece written only after it was read for the last time.
//   Cost (P ranks, n bytes): 2 flag waits, and for each n/P bytes a rank reduces (its own
//   block, with ranks arriving together), (P-1)/P n bytes read from peers into cache, n/P
//   read from its own input, n written (n/P locally, the rest into peers): about 2n bytes
//   of memory traffic per rank, the same in total however the pieces are shared out; one
//   claim per piece. Reading the finished blocks back from the peers'
//   outputs instead took 2.5n and a third wait. Through cross-memory attach, each read and
//   write of a peer's piece is a system call that pins the peer's pages first; in mapped
//   memory the reduction reads peers' pieces where they are and writes with memcpy, no
//   system call, no pinning, and no scratch copy.
//
// Copy through the segment (otherwise), in chunks of one slot (2 MiB). Per chunk, each
// rank:
//   1. copies its chunk into its slot and raises `arrived`;
//   2. once every rank has arrived, reduces its 1/P of the chunk across all P slots into
//      the result area (slot order fixed) and raises `reduced`;
//   3. once every rank has reduced, copies the whole chunk's result out.
//   Cost: 2 n/C flag waits (C the slot size), and per rank n bytes copied in, n read and
//   n/P written to reduce, n copied out: about 5n bytes of memory traffic.
//
// Up to 16 KiB neither: the vectors go through the ranks' inline slots in one wait
// (shared_memory_small, shared_memory_inline.cpp), and never come here.
//
// Flags carry generations, so they never need resetting, and the waits order every reuse
// of records, slots and the result area.
#include <algorithm>
#include <cstring>

#include "collectives/algorithms/algorithms.hpp"
#include "collectives/algorithms/arena_turn.hpp"

namespace braid::collectives::detail {
namespace {

// Single copy's unit of work: pieces of a rank's block that any rank may claim, 256 KiB
// (fold_block's own piece, which it keeps in cache), or the whole block where that is
// less. A DDP bucket of MiBs gives a free rank dozens of pieces to take. Smaller pieces
// cost more than they balance: each is a claim (a compare-and-swap on a line the ranks
// share, a cache miss where a peer claimed last) and a fold's setup. Mapped all-reduces
// on 2 ranks, alternating runs: with 64 KiB pieces 256 KiB took 3.8-4.8 us against
// 3.4-4.1 with fixed shares, 512 KiB 8.9-13.2 against 7.7-10.4; with 16 KiB pieces
// 64 KiB took 4.3-4.9 us against 4.0. Through cross-memory attach a piece is a system
// call per peer each way. The same on every rank: it depends on the vector's length and
// the world alone.
std::size_t claim_elements(const EvenSplit& blocks, std::size_t element) {
  constexpr std::size_t kPieceBytes = std::size_t{256} << 10;
  return std::max<std::size_t>(1, std::min(blocks.size(0), kPieceBytes / element));
}

asio::awaitable<void> single_copy(ArenaTurn& turn, CollectiveOp& op, Buffer input, Buffer output,
                                  ReduceOp reduce_op) {
  SharedMemoryArena& arena = turn.arena();
  const int world = op.size();
  const int me = op.rank();
  const std::size_t element = dtype_size(input.dtype());
  const EvenSplit blocks{input.count(), static_cast<std::size_t>(world)};
  const std::size_t unit = claim_elements(blocks, element);
  auto pieces_of = [&](int r) {
    return (blocks.size(static_cast<std::size_t>(r)) + unit - 1) / unit;
  };
  // Leave the work to free ranks while this one computes (Communicator::set_computing),
  // as long as there is work left and a free rank still in the reduction to take it.
  // (`deferred`, in the trace: it computed while another rank was free.)
  bool deferred = arena.computing_here() && arena.some_peer_free();
  auto deferring = [&] {
    if (!arena.computing_here() || !arena.some_peer_free(turn.generation())) return false;
    deferred = true;
    for (int r = 0; r < world; ++r) {
      if (turn.claimed(r) < pieces_of(r)) return true;
    }
    return false;
  };
  auto* out = static_cast<std::byte*>(output.data());
  trace::AsyncSpan reduce = op.phase("shared_memory.reduce");
  std::size_t folded = 0;
  std::int64_t taken = 0;  // pieces of other ranks' blocks
  // Our own block first, then, in turn, whatever the others have not yet claimed of
  // theirs. Checked again before each piece: a rank that starts computing stops taking.
  // Others' blocks only where there is something to balance: blocks of several pieces,
  // or a rank that says it computes. A block of one piece is its owner's otherwise, and
  // the look at each peer's counter is a cache miss (64-256 KiB all-reduces took 0.05-0.2
  // us longer with it). A rank that defers waits only while a free rank is still in the
  // reduction, so a block nobody else took comes back to its owner.
  const int owners = pieces_of(0) > 1 || arena.any_computing() ? world : 1;
  for (int step = 0; step < owners;) {
    if (deferring()) {
      const trace::AsyncSpan wait = op.waiting("shared_memory.defer");
      co_await op.poll_until([&] { return !deferring(); }, "the free ranks' reduction", kSpinWindow,
                             arena.crowded(), arena.armed_doorbell());
    }
    const int owner = (me + step) % world;
    const std::optional<std::size_t> piece = turn.claim_piece(owner, pieces_of(owner));
    if (!piece) {
      ++step;
      continue;
    }
    const auto r = static_cast<std::size_t>(owner);
    const std::size_t first = blocks.offset(r) + *piece * unit;
    const std::size_t n = std::min(unit, blocks.offset(r) + blocks.size(r) - first);
    fold_block(turn, op, input, first, n, reduce_op,
               {.local = out + first * element, .every_peer = true});
    folded += n * element;
    if (owner != me) ++taken;
  }
  reduce.set_bytes(folded);
  if (taken != 0) reduce.arg("taken", taken);
  if (deferred) reduce.arg("deferred", 1);
  reduce.end();
  turn.raise(Stage::reduced);
  co_await turn.wait_all(Stage::reduced, "every rank's share of the reduction");
}

asio::awaitable<void> copy_through_segment(ArenaTurn& turn, CollectiveOp& op, Buffer input,
                                           Buffer output, ReduceOp reduce_op) {
  SharedMemoryArena& arena = turn.arena();
  const int world = op.size();
  const int me = op.rank();
  const DType dtype = input.dtype();
  const std::size_t element = dtype_size(dtype);
  const std::size_t chunk_elements = SharedMemoryArena::kSlotBytes / element;
  for (std::size_t offset = 0; offset < input.count(); offset += chunk_elements) {
    const std::size_t n = std::min(chunk_elements, input.count() - offset);
    const trace::AsyncSpan chunk = op.phase("shared_memory.chunk", n * element);
    turn.next_chunk();
    std::memcpy(arena.slot(me), static_cast<const std::byte*>(input.data()) + offset * element,
                n * element);
    turn.raise(Stage::arrived);
    co_await turn.wait_all(Stage::arrived, "every rank's copy into shared memory");
    const EvenSplit parts{n, static_cast<std::size_t>(world)};
    const std::size_t first = parts.offset(static_cast<std::size_t>(me));
    const std::size_t length = parts.size(static_cast<std::size_t>(me));
    auto part_of = [&](std::byte* base) { return Buffer(base + first * element, length, dtype); };
    if (length != 0) {
      const Buffer result = part_of(arena.result());
      combine(result, part_of(arena.slot(0)), part_of(arena.slot(1)), reduce_op);
      for (int r = 2; r < world; ++r) combine(result, result, part_of(arena.slot(r)), reduce_op);
      finish_average(result, reduce_op, world);
    }
    turn.raise(Stage::reduced);
    co_await turn.wait_all(Stage::reduced, "every rank's share of the reduction");
    std::memcpy(static_cast<std::byte*>(output.data()) + offset * element, arena.result(),
                n * element);
  }
}

}  // namespace

asio::awaitable<void> shared_memory_all_reduce(CollectiveOp& op, const CollectiveCall& call) {
  ArenaTurn turn(op, *call.arena, call.arena_ticket);
  co_await turn.start();
  if (op.size() == 1) {
    copy(call.output, call.input);
    turn.finish();
    co_return;
  }
  co_await turn.post(fingerprint_of(call), call.input, call.output);
  if (turn.mapped() || turn.all_reduce_reads_peers()) {
    co_await single_copy(turn, op, call.input, call.output, call.reduce_op);
  } else {
    co_await copy_through_segment(turn, op, call.input, call.output, call.reduce_op);
  }
  turn.all_reduce_done(call.input.size_bytes());
  turn.finish();
}

}  // namespace braid::collectives::detail
