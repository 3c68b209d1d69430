// The other collectives through shared memory, for members on one node whose kernel lets
// them read each other's memory (single copy, arena_turn.hpp). Each starts as every
// shared-memory operation does (a turn; every rank's record posted and checked), moves
// each byte once with cross-memory reads, and ends when every rank is done reading
// (release), so buffers may be reused. Costs (P ranks, n bytes per rank's block):
//   broadcast       each non-root reads the root's n bytes;
//   all_gather      each rank writes its block into the (P-1) peers' outputs;
//   gather/scatter  each non-root writes its block into the root / reads its block from it;
//   reduce_scatter  each rank folds its block of every input, peers' read into cache:
//                   (P-1) n read, n written;
//   reduce          as all-reduce's first step, each rank folding 1/P of the vector and
//                   writing it into the root's output: the root does not reduce alone;
//   all_to_all      each rank reads its block from every peer; in place, into scratch
//                   first, with one extra wait before anyone overwrites what others read.
//   all_gather_v    as all_gather, with each rank's own count (the counts are part of
//                   the fingerprint, so every rank checks them before reading);
//   all_to_all_v    each rank reads every sender's counts (P-1 reads of P words) to find
//                   its piece, checks them against its receive counts, and the ranks agree
//                   on the verdict (one wait) before each reads its pieces.
// Two waits each (posted, released), three for all_to_all and all_to_all_v, and one system
// call per block moved: against the message algorithms they replace, every byte crosses
// memory once instead of twice through UCX's shared-memory FIFO.
//
// all_to_all_v is selected for its largest possible size (communicator.cpp), since ranks'
// sizes differ, so on one node it always comes here. It first posts into the inline slots
// (shared_memory_inline.cpp): every rank's counts, and its input where counts and input fit
// a slot. If every rank's fitted, that one wait did it all (2 ranks on the dev VM: 3.5 ->
// 0.45 us for small inputs; 4 ranks on 2 cores: 24-31 -> 4.4 us); otherwise it goes on by
// single copy.
//
// Small all-gathers, reduce-scatters and all-to-alls (equal counts) take the inline slots
// instead, in one wait, and never come here (shared_memory_small, shared_memory_inline.cpp);
// only where single copy was agreed, so that a rank whose counts differ, and so takes this
// path, still meets the others in the arena and the mismatch fails on every rank at once.
// Small broadcasts, reduces, gathers and scatters go through the inline slots one way
// there: only the receiving end waits.
//
// Where the members cannot read each other's memory (the kernel forbids it, or
// BRAID_SHM_SINGLE_COPY=0), they give up their turn without touching the arena and run
// the message algorithm, as shared_memory_small does.
#include <cstring>
#include <numeric>
#include <vector>

#include <fmt/format.h>

#include <braid/core/error.hpp>

#include "collectives/algorithms/algorithms.hpp"
#include "collectives/algorithms/arena_turn.hpp"

namespace braid::collectives::detail {
namespace {

std::byte* bytes_of(const Buffer& buffer) {
  return static_cast<std::byte*>(buffer.data());
}

std::size_t sum_before(std::span<const std::size_t> counts, std::size_t end) {
  return std::accumulate(counts.begin(), counts.begin() + static_cast<std::ptrdiff_t>(end),
                         std::size_t{0});
}

// Rank r's count lands at the sum of the counts before r, in rank order. Each rank reads
// the others' blocks rather than writing its own into them, as all_gather does: with
// uneven counts a writer's work is its own count times P-1, so the rank with the largest
// block holds up the rest, while a reader's is the total less its own, about even
// (2 ranks on the dev VM: reading 1.2-1.6x faster from 256 KiB).
asio::awaitable<void> all_gather_variable(ArenaTurn& turn, CollectiveOp& op,
                                          const CollectiveCall& call) {
  const int world = op.size();
  const int me = op.rank();
  const std::size_t element = dtype_size(call.output.dtype());
  for (int step = 1; step < world; ++step) {
    const auto peer = static_cast<std::size_t>((me + step) % world);
    const std::size_t bytes = call.counts[peer] * element;
    if (bytes != 0) {
      turn.read_input(static_cast<int>(peer), 0,
                      bytes_of(call.output) + sum_before(call.counts, peer) * element, bytes);
    }
  }
  const auto mine = static_cast<std::size_t>(me);
  copy(call.output.slice(sum_before(call.counts, mine), call.counts[mine]), call.input);
  co_return;
}

// Sender s put the piece for rank d at the sum of its send counts before d. Each rank reads
// every sender's counts, and a count that differs from the receive count it expects fails
// the operation on every rank alike: the ranks agree on the verdict before reading.
asio::awaitable<void> all_to_all_variable(ArenaTurn& turn, CollectiveOp& op,
                                          const CollectiveCall& call) {
  const int world = op.size();
  const auto me = static_cast<std::size_t>(op.rank());
  const std::size_t element = dtype_size(call.input.dtype());
  std::vector<std::size_t> first(static_cast<std::size_t>(world));  // each sender's offset for us
  RankRecord& mine = turn.arena().record(op.rank());
  mine.disputed_sender = -1;
  std::vector<std::size_t> theirs(static_cast<std::size_t>(world));
  for (int sender = 0; sender < world; ++sender) {
    const auto s = static_cast<std::size_t>(sender);
    std::size_t sent = 0;
    if (s == me) {
      first[s] = sum_before(call.counts, me);
      sent = call.counts[me];
    } else {
      turn.read_remote(sender, turn.record(sender).send_counts, theirs.data(),
                       theirs.size() * sizeof(std::size_t));
      first[s] = sum_before(theirs, me);
      sent = theirs[me];
    }
    if (sent != call.recv_counts[s] && mine.disputed_sender < 0) {
      mine.disputed_sender = sender;
      mine.disputed_sent = sent;
      mine.disputed_expected = call.recv_counts[s];
    }
  }
  turn.raise(Stage::arrived);
  co_await turn.wait_all(Stage::arrived, "every rank's check of the send counts");
  for (int r = 0; r < world; ++r) {
    const RankRecord& record = turn.record(r);
    if (record.disputed_sender < 0) continue;
    Error mismatch = all_to_all_v_dispute(op, record.disputed_sender, r, record.disputed_sent,
                                          record.disputed_expected);
    co_await turn.release();
    turn.finish();  // every rank fails at the same point: the arena is still in step
    throw mismatch;
  }
  for (int step = 0; step < world; ++step) {
    const auto s = (me + static_cast<std::size_t>(step)) % static_cast<std::size_t>(world);
    const std::size_t bytes = call.recv_counts[s] * element;
    std::byte* into = bytes_of(call.output) + sum_before(call.recv_counts, s) * element;
    if (bytes == 0) continue;
    if (s == me) {
      std::memcpy(into, bytes_of(call.input) + first[s] * element, bytes);
    } else {
      turn.read_input(static_cast<int>(s), first[s] * element, into, bytes);
    }
  }
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
      if (call.variable) {
        co_await all_gather_variable(turn, op, call);
        break;
      }
      // Each rank writes its block into every peer's output: only its own block of any
      // output, so the writes never meet, and an in-place input (its own block) is read
      // by itself alone.
      const std::size_t block = call.input.size_bytes();
      for (int step = 1; step < world; ++step) {
        turn.write_output((me + step) % world, me * block, call.input.data(), block);
      }
      copy(call.output.slice(me * call.input.count(), call.input.count()), call.input);
      break;
    }
    case gather: {
      // Every non-root writes its block into the root at once, instead of the root reading
      // P-1 blocks one after another.
      const std::size_t block = call.input.size_bytes();
      if (me == root) {
        copy(call.output.slice(me * call.input.count(), call.input.count()), call.input);
      } else {
        turn.write_output(root, me * block, call.input.data(), block);
      }
      break;
    }
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
                 {.local = bytes_of(call.output)});
      break;
    }
    case reduce: {
      const EvenSplit blocks{call.input.count(), static_cast<std::size_t>(world)};
      const std::size_t first = blocks.offset(static_cast<std::size_t>(me));
      FoldTarget target{.root = root};
      if (me == root) target.local = bytes_of(call.output) + first * dtype_size(call.input.dtype());
      fold_block(turn, op, call.input, first, blocks.size(static_cast<std::size_t>(me)),
                 call.reduce_op, target);
      break;
    }
    case all_to_all: {
      if (call.variable) {
        co_await all_to_all_variable(turn, op, call);
        break;
      }
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

Error all_to_all_v_dispute(const CollectiveOp& op, int sender, int receiver, std::size_t sent,
                           std::size_t expected) {
  return Error(Errc::size_mismatch,
               fmt::format("all_to_all_v: rank {} sends {} elements to rank {}, which expects {} "
                           "from it: the send and receive counts disagree",
                           op.world_rank(sender), sent, op.world_rank(receiver), expected),
               {.rank = op.world_rank(op.rank()), .peer = op.world_rank(sender)});
}

asio::awaitable<void> shared_memory_collective(CollectiveOp& op, const CollectiveCall& call) {
  {
    ArenaTurn turn(op, *call.arena, call.arena_ticket);
    co_await turn.start();
    // Every rank reaches the same answer: single copy was agreed by all or by none.
    if (op.size() > 1 && turn.single_copy()) {
      const bool variable_all_to_all = call.kind == CollectiveKind::all_to_all && call.variable;
      if (variable_all_to_all) {
        const bool done = co_await shared_memory_inline_all_to_all_v(turn, op, call);
        if (done) {
          turn.finish();
          co_return;
        }
        turn.arena().record(op.rank()).send_counts =
            reinterpret_cast<std::uint64_t>(call.counts.data());
      }
      const trace::AsyncSpan moved = op.phase("shared_memory.single_copy", call.bytes);
      co_await turn.post(fingerprint_of(call), call.input, call.output);
      co_await run_single_copy(turn, op, call);
      turn.finish();
      co_return;
    }
    turn.finish();
  }
  // The turn is given up (left the block) before the messages go, as in shared_memory_small.
  co_await run_message_algorithm(op, call);
}

}  // namespace braid::collectives::detail
