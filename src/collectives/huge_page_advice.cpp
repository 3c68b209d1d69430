#include "collectives/huge_page_advice.hpp"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <sys/mman.h>

#include <braid/core/config.hpp>
#include <braid/core/log.hpp>

#ifndef MADV_COLLAPSE
#define MADV_COLLAPSE 25  // Linux 6.1; older headers lack it, older kernels say EINVAL
#endif

namespace braid::collectives::detail {
namespace {

constexpr std::uintptr_t kHugePageBytes = std::uintptr_t{2} << 20;

// The whole huge pages inside `bytes` at `begin`: [first, last), empty where last <= first.
struct WholePages {
  std::uintptr_t first;
  std::uintptr_t last;
  std::size_t bytes() const noexcept { return last > first ? last - first : 0; }
};
WholePages whole_pages(std::uintptr_t begin, std::size_t bytes) noexcept {
  return {.first = (begin + kHugePageBytes - 1) & ~(kHugePageBytes - 1),
          .last = (begin + bytes) & ~(kHugePageBytes - 1)};
}

// Whether this kernel knows MADV_COLLAPSE (Linux 6.1). madvise rejects an advice it does
// not know with EINVAL before it looks at the range, and succeeds on an empty range for
// one it knows: so an empty call asks, without collapsing anything. Asked once.
bool kernel_collapses() noexcept {
  static const bool collapses = [] {
    alignas(4096) static char page[4096];
    return ::madvise(page, 0, MADV_COLLAPSE) == 0;
  }();
  return collapses;
}

}  // namespace

HugePageAdvice::HugePageAdvice()
    : enabled_(config::bool_value("BRAID_HUGE_PAGES") && kernel_collapses()) {}

bool HugePageAdvice::note(const void* data, std::size_t bytes) noexcept {
  if (!enabled_ || bytes < kSmallestBytes) return false;
  const auto begin = reinterpret_cast<std::uintptr_t>(data);
  auto same = [&](const Seen& s) { return s.begin == begin && s.bytes == bytes; };
  auto found = std::find_if(seen_.begin(), seen_.end(), same);
  if (found == seen_.end()) {
    seen_[next_] = {.begin = begin, .bytes = bytes};
    next_ = (next_ + 1) % seen_.size();
    return false;
  }
  if (found->advised) return false;
  // Only whole huge pages inside the buffer: the memory around it is someone else's.
  const WholePages inside = whole_pages(begin, bytes);
  if (inside.bytes() == 0) {
    found->advised = true;
    return false;
  }
  if (::madvise(reinterpret_cast<void*>(inside.first), inside.bytes(), MADV_COLLAPSE) != 0) {
    // Memory the kernel will not collapse (file-backed, locked), or no huge page free now:
    // this buffer stays as it is (or partly moved); others may still move.
    const int error = errno;
    const bool passing = error == EAGAIN || error == ENOMEM;
    found->advised = !passing || ++found->tries >= kCollapseTries;
    log::debug("huge pages: madvise(MADV_COLLAPSE) of {} bytes left the buffer as it was: {}{}",
               inside.bytes(), std::strerror(error), found->advised ? "" : " (will try again)");
    return false;
  }
  found->advised = true;
  return true;
}

}  // namespace braid::collectives::detail
