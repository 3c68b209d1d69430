// SharedMemoryArena: a POSIX shared-memory segment that the members of a communicator on
// one node map, for collectives that move data through memory instead of messages.
//
// Why: between processes on one node UCX 1.13 copies every byte twice through its
// shared-memory FIFO (no zero-copy lane for error-handling endpoints), and a ring
// all-reduce sends each byte 2(P-1)/P times. Through a segment every rank copies its
// input in once, reduces 1/P of the vector reading every rank's copy, and copies the
// result out once: about five bytes of memory traffic per input byte, whatever P.
//
// Layout: a header of per-rank flags (each on its own cache line), then one staging slot
// of kSlotBytes per rank, then a result area of kSlotBytes. The segment is created by
// the first operation that needs it (rank 0 creates and names it, the others map it and
// say so, rank 0 unlinks the name), so a crash never leaves it behind in /dev/shm.
//
// Operations using the arena run one at a time, in the order they were issued (tickets
// handed out at the call, like sequence numbers), and only on the runtime thread.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>

namespace braid::collectives::detail {

class SharedMemoryArena {
 public:
  static constexpr std::size_t kSlotBytes = std::size_t{2} << 20;
  static constexpr std::size_t kFlagStride = 64;

  explicit SharedMemoryArena(int ranks) : ranks_(ranks) {}
  ~SharedMemoryArena();
  SharedMemoryArena(const SharedMemoryArena&) = delete;
  SharedMemoryArena& operator=(const SharedMemoryArena&) = delete;

  std::size_t segment_bytes() const noexcept;
  bool mapped() const noexcept { return base_ != nullptr; }
  // Rank 0: creates the segment under a fresh name and maps it; returns the name.
  std::string create();
  // The others: maps the segment rank 0 created.
  void open(const std::string& name);
  // Rank 0, once every rank has mapped it: removes the name (the mappings stay).
  void unlink_name() noexcept;

  // Flag `which` (0: arrived, 1: reduced) of `rank`: the last chunk generation it reached.
  std::atomic_ref<std::uint64_t> flag(int rank, int which) noexcept;
  std::byte* slot(int rank) noexcept;
  std::byte* result() noexcept;

  // Issue order: a ticket at the call, served in order.
  std::uint64_t take_ticket() noexcept { return next_ticket_.fetch_add(1); }
  std::uint64_t serving() const noexcept { return serving_; }
  void done_serving() noexcept { ++serving_; }
  // The next chunk's generation (1, 2, ...), the same on every rank.
  std::uint64_t next_generation() noexcept { return ++generation_; }
  // After a failed operation the flags no longer agree across ranks.
  bool broken() const noexcept { return broken_; }
  void mark_broken() noexcept { broken_ = true; }

 private:
  int ranks_;
  std::byte* base_ = nullptr;
  std::string name_;
  std::atomic<std::uint64_t> next_ticket_{0};
  std::uint64_t serving_ = 0;
  std::uint64_t generation_ = 0;
  bool broken_ = false;
};

}  // namespace braid::collectives::detail
