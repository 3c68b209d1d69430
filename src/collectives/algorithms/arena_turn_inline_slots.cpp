// ArenaTurn's inline slots (arena_turn.hpp): when this rank may write its slot again,
// marking it posted, and the waits on every rank's or one rank's slot.
#include <atomic>

#include "collectives/algorithms/arena_turn.hpp"

namespace braid::collectives::detail {

bool ArenaTurn::peers_past_slot_use() noexcept {
  // The slot's last use, and the generation every rank must have reached since: at least
  // 1 here, for map() waited for every rank in generation 1.
  constexpr std::uint64_t kDepth = SharedMemoryArena::kInlineDepth;
  const std::uint64_t last_use = generation_ - kDepth;
  const std::uint64_t next = last_use + 1;
  const int me = op_.rank();
  for (int r = 0; r < op_.size(); ++r) {
    if (r == me) continue;
    const bool past = arena_.inline_posted(r, next).load(std::memory_order_acquire) >= next ||
                      arena_.flag(r, Stage::posted).load(std::memory_order_acquire) >= next ||
                      arena_.flag(r, Stage::released).load(std::memory_order_acquire) >= last_use;
    if (!past) return false;
  }
  arena_.note_all_reached(next);
  return true;
}

// Not coroutines: each returns poll_until's, one frame rather than two. The turn outlives
// its waits (its operation's frame holds both): the predicates below may keep `this`.
asio::awaitable<void> ArenaTurn::wait_inline_slot_free() {
  return op_.poll_until([this] { return peers_past_slot_use(); },
                        "every rank to finish reading this rank's inline slot's last use",
                        spin_window(), arena_.crowded(), arena_.armed_doorbell());
}

void ArenaTurn::post_inline_slot() noexcept {
  arena_.inline_posted(op_.rank(), generation_).store(generation_, std::memory_order_release);
  if (Doorbell* doorbell = arena_.armed_doorbell()) doorbell->ring_sleepers();
}

bool ArenaTurn::all_inline_slots_posted() noexcept {
  for (int r = 0; r < op_.size(); ++r) {
    if (arena_.inline_posted(r, generation_).load(std::memory_order_acquire) < generation_) {
      return false;
    }
  }
  arena_.note_all_reached(generation_);
  return true;
}

asio::awaitable<void> ArenaTurn::wait_all_inline_slots(std::string_view what) {
  return op_.poll_until([this] { return all_inline_slots_posted(); }, what, spin_window(),
                        arena_.crowded(), arena_.armed_doorbell());
}

bool ArenaTurn::inline_slot_posted(int rank) noexcept {
  if (arena_.inline_posted(rank, generation_).load(std::memory_order_acquire) < generation_) {
    return false;
  }
  // With one peer, the rank we waited for is every rank there is.
  if (op_.size() == 2) arena_.note_all_reached(generation_);
  return true;
}

asio::awaitable<void> ArenaTurn::wait_inline_slot(int rank, std::string_view what) {
  return op_.poll_until([this, rank] { return inline_slot_posted(rank); }, what, spin_window(),
                        arena_.crowded(), arena_.armed_doorbell());
}

}  // namespace braid::collectives::detail
