// ArenaTurn's turn itself (arena_turn.hpp): waiting for it, posting this rank's record and
// call, the fingerprint agreement every rank reaches alike, the stage flags and the wait on
// every rank's, and giving the turn back. Mapping the arena is arena_turn_mapping.cpp; the
// inline slots, work sharing and peers' buffers have files of their own beside it.
#include "collectives/algorithms/arena_turn.hpp"

#include <atomic>

#include <fmt/format.h>

#include <braid/core/enforce.hpp>
#include <braid/core/error.hpp>

namespace braid::collectives::detail {

ArenaTurn::~ArenaTurn() {
  if (!served_) return;
  if (!finished_) arena_.mark_broken();
  arena_.done_serving();
}

asio::awaitable<void> ArenaTurn::wait_turn() {
  const trace::AsyncSpan turn = op_.waiting("shared_memory.wait_turn");
  SharedMemoryArena* shared = &arena_;
  const std::uint64_t ticket = ticket_;
  co_await op_.poll_until(
      [shared, ticket] { return shared->serving() == ticket || shared->broken(); },
      "the communicator's previous shared-memory operation", kSpinWindow, shared->crowded(),
      shared->armed_doorbell(), CollectiveOp::Wake::turn);
  served_ = true;
}

asio::awaitable<void> ArenaTurn::start() {
  // Usually the turn has come (the operations before this one are done): then no wait,
  // and no trace span for one.
  if (arena_.serving() == ticket_) {
    served_ = true;
  } else {
    co_await wait_turn();
  }
  if (arena_.broken()) {
    const std::string cause = op_.failed_member();
    throw Error(Errc::peer_failed,
                fmt::format("an earlier shared-memory collective on this communicator failed{}, "
                            "so its ranks no longer agree on the arena's state",
                            cause.empty() ? "" : fmt::format(" ({})", cause)),
                {.rank = op_.world_rank(op_.rank())});
  }
  if (!arena_.mapped() && op_.size() > 1) co_await map();
}

asio::awaitable<void> ArenaTurn::pass() {
  co_await wait_turn();
  finished_ = true;
}

asio::awaitable<void> ArenaTurn::post(const Fingerprint& call, const Buffer& input,
                                      const Buffer& output) {
  generation_ = arena_.next_generation();
  RankRecord& mine = arena_.record(op_.rank());
  mine.input = reinterpret_cast<std::uint64_t>(input.data());
  mine.output = reinterpret_cast<std::uint64_t>(output.data());
  const SharedBufferRegistry& shared = *arena_.shared_buffers();
  const SharedBufferRegistry::Location in =
      shared.locate(input.data(), input.size_bytes(), op_.rank());
  const SharedBufferRegistry::Location out =
      shared.locate(output.data(), output.size_bytes(), op_.rank());
  mine.shared_input = in.id;
  mine.shared_input_offset = in.offset;
  mine.shared_output = out.id;
  mine.shared_output_offset = out.offset;
  // Peers may be about to pin this rank's pages (cross-memory attach), unless the buffers
  // are in allocate_shared memory, which they map: note() moves them onto huge pages at
  // their second use, so that pinning takes one page per 2 MiB.
  using Reads = SharedMemoryArena::AllReduceReads;
  using Path = PathTimings::Path;
  const bool all_reduce = call.kind == static_cast<std::uint8_t>(CollectiveKind::all_reduce);
  const Reads reads =
      all_reduce ? arena_.single_copy_all_reduce(input.size_bytes()) : Reads::segment;
  const bool attached = all_reduce ? reads != Reads::segment : arena_.single_copy();
  HugePageAdvice& huge_pages = arena_.huge_pages();
  const bool separate_output = output.data() != input.data();
  if (attached && in.id == 0) huge_pages.note(input.data(), input.size_bytes());
  if (attached && out.id == 0 && separate_output) {
    huge_pages.note(output.data(), output.size_bytes());
  }
  // Where the way is measured, rank 0 chooses it for all.
  if (reads == Reads::measured && op_.rank() == 0) {
    mine.all_reduce_path =
        static_cast<std::uint32_t>(arena_.all_reduce_timings().choose(input.size_bytes()));
  }
  // Every rank's fingerprint goes in its inline slot of the generation, whichever path its
  // counts put it on (shared_memory_inline.cpp), so all compare the same calls; records
  // would not do, as a rank that returned without waiting (a small rooted collective's
  // sending end) may rewrite its record in its next operation while we still read it.
  if (!inline_slot_free()) co_await wait_inline_slot_free();
  arena_.inline_slot(op_.rank(), generation_).call = call;
  post_inline_slot();
  all_posted_ = false;
  raise(Stage::posted);
  co_await wait_all(Stage::posted, "every rank's shared-memory record");
  all_posted_ = true;
  if (!calls_agree()) co_await fail_on_disagreement();
  // Every rank decides alike, from the same records: each rank whose buffers lie in
  // allocation n has it registered, so if all name the same n, all map it.
  bool one_allocation = mine.shared_input != 0 && mine.shared_output != 0;
  for (int r = 0; r < op_.size() && one_allocation; ++r) {
    one_allocation = arena_.record(r).shared_input == mine.shared_input &&
                     arena_.record(r).shared_output == mine.shared_output;
  }
  if (one_allocation) {
    mapped_input_ = in.view;
    mapped_output_ = out.view;
  }
  all_reduce_reads_peers_ = reads == Reads::peers;
  if (reads == Reads::measured) {
    const auto path = static_cast<Path>(arena_.record(0).all_reduce_path);
    all_reduce_reads_peers_ = path == SharedMemoryArena::kReadingPeers;
    // Mapped buffers read peers whatever was chosen: no measurement of either way. Nor
    // while a rank computes: reading peers then waits for, or does, others' shares.
    if (op_.rank() == 0 && !one_allocation && !arena_.any_computing()) {
      timed_ = true;
      timed_path_ = path;
      timed_since_ = std::chrono::steady_clock::now();
    }
  }
}

void ArenaTurn::all_reduce_done(std::size_t bytes) noexcept {
  if (!timed_) return;
  const auto took = std::chrono::steady_clock::now() - timed_since_;
  arena_.all_reduce_timings().record(bytes, timed_path_,
                                     std::chrono::duration_cast<std::chrono::nanoseconds>(took));
}

const Fingerprint& ArenaTurn::posted_call(int rank) noexcept {
  return arena_.inline_slot(rank, generation_).call;
}

bool ArenaTurn::calls_agree() noexcept {
  const Fingerprint& first = posted_call(0);
  for (int r = 1; r < op_.size(); ++r) {
    if (!(posted_call(r) == first)) return false;
  }
  return true;
}

Error ArenaTurn::dispute(int a, int b) noexcept {
  const int me = op_.rank();
  return Error(Errc::size_mismatch,
               fmt::format("rank {} calls {} but rank {} calls {}: counts or dtypes differ "
                           "across ranks",
                           op_.world_rank(a), describe(posted_call(a)), op_.world_rank(b),
                           describe(posted_call(b))),
               {.rank = op_.world_rank(me), .peer = op_.world_rank(me == a ? b : a)});
}

asio::awaitable<void> ArenaTurn::fail_on_disagreement() {
  const Fingerprint& first = posted_call(0);
  for (int r = 1; r < op_.size(); ++r) {
    if (posted_call(r) == first) continue;
    // Every rank reaches this verdict from the same fingerprints. Word it before releasing
    // them: a rank that fails first may post its next record once everyone has released.
    Error mismatch = dispute(0, r);
    co_await release();
    finish();  // every rank fails at the same point: the arena is still in step
    throw mismatch;
  }
  BRAID_ENFORCE(false, "fail_on_disagreement called where every rank posted the same call");
}

asio::awaitable<void> ArenaTurn::release() {
  raise(Stage::released);
  co_await wait_all(Stage::released, "every rank to finish reading shared buffers");
}

void ArenaTurn::raise(Stage stage) noexcept {
  arena_.flag(op_.rank(), stage).store(generation_, std::memory_order_release);
  if (Doorbell* doorbell = arena_.armed_doorbell()) doorbell->ring_sleepers();
}

// Not a coroutine: it returns poll_until's, one frame rather than two.
asio::awaitable<void> ArenaTurn::wait_all(Stage stage, std::string_view what) {
  SharedMemoryArena* shared = &arena_;
  const std::uint64_t generation = generation_;
  const int world = op_.size();
  return op_.poll_until(
      [shared, world, stage, generation] {
        for (int r = 0; r < world; ++r) {
          if (shared->flag(r, stage).load(std::memory_order_acquire) < generation) return false;
        }
        shared->note_all_reached(generation);
        return true;
      },
      what, spin_window(), arena_.crowded(), arena_.armed_doorbell());
}

}  // namespace braid::collectives::detail
