// SharedBufferRegistry: the memory Communicator::allocate_shared handed out on this
// communicator, which every member maps, so that a collective can tell whether its
// buffers lie in it and where a peer's buffer is in this process.
//
// An allocation is one SharedSegment of P regions of equal size, region r holding rank
// r's buffers; every member maps all of it. Allocations are numbered in call order, the
// same on every rank (1, 2, ...), so a rank names one to the others by number and offset.
// The registry is shared by the arena and every live allocation, either of which may go
// first; its entries come and go from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <vector>

namespace braid::collectives::detail {

class SharedBufferRegistry {
 public:
  // An allocation as this process maps it: where every rank's region is.
  struct View {
    std::byte* base = nullptr;  // region 0 in this process; null: not mapped here
    std::size_t region_bytes = 0;
    std::byte* at(int rank, std::uint64_t offset) const noexcept {
      return base + static_cast<std::size_t>(rank) * region_bytes + offset;
    }
  };
  // Where a buffer lies: in allocation `id` (0: in none), at `offset` bytes into the
  // region of the rank that asked, and where that allocation's regions are here.
  struct Location {
    std::uint64_t id = 0;
    std::uint64_t offset = 0;
    View view;
  };

  void add(std::uint64_t id, std::byte* base, std::size_t region_bytes);
  void remove(std::uint64_t id) noexcept;
  // The allocation whose region `rank` holds [data, data + bytes) entirely.
  Location locate(const void* data, std::size_t bytes, int rank) const;

 private:
  struct Entry {
    std::uint64_t id;
    View view;
  };
  mutable std::mutex mutex_;
  std::vector<Entry> entries_;  // a handful: one per bucket set, say
};

}  // namespace braid::collectives::detail
