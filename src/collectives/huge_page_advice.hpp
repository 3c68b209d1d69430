// Backs the buffers that peers reach by cross-memory attach with transparent huge pages,
// once a buffer shows that it is reused.
//
// Why: process_vm_readv/writev pin the other process's pages for every call. On 4 KiB
// pages that pinning (a page-table walk and a reference count per page) took a quarter of
// a large all-reduce's CPU time on the dev VM, more than the reduction itself; a 2 MiB
// page is pinned in one step. Memory from malloc or libtorch is on 4 KiB pages unless the
// system backs everything with huge pages (/sys/kernel/mm/transparent_hugepage/enabled is
// "madvise" on Debian), so a buffer that a collective sees for the second time (a
// training step's gradients, a benchmark's vectors) is collapsed onto huge pages with
// madvise(MADV_COLLAPSE) (Linux 6.1). The contents do not change; only the 2 MiB-aligned
// stretches wholly inside the buffer are touched, so no neighbouring memory is.
// Measured (braid-bench collectives, 2 ranks, plain buffers, AMD EPYC VM): 4-64 MiB
// all-reduce 1.8-2.3x faster.
// Cost: the collapse copies the buffer once (about a memcpy of it, on the runtime
// thread, at its second use); a buffer seen only once pays nothing. On a kernel without
// MADV_COLLAPSE (asked once per process) the advice is off; memory the kernel refuses
// (file-backed, locked) is left as it is, and other buffers still move.
// BRAID_HUGE_PAGES=0 turns it off.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

namespace braid::collectives::detail {

class HugePageAdvice {
 public:
  // Buffers smaller than this are left alone: they span at most one huge page.
  static constexpr std::size_t kSmallestBytes = std::size_t{4} << 20;
  // A collapse that failed for want of a free huge page (EAGAIN, ENOMEM: fragmented memory,
  // a passing shortage) is tried again at the buffer's next uses, this many times in all;
  // any other failure, once. Pages it did move stay moved; a retry skips them.
  static constexpr int kCollapseTries = 3;

  // From BRAID_HUGE_PAGES, and off on a kernel without MADV_COLLAPSE.
  HugePageAdvice();
  explicit HugePageAdvice(bool enabled) noexcept : enabled_(enabled) {}

  // `bytes` at `data` are about to be read or written by peers through cross-memory
  // attach. Returns true when this call collapsed the buffer onto huge pages.
  bool note(const void* data, std::size_t bytes) noexcept;

 private:
  struct Seen {
    std::uintptr_t begin = 0;
    std::size_t bytes = 0;
    bool advised = false;  // collapsed, or given up on: never tried again
    int tries = 0;         // collapses the kernel could not finish for want of a free page
  };
  bool enabled_;
  // The buffers seen most recently: a gradient bucket set or a benchmark's vectors fit.
  std::array<Seen, 16> seen_{};
  std::size_t next_ = 0;  // the slot the next new buffer replaces
};

}  // namespace braid::collectives::detail
