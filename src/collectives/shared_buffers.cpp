#include "collectives/shared_buffers.hpp"

#include <functional>

namespace braid::collectives::detail {

void SharedBufferRegistry::add(std::uint64_t id, std::byte* base, std::size_t region_bytes) {
  std::lock_guard lock(mutex_);
  entries_.push_back({id, {base, region_bytes}});
}

void SharedBufferRegistry::remove(std::uint64_t id) noexcept {
  std::lock_guard lock(mutex_);
  std::erase_if(entries_, [id](const Entry& entry) { return entry.id == id; });
}

SharedBufferRegistry::Location SharedBufferRegistry::locate(const void* data, std::size_t bytes,
                                                            int rank) const {
  const auto* first = static_cast<const std::byte*>(data);
  std::lock_guard lock(mutex_);
  for (const Entry& entry : entries_) {
    const std::byte* region = entry.view.at(rank, 0);
    // std::less gives a total order over pointers into different objects.
    const std::less<const std::byte*> before;
    if (!before(first, region) && before(first, region + entry.view.region_bytes) &&
        bytes <= static_cast<std::size_t>(region + entry.view.region_bytes - first)) {
      return {entry.id, static_cast<std::uint64_t>(first - region), entry.view};
    }
  }
  return {};
}

}  // namespace braid::collectives::detail
