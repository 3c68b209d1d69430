#include "huge_page_advice.hpp"

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

}  // namespace

HugePageAdvice::HugePageAdvice() : enabled_(config::bool_value("BRAID_HUGE_PAGES")) {}

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
  found->advised = true;
  // Only whole huge pages inside the buffer: the memory around it is someone else's.
  const std::uintptr_t first = (begin + kHugePageBytes - 1) & ~(kHugePageBytes - 1);
  const std::uintptr_t last = (begin + bytes) & ~(kHugePageBytes - 1);
  if (last <= first) return false;
  if (::madvise(reinterpret_cast<void*>(first), last - first, MADV_COLLAPSE) != 0) {
    const int error = errno;
    // EINVAL: a kernel before 6.1 (then no buffer will do) or memory it will not collapse.
    if (error == EINVAL) enabled_ = false;
    log::debug("huge pages: madvise(MADV_COLLAPSE) of {} bytes left the buffer as it was: {}",
               last - first, std::strerror(error));
    return false;
  }
  return true;
}

}  // namespace braid::collectives::detail
