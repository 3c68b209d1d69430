// ArenaTurn: one operation's turn in a communicator's SharedMemoryArena, and the steps
// every shared-memory algorithm shares.
//
// start(): waits until the operations issued before this one have left the arena
// (tickets taken at the call), maps the arena on first use (rank 0 names it, the others
// acknowledge; then each rank probes reading every peer's memory, and single copy is
// agreed by all or none, for all-reduce separately: shared_memory_arena.hpp), and refuses to run on
// an arena an earlier failure left broken. post(): writes this rank's record (buffer addresses, the
// call's fingerprint) and waits for every rank's: a call that differs fails on every rank, naming
// both sides, before anyone reads another's buffer. release(): waits until every rank is done
// reading, so buffers may be reused and records rewritten. A turn that ends without finish() (an
// error, a dead peer) marks the arena broken: the ranks no longer agree on its flags.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

#include <boost/asio/awaitable.hpp>

#include <braid/core/error.hpp>

#include "collectives/collective_call.hpp"
#include "collectives/collective_op.hpp"
#include "collectives/shared_memory_arena.hpp"

namespace braid::collectives::detail {

class ArenaTurn {
 public:
  ArenaTurn(CollectiveOp& op, SharedMemoryArena& arena, std::uint64_t ticket) noexcept
      : op_(op), arena_(arena), ticket_(ticket) {}
  ~ArenaTurn();
  ArenaTurn(const ArenaTurn&) = delete;
  ArenaTurn& operator=(const ArenaTurn&) = delete;

  asio::awaitable<void> start();
  // start() without a coroutine frame, where it has nothing to wait for or do: the
  // operations before this one have left the arena, which is mapped and whole. False
  // where start() is needed.
  bool try_start() noexcept {
    if (arena_.serving() != ticket_ || !arena_.mapped() || arena_.broken()) return false;
    served_ = true;
    return true;
  }
  // For an operation that failed before its algorithm ran (a desync caught by the
  // fingerprint exchange, which fails on every rank alike): waits for its turn and gives
  // it up untouched, so the operations after it still get theirs.
  asio::awaitable<void> pass();
  asio::awaitable<void> post(const Fingerprint& call, const Buffer& input, const Buffer& output);
  asio::awaitable<void> release();
  // Whether every rank's posted fingerprint (in its inline slot of this generation, on
  // every path) equals rank 0's. Every rank reaches the same verdict.
  bool calls_agree() noexcept;
  // Where they do not: every rank fails alike, naming both calls, after a release, so no
  // record or slot is rewritten while another rank still reads it. Always throws.
  // Two steps, so that the usual agreement costs no coroutine frame.
  asio::awaitable<void> fail_on_disagreement();
  void finish() noexcept { finished_ = true; }

  SharedMemoryArena& arena() noexcept { return arena_; }
  bool single_copy() const noexcept { return arena_.single_copy(); }
  // After post() of an all-reduce: whether it reads peers' memory directly (the same
  // answer on every rank).
  bool all_reduce_reads_peers() const noexcept { return all_reduce_reads_peers_; }
  // After an all-reduce of `bytes` per rank: where rank 0 chose its way by measurement,
  // how long it took from the agreement on goes into the arena's PathTimings.
  void all_reduce_done(std::size_t bytes) noexcept;
  // This operation's generation (post() takes it).
  std::uint64_t generation() const noexcept { return generation_; }
  // Copy-through: each chunk raises and waits on flags of a generation of its own.
  void next_chunk() noexcept { generation_ = arena_.next_generation(); }
  const RankRecord& record(int rank) noexcept { return arena_.record(rank); }

  void raise(Stage stage) noexcept;
  // Whether this rank may write its inline slot of this generation: every rank is done
  // reading the slot's previous use, SharedMemoryArena::kInlineDepth generations back. A
  // wait on every rank's flags or slots proves it (SharedMemoryArena::all_reached), so
  // after an operation in which this rank waited for all, the answer is yes without a
  // look at anyone's memory. Only after an operation in which it waited for no one, or for
  // the root alone (a small rooted collective), may it have to wait_inline_slot_free():
  // until every peer has posted in the generation after that use, or released it.
  bool inline_slot_free() noexcept {
    return arena_.all_reached() + (SharedMemoryArena::kInlineDepth - 1) >= generation_ ||
           peers_past_slot_use();
  }
  asio::awaitable<void> wait_inline_slot_free();
  // Marks this rank's inline slot of this generation posted: its call (and, on the inline
  // path, its vector) is there. post() marks it too, for a peer on the inline path.
  void post_inline_slot() noexcept;
  // Whether every rank's inline slot of this generation is posted, and a wait until it is.
  // Callers ask first and wait only where the answer is no: a wait is a coroutine frame.
  bool all_inline_slots_posted() noexcept;
  asio::awaitable<void> wait_all_inline_slots(std::string_view what);
  // The same for `rank`'s slot alone.
  bool inline_slot_posted(int rank) noexcept;
  asio::awaitable<void> wait_inline_slot(int rank, std::string_view what);
  // The error for rank `a`'s call differing from rank `b`'s, as posted in their inline
  // slots of this generation.
  Error dispute(int a, int b) noexcept;
  // Waits on every rank's flag. Until every rank has posted, a partner may still be
  // computing, so the waits nap after a short spin; after that, partners are busy with
  // this very operation and the waits spin longer, unless the node has more members than
  // cores (collective_op.hpp).
  asio::awaitable<void> wait_all(Stage stage, std::string_view what);
  // Single-copy all-reduce, where any rank may reduce any piece (shared_memory_all_reduce
  // .cpp): claims the next piece of `owner`'s block that no rank has claimed in this
  // operation, of `pieces`; nullopt once all are. The counters live in the arena, tagged
  // with the generation, so a new operation starts from zero without a reset.
  std::optional<std::size_t> claim_piece(int owner, std::size_t pieces);
  // How many pieces of `owner`'s block are claimed in this operation.
  std::size_t claimed(int owner) noexcept;
  // Whether every rank's input and output lie in one allocate_shared allocation (known
  // after post()): then peers' buffers are in our own address space, at these addresses.
  bool mapped() const noexcept { return mapped_input_.base != nullptr; }
  const std::byte* mapped_input(int rank) noexcept;
  std::byte* mapped_output(int rank) noexcept;
  // Single copy: `bytes` at byte `offset` of rank's input or output, into or from ours:
  // a memcpy where mapped(), else cross-memory attach. A failure (the process is gone) is
  // an Error naming the rank.
  void read_input(int rank, std::size_t offset, void* into, std::size_t bytes);
  void read_output(int rank, std::size_t offset, void* into, std::size_t bytes);
  void write_output(int rank, std::size_t offset, const void* from, std::size_t bytes);
  // Any address in rank's process (one its record names).
  void read_remote(int rank, std::uint64_t address, void* into, std::size_t bytes) {
    read(rank, address, into, bytes);
  }

 private:
  asio::awaitable<void> wait_turn();
  // Whether every peer is past this rank's inline slot's last use (inline_slot_free).
  bool peers_past_slot_use() noexcept;
  const Fingerprint& posted_call(int rank) noexcept;
  asio::awaitable<void> map();
  std::chrono::microseconds spin_window() const noexcept {
    // A rank that says it computes spins briefly: its core is wanted there.
    return all_posted_ && !arena_.crowded() && !arena_.computing_here() ? kPartnersBusySpinWindow
                                                                        : kSpinWindow;
  }
  void read(int rank, std::uint64_t remote, void* into, std::size_t bytes);
  [[noreturn]] void cross_memory_failed(int rank, int error, std::string_view what);

  CollectiveOp& op_;
  SharedMemoryArena& arena_;
  std::uint64_t ticket_;
  std::uint64_t generation_ = 0;
  bool served_ = false;
  bool finished_ = false;
  bool all_posted_ = false;
  bool all_reduce_reads_peers_ = false;
  bool timed_ = false;
  PathTimings::Path timed_path_ = PathTimings::Path::first;
  std::chrono::steady_clock::time_point timed_since_;
  SharedBufferRegistry::View mapped_input_;
  SharedBufferRegistry::View mapped_output_;
};

// all_to_all_v: rank `sender` sends `sent` elements to rank `receiver`, which expects
// `expected` from it. The error every rank throws for the first such disagreement.
Error all_to_all_v_dispute(const CollectiveOp& op, int sender, int receiver, std::size_t sent,
                           std::size_t expected);

// all_to_all_v through the inline slots, where every rank's send counts, receive counts
// and input fit one (shared_memory_inline.cpp): each learns from the slots whether all
// did. Returns false, having moved nothing, where some rank's did not; every rank alike.
asio::awaitable<bool> shared_memory_inline_all_to_all_v(ArenaTurn& turn, CollectiveOp& op,
                                                        const CollectiveCall& call);

// Where fold_block's result goes: our own memory, and/or other ranks' outputs at the same
// element (written with process_vm_writev while the piece is still in cache).
struct FoldTarget {
  std::byte* local = nullptr;  // where element `first` lands in our memory; null: nowhere
  int root = -1;               // reduce: the root's output, when we are not the root
  bool every_peer = false;     // all-reduce: every other rank's output too
};

// Single copy: reduces elements [first, first + count) of every rank's input (ranks in
// order 0..P-1, so the result does not depend on who reduces), reading peers' pieces
// into a cache-sized scratch, and writes the result where `target` says. avg is finished
// here.
void fold_block(ArenaTurn& turn, CollectiveOp& op, const Buffer& input, std::size_t first,
                std::size_t count, ReduceOp reduce_op, const FoldTarget& target);

}  // namespace braid::collectives::detail
