// Small collectives through shared memory in one wait (members on one node,
// shared_memory_arena.hpp): all-reduce of at most 16 KiB, reduce, reduce-scatter and
// all-to-all of at most kInlineBytes (64 KiB) of input, all-gather and gather of at most
// that much output, broadcast and scatter of at most that much from the root, and barriers.
// Each rank writes its call's fingerprint and its whole input into its own inline slot,
// marks the slot posted with the generation, and once every rank's slot is posted, checks
// every fingerprint and builds its output from the slots: all-reduce folds the P vectors
// in rank order (0..P-1, so every rank's result is bit-identical), reduce-scatter folds its
// block of each, all-gather copies each, all-to-all copies its block of each. A barrier is
// the same exchange without data. Up to InlineSlot::kLineBytes (16 B) the generation, the
// fingerprint and the vector share one cache line, so each peer costs one cache-line
// transfer: 8-byte all-reduce on 2 ranks 1.19 -> 0.85 us (six alternating runs, dev VM)
// against a flag, a fingerprint and a vector on three lines. The rooted collectives move
// data one way instead, and only the receiving end waits (shared_memory_small below).
//
// No release wait (but on a mismatch of the exchanging collectives): each rank has
// kInlineDepth inline slots, used in turn by generation. Before writing one,
// a rank makes sure that every rank is past the generation that used it last
// (ArenaTurn::inline_slot_free): after an operation in which it waited for every rank's
// slot or flag it knows so without looking; after one in which it did not wait for all (a
// rooted collective), it checks their flags. Every path posts its fingerprint in the slot,
// so records need no such care. Ranks whose counts differ may take different paths (a
// vector of at most kInlineBytes here, a larger one through ArenaTurn::post): each marks
// its slot posted and raises the `posted` flag, so each finds the other's call where it
// looks, and both end a mismatch with a release, so every rank fails at once and the
// arena stays in step.
//
// Cost: one wait, n bytes written into the slot, and what the output needs read from the
// slots (all-reduce: P·n bytes folded; the others about n): no system call and no message.
// Recursive doubling over UCX pays log2 P message latencies (~1.5 us each between two
// processes on the dev VM); OpenMPI's shared-memory FIFO pays one. Against single copy
// (two waits, a system call per block) and the message algorithms, on the dev VM, in one
// session: 2 ranks, all-gather 1.15 -> 0.36 us at 8 B, 3.3 -> 1.7 us at 32 KiB;
// reduce-scatter 2.15 -> 0.37 us and 3.5 -> 1.1 us; all-to-all 1.1 -> 0.36 us and
// 3.25 -> 1.2 us. 4 ranks on the 2 cores: all-gather 12 -> 4-5 us small, 18 -> 6 us at
// 32 KiB; reduce-scatter 15 -> 4 us; all-to-all 8-10 -> 4 us. At 128 KiB they lose to
// single copy, hence 64 KiB; all-reduce stops at 16 KiB (fits_inline).
#include <cstdint>
#include <cstring>
#include <numeric>

#include "collectives/algorithms/algorithms.hpp"
#include "collectives/algorithms/arena_turn.hpp"

namespace braid::collectives::detail {

bool fits_inline(const CollectiveCall& call) noexcept {
  constexpr std::size_t kLimit = SharedMemoryArena::kInlineBytes;
  constexpr std::size_t kAllReduceLimit = std::size_t{16} << 10;
  switch (call.kind) {
    case CollectiveKind::barrier:
      return true;
    case CollectiveKind::all_reduce:
      // Every rank folds the whole vector here; the segment splits the folding P ways,
      // and wins from 32 KiB (2 ranks: 2.1 against 3.3 us at 32 KiB, 3.6 against 5.9 us at
      // 64 KiB; 4 ranks on 2 cores: 12 against 15 us at 64 KiB).
      return call.input.size_bytes() <= kAllReduceLimit;
    // A reduce's root folds the whole vector alone, but waits once, while single copy
    // splits the folding with two waits and system calls: at 64 KiB, 2 ranks 3.0 against
    // 9.7 us, 4 ranks on 2 cores 7.1 against 33 us (back-to-back, the senders running ahead).
    case CollectiveKind::reduce:
    case CollectiveKind::broadcast:
    case CollectiveKind::gather:   // call.bytes: the root's whole output
    case CollectiveKind::scatter:  // and its whole input
      return call.bytes <= kLimit;
    case CollectiveKind::reduce_scatter:
      return call.input.size_bytes() <= kLimit;
    case CollectiveKind::all_to_all:
      return !call.variable && call.input.size_bytes() <= kLimit;
    case CollectiveKind::all_gather:
      return call.output.size_bytes() <= kLimit;  // with variable counts, the same on all
    default:
      return false;
  }
}

namespace {

// Where each rank's share of the output comes from, once the slots it needs are posted:
// the P vectors folded in rank order (all-reduce; reduce, at the root), or the block for
// this rank of each (reduce-scatter), or each whole (all-gather; gather, at the root), or
// this rank's block of each (all-to-all), or the root's vector (broadcast) or this rank's
// block of it (scatter).
void assemble(SharedMemoryArena& arena, const CollectiveOp& op, const CollectiveCall& call,
              std::uint64_t generation) {
  const int world = op.size();
  const auto me = static_cast<std::size_t>(op.rank());
  // A scatter's non-root passes no input: its output has the type.
  const DType dtype = (call.kind == CollectiveKind::scatter ? call.output : call.input).dtype();
  const std::size_t element = dtype_size(dtype);
  const std::size_t input_bytes = call.input.size_bytes();  // what each wrote (not all-gather_v)
  // `count` elements at element `first` of rank r's slot, which holds `bytes`.
  auto from_slot = [&](int r, std::size_t bytes, std::size_t first, std::size_t count) {
    return Buffer(arena.inline_slot(r, generation).vector(bytes) + first * element, count, dtype);
  };
  switch (call.kind) {
    case CollectiveKind::all_reduce:
    case CollectiveKind::reduce:
    case CollectiveKind::reduce_scatter: {
      const std::size_t count = call.output.count();
      const std::size_t first = call.kind == CollectiveKind::reduce_scatter ? me * count : 0;
      auto operand = [&](int r) { return from_slot(r, input_bytes, first, count); };
      // The output may be (part of) the input: every operand is read from the slots.
      combine(call.output, operand(0), operand(1), call.reduce_op);
      for (int r = 2; r < world; ++r) combine(call.output, call.output, operand(r), call.reduce_op);
      finish_average(call.output, call.reduce_op, world);
      break;
    }
    case CollectiveKind::all_gather:
    case CollectiveKind::gather: {
      std::size_t at = 0;
      for (int r = 0; r < world; ++r) {
        const std::size_t count =
            call.variable ? call.counts[static_cast<std::size_t>(r)] : call.input.count();
        if (count != 0) copy(call.output.slice(at, count), from_slot(r, count * element, 0, count));
        at += count;
      }
      break;
    }
    case CollectiveKind::all_to_all: {
      const std::size_t block = call.input.count() / static_cast<std::size_t>(world);
      for (int r = 0; r < world; ++r) {
        const auto from = static_cast<std::size_t>(r);
        copy(call.output.slice(from * block, block), from_slot(r, input_bytes, me * block, block));
      }
      break;
    }
    case CollectiveKind::broadcast:
      copy(call.output, from_slot(call.root, call.output.size_bytes(), 0, call.output.count()));
      break;
    case CollectiveKind::scatter: {
      const std::size_t block = call.output.count();
      copy(call.output, from_slot(call.root, call.bytes, me * block, block));
      break;
    }
    default:
      break;  // a barrier: nothing to move
  }
}

// Every inline operation starts so, once its slot is free (ArenaTurn::inline_slot_free):
// this rank's fingerprint in its slot of the generation, where every rank compares calls
// (ArenaTurn::post too). The caller writes its payload into the slot.
InlineSlot& begin_post(ArenaTurn& turn, CollectiveOp& op, const CollectiveCall& call) {
  InlineSlot& mine = turn.arena().inline_slot(op.rank(), turn.generation());
  mine.call = fingerprint_of(call);
  return mine;
}

// ... and is marked posted (and the flag a record-path peer waits for raised), once the
// payload is in.
void end_post(ArenaTurn& turn) noexcept {
  turn.post_inline_slot();
  turn.raise(Stage::posted);
}

}  // namespace

// The slot holds [whether the input follows][send counts][receive counts][the input], all
// in 8-byte words but the input: every rank reads every rank's counts, so all check every
// pair alike and need no second wait to agree on a verdict, and all see whether every
// input fitted. Where one did not, nothing was read from the slots, and the operation
// goes on by single copy, with a post of its own.
asio::awaitable<bool> shared_memory_inline_all_to_all_v(ArenaTurn& turn, CollectiveOp& op,
                                                        const CollectiveCall& call) {
  const auto world = static_cast<std::size_t>(op.size());
  const auto me = static_cast<std::size_t>(op.rank());
  const std::size_t element = dtype_size(call.input.dtype());
  const std::size_t header = (1 + 2 * world) * sizeof(std::uint64_t);
  const std::size_t bytes = call.input.size_bytes();
  constexpr std::size_t kRoom = sizeof(InlineSlot::data);
  const bool counts_fit = header <= kRoom;  // the same on every rank: up to 4351 ranks
  const bool fits =
      counts_fit && bytes <= kRoom - header && bytes <= SharedMemoryArena::kInlineBytes;
  turn.next_chunk();
  if (!turn.inline_slot_free()) co_await turn.wait_inline_slot_free();
  InlineSlot& mine = begin_post(turn, op, call);
  auto* words = reinterpret_cast<std::uint64_t*>(mine.data);
  if (counts_fit) {
    words[0] = fits ? 1 : 0;
    for (std::size_t r = 0; r < world; ++r) {
      words[1 + r] = call.counts[r];
      words[1 + world + r] = call.recv_counts[r];
    }
    if (fits && bytes != 0) std::memcpy(mine.data + header, call.input.data(), bytes);
  }
  end_post(turn);
  if (!turn.all_inline_slots_posted()) co_await turn.wait_all_inline_slots("every rank's counts");
  if (!turn.calls_agree()) co_await turn.fail_on_disagreement();
  if (!counts_fit) co_return false;
  auto words_of = [&](std::size_t r) {
    return reinterpret_cast<const std::uint64_t*>(
        turn.arena().inline_slot(static_cast<int>(r), turn.generation()).data);
  };
  for (std::size_t r = 0; r < world; ++r) {
    if (words_of(r)[0] == 0) co_return false;
  }
  // Receiver by receiver, its first sender whose count differs: the same verdict on every
  // rank, and the same message single copy gives.
  for (std::size_t receiver = 0; receiver < world; ++receiver) {
    for (std::size_t sender = 0; sender < world; ++sender) {
      const std::uint64_t sent = words_of(sender)[1 + receiver];
      const std::uint64_t expected = words_of(receiver)[1 + world + sender];
      if (sent == expected) continue;
      Error mismatch = all_to_all_v_dispute(op, static_cast<int>(sender),
                                            static_cast<int>(receiver), sent, expected);
      co_await turn.release();
      turn.finish();  // every rank fails at the same point: the arena is still in step
      throw mismatch;
    }
  }
  std::size_t at = 0;
  for (std::size_t sender = 0; sender < world; ++sender) {
    const std::uint64_t* counts = words_of(sender) + 1;
    const std::size_t first = std::accumulate(counts, counts + me, std::size_t{0});
    const std::size_t count = call.recv_counts[sender];
    const InlineSlot& slot = turn.arena().inline_slot(static_cast<int>(sender), turn.generation());
    const std::byte* from = slot.data + header + first * element;
    if (count != 0)
      std::memcpy(static_cast<std::byte*>(call.output.data()) + at * element, from,
                  count * element);
    at += count;
  }
  co_return true;
}

// Every call that fits the slots runs here, in one coroutine frame: a wait is a frame of
// its own only where it has to wait, and the turn is taken without one where it has come
// (ArenaTurn::try_start). The exchanging collectives (all-reduce, reduce-scatter,
// all-gather, all-to-all, barrier) write their input, wait for every slot, compare every
// call and assemble their output.
//
// The rooted ones move data one way: the root of a broadcast or scatter writes its vector
// into its slot and returns without waiting, and so does each non-root of a gather or
// reduce with its own; only the ranks at the other end wait, for the root's slot
// (broadcast, scatter) or every slot (the root of a gather or reduce), and compare the
// calls posted there with theirs. Every rank posts its call, so that those comparisons
// always have a partner, and raises `released` once it is done with the slots, which with
// its posting tells a writer kInlineDepth generations on that the slot it is about to
// reuse is free.
//
// A rank whose count differs and does not fit takes the single-copy path
// (shared_memory_collective), whose post() compares every rank's call in the slots before
// anything is read: it finds this call where it looks, and this rank finds its call in the
// slot it waits on. Exchanging ranks end a mismatch with a release, so every rank fails at
// once. A rooted mismatch fails the ranks that find it, without a release (writers check
// that slots are free), so the arena stays in step for the next operation on every rank; a
// root that returned at once never learns of it, as with OpenMPI's or UCX's eager sends.
asio::awaitable<void> shared_memory_small(CollectiveOp& op, const CollectiveCall& call) {
  using enum CollectiveKind;
  const int me = op.rank();
  {
    ArenaTurn turn(op, *call.arena, call.arena_ticket);
    if (!turn.try_start()) co_await turn.start();
    // Every rank reaches the same answer: single copy was agreed by all or by none (map()).
    const bool through_slots =
        op.size() > 1 && (call.kind == all_reduce || call.kind == barrier || turn.single_copy());
    if (through_slots) {
      const bool rooted = is_rooted(call.kind);
      const bool from_root = call.kind == broadcast || call.kind == scatter;
      // Who writes a vector into the slot: every rank exchanging; the root sending; or
      // every rank sending to it (the root too: its fold or copy then reads every operand
      // from the slots, so an in-place output never overwrites an operand still to be read).
      const bool writes = !from_root || me == call.root;
      const bool waits = !rooted || (from_root ? me != call.root : me == call.root);
      std::size_t bytes = 0;  // the payload: the input, or the root's whole input
      if (call.kind != barrier && writes) bytes = from_root ? call.bytes : call.input.size_bytes();
      BRAID_ENFORCE(bytes <= SharedMemoryArena::kInlineBytes,
                    "{} of {} bytes through the inline slots (at most {})", to_string(call.kind),
                    bytes, SharedMemoryArena::kInlineBytes);
      turn.next_chunk();
      if (!turn.inline_slot_free()) co_await turn.wait_inline_slot_free();
      InlineSlot& mine = begin_post(turn, op, call);
      if (bytes != 0) std::memcpy(mine.vector(bytes), call.input.data(), bytes);
      end_post(turn);
      if (!waits) {
        if (call.kind == scatter) {
          const std::size_t block = call.output.count();
          copy(call.output, call.input.slice(static_cast<std::size_t>(me) * block, block));
        }
        turn.raise(Stage::released);
        turn.finish();
        co_return;
      }
      if (from_root) {
        if (!turn.inline_slot_posted(call.root)) {
          co_await turn.wait_inline_slot(call.root, "the root's small vector");
        }
      } else if (!turn.all_inline_slots_posted()) {
        co_await turn.wait_all_inline_slots("every rank's small vector");
      }
      if (rooted) {
        // The ranks whose calls this one receives from: the root, or every rank.
        const int first = from_root ? call.root : 0;
        const int end = from_root ? call.root + 1 : op.size();
        for (int r = first; r < end; ++r) {
          if (turn.arena().inline_slot(r, turn.generation()).call == mine.call) continue;
          Error mismatch = turn.dispute(r, me);
          turn.raise(Stage::released);
          turn.finish();
          throw mismatch;
        }
      } else if (!turn.calls_agree()) {
        co_await turn.fail_on_disagreement();
      }
      assemble(turn.arena(), op, call, turn.generation());
      if (rooted) turn.raise(Stage::released);
      turn.finish();
      co_return;
    }
    turn.finish();
  }
  // One rank, or members that cannot read each other's memory (not an all-reduce or a
  // barrier, which always take the slots with several ranks).
  if (call.kind == all_reduce) {
    copy(call.output, call.input);
  } else if (call.kind != barrier) {
    co_await run_message_algorithm(op, call);
  }
}

asio::awaitable<void> pass_arena_turn(CollectiveOp& op, const CollectiveCall& call) {
  ArenaTurn turn(op, *call.arena, call.arena_ticket);
  co_await turn.pass();
}

}  // namespace braid::collectives::detail
