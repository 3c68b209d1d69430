#include "shared_memory_arena.hpp"

#include <fcntl.h>
#include <sched.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <random>

#include <fmt/format.h>

#include <braid/core/config.hpp>
#include <braid/core/error.hpp>

namespace braid::collectives::detail {
namespace {

[[noreturn]] void fail(const std::string& what, const std::string& name) {
  throw Error(std::error_code(errno, std::generic_category()),
              fmt::format("{} shared-memory segment {}", what, name));
}

}  // namespace

SingleCopy single_copy_from_environment() {
  const std::string value = config::string_value("BRAID_SHM_SINGLE_COPY");
  if (value == "auto") return SingleCopy::unless_crowded;
  return config::parse_bool(value, "BRAID_SHM_SINGLE_COPY") ? SingleCopy::whenever_allowed
                                                             : SingleCopy::never;
}

int usable_cpus() noexcept {
  cpu_set_t cpus;
  CPU_ZERO(&cpus);
  if (sched_getaffinity(0, sizeof cpus, &cpus) != 0) return 1;
  return CPU_COUNT(&cpus);
}

SharedMemoryArena::~SharedMemoryArena() {
  if (base_ != nullptr) munmap(base_, segment_bytes());
  unlink_name();
}

std::size_t SharedMemoryArena::segment_bytes() const noexcept {
  const auto ranks = static_cast<std::size_t>(ranks_);
  return kStages * ranks * kFlagStride + ranks * sizeof(RankRecord) + (ranks + 1) * kSlotBytes +
         2 * ranks * sizeof(InlineSlot);
}

std::string SharedMemoryArena::create() {
  std::random_device random;
  name_ = fmt::format("/braid-{}-{:08x}{:08x}", getpid(), random(), random());
  const int fd = shm_open(name_.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0) fail("cannot create", name_);
  if (ftruncate(fd, static_cast<off_t>(segment_bytes())) != 0) {
    close(fd);
    unlink_name();
    fail("cannot size", name_);
  }
  void* memory = mmap(nullptr, segment_bytes(), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (memory == MAP_FAILED) {
    unlink_name();
    fail("cannot map", name_);
  }
  base_ = static_cast<std::byte*>(memory);
  // Fresh pages read as zero: every flag starts at generation 0.
  return name_;
}

void SharedMemoryArena::open(const std::string& name) {
  const int fd = shm_open(name.c_str(), O_RDWR, 0600);
  if (fd < 0) fail("cannot open", name);
  void* memory = mmap(nullptr, segment_bytes(), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (memory == MAP_FAILED) fail("cannot map", name);
  base_ = static_cast<std::byte*>(memory);
}

void SharedMemoryArena::unlink_name() noexcept {
  if (!name_.empty()) shm_unlink(name_.c_str());
  name_.clear();
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

InlineSlot& SharedMemoryArena::inline_slot(int rank, int parity) noexcept {
  std::byte* slots = slot(ranks_) + kSlotBytes;  // after the result area
  return reinterpret_cast<InlineSlot*>(slots)[2 * rank + parity];
}

}  // namespace braid::collectives::detail
