#include "shared_memory_arena.hpp"

#include <sched.h>

#include <braid/core/config.hpp>

namespace braid::collectives::detail {

SingleCopy single_copy_from_environment() {
  const std::string value = config::string_value("BRAID_SHM_SINGLE_COPY");
  if (value == "auto") return SingleCopy::measured;
  return config::parse_bool(value, "BRAID_SHM_SINGLE_COPY") ? SingleCopy::whenever_allowed
                                                             : SingleCopy::never;
}

int usable_cpus() noexcept {
  cpu_set_t cpus;
  CPU_ZERO(&cpus);
  if (sched_getaffinity(0, sizeof cpus, &cpus) != 0) return 1;
  return CPU_COUNT(&cpus);
}

std::size_t SharedMemoryArena::segment_bytes() const noexcept {
  const auto ranks = static_cast<std::size_t>(ranks_);
  return kStages * ranks * kFlagStride + ranks * sizeof(RankRecord) + (ranks + 1) * kSlotBytes +
         kInlineDepth * ranks * sizeof(InlineSlot);
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

std::atomic_ref<std::uint64_t> SharedMemoryArena::flag(int rank, Stage stage) noexcept {
  std::byte* at =
      base_ + (static_cast<std::size_t>(stage) * static_cast<std::size_t>(ranks_) +
               static_cast<std::size_t>(rank)) * kFlagStride;
  return std::atomic_ref<std::uint64_t>(*reinterpret_cast<std::uint64_t*>(at));
}

RankRecord& SharedMemoryArena::record(int rank) noexcept {
  std::byte* records = base_ + kStages * static_cast<std::size_t>(ranks_) * kFlagStride;
  return reinterpret_cast<RankRecord*>(records)[rank];
}

std::byte* SharedMemoryArena::slot(int rank) noexcept {
  return base_ + kStages * static_cast<std::size_t>(ranks_) * kFlagStride +
         static_cast<std::size_t>(ranks_) * sizeof(RankRecord) +
         static_cast<std::size_t>(rank) * kSlotBytes;
}

std::byte* SharedMemoryArena::result() noexcept {
  return slot(ranks_);
}

InlineSlot& SharedMemoryArena::inline_slot(int rank, std::uint64_t generation) noexcept {
  std::byte* slots = slot(ranks_) + kSlotBytes;  // after the result area
  constexpr auto kDepth = static_cast<std::size_t>(kInlineDepth);
  const std::size_t index = kDepth * static_cast<std::size_t>(rank) + generation % kDepth;
  return reinterpret_cast<InlineSlot*>(slots)[index];
}

}  // namespace braid::collectives::detail
