#include "collectives/shared_memory_arena.hpp"

#include <sched.h>

#include <braid/core/config.hpp>

namespace braid::collectives::detail {

SingleCopy single_copy_from_environment() {
  const std::string value = config::string_value("BRAID_SHM_SINGLE_COPY");
  if (value == "auto") return SingleCopy::measured;
  return config::parse_bool(value, "BRAID_SHM_SINGLE_COPY") ? SingleCopy::whenever_allowed
                                                            : SingleCopy::never;
}

bool doorbells_from_environment() {
  return config::bool_value("BRAID_SHM_DOORBELL");
}

int usable_cpus() noexcept {
  cpu_set_t cpus;
  CPU_ZERO(&cpus);
  if (sched_getaffinity(0, sizeof cpus, &cpus) != 0) return 1;
  return CPU_COUNT(&cpus);
}

std::size_t SharedMemoryArena::segment_bytes() const noexcept {
  const auto ranks = static_cast<std::size_t>(ranks_);
  return kFlagRows * ranks * kFlagStride + ranks * sizeof(RankRecord) + (ranks + 1) * kSlotBytes +
         kInlineDepth * ranks * sizeof(InlineSlot);
}

void SharedMemoryArena::set_computing(bool computing) noexcept {
  // DDP says the same thing once per backward; only a change costs a store and the rings.
  if (computing_here_.exchange(computing, std::memory_order_seq_cst) == computing) return;
  if (!hints_published_.load(std::memory_order_seq_cst)) return;  // publish_hints will
  write_hint();
  // A wait on hints sleeps on the doorbell: this rank's own (a deferring all-reduce here),
  // or a peer's (one deferring to this rank, which may now be computing too). Each is rung
  // only where it counts a sleeper, after a fence: the sleeper's side is sleep_unless's.
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (std::atomic_ref<std::uint32_t>(*asleep(me_)).load(std::memory_order_relaxed) != 0) {
    doorbell_.ring_self();
  }
  doorbell_.ring_sleepers();
}

void SharedMemoryArena::publish_hints(int me) noexcept {
  me_ = me;
  hints_published_.store(true, std::memory_order_seq_cst);
  write_hint();
}

void SharedMemoryArena::write_hint() noexcept {
  // Both threads may write (set_computing, and publish_hints racing it): whoever writes
  // last checks that what it wrote is still the hint, so the line ends at the newest.
  for (;;) {
    const bool hint = computing_here_.load(std::memory_order_seq_cst);
    computing(me_).store(hint ? 1 : 0, std::memory_order_seq_cst);
    if (computing_here_.load(std::memory_order_seq_cst) == hint) return;
  }
}

std::string SharedMemoryArena::create() {
  segment_ = SharedSegment::create(segment_bytes());
  base_ = segment_.data();  // fresh pages read as zero: every flag starts at generation 0
  return segment_.name();
}

void SharedMemoryArena::open(const std::string& name) {
  segment_ = SharedSegment::open(name, segment_bytes());
  base_ = segment_.data();
}

}  // namespace braid::collectives::detail
