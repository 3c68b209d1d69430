#include "collectives/scratch_pool.hpp"

#include <algorithm>
#include <new>
#include <utility>

namespace braid::collectives::detail {
namespace {

constexpr std::size_t kAlignment = 64;  // a cache line, and whole vector registers

std::byte* aligned(std::byte* memory) {
  const auto address = reinterpret_cast<std::uintptr_t>(memory);
  return memory + ((kAlignment - address % kAlignment) % kAlignment);
}

}  // namespace

ScratchPool::Lease::Lease(Lease&& other) noexcept
    : pool_(std::exchange(other.pool_, nullptr)),
      block_(std::move(other.block_)),
      data_(std::exchange(other.data_, nullptr)),
      bytes_(std::exchange(other.bytes_, 0)),
      capacity_(std::exchange(other.capacity_, 0)) {}

ScratchPool::Lease& ScratchPool::Lease::operator=(Lease&& other) noexcept {
  if (this != &other) {
    give_back();
    pool_ = std::exchange(other.pool_, nullptr);
    block_ = std::move(other.block_);
    data_ = std::exchange(other.data_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
    capacity_ = std::exchange(other.capacity_, 0);
  }
  return *this;
}

ScratchPool::Lease::~Lease() {
  give_back();
}

void ScratchPool::Lease::give_back() noexcept {
  if (pool_ != nullptr && block_ != nullptr) pool_->give_back(std::move(block_), capacity_);
  pool_ = nullptr;
  data_ = nullptr;
}

Buffer ScratchPool::Lease::buffer(DType dtype, std::size_t count) const {
  BRAID_ENFORCE(count * dtype_size(dtype) <= bytes_,
                "scratch of {} bytes cannot hold {} elements of {}", bytes_, count,
                to_string(dtype));
  return Buffer(count == 0 ? nullptr : data_, count, dtype);
}

ScratchPool::Lease ScratchPool::acquire(std::size_t bytes) {
  Lease lease;
  lease.pool_ = this;
  lease.bytes_ = bytes;
  // The smallest cached block that fits.
  auto best = free_.end();
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    if (it->capacity >= bytes && (best == free_.end() || it->capacity < best->capacity)) best = it;
  }
  if (best != free_.end()) {
    lease.block_ = std::move(best->memory);
    lease.capacity_ = best->capacity;
    free_.erase(best);
  } else {
    lease.capacity_ = std::max<std::size_t>(bytes, kAlignment);
    lease.block_.reset(new std::byte[lease.capacity_ + kAlignment]);
  }
  lease.data_ = aligned(lease.block_.get());
  return lease;
}

void ScratchPool::give_back(std::unique_ptr<std::byte[]> memory, std::size_t capacity) noexcept {
  if (free_.size() >= max_cached_) {
    // Keep the largest blocks: they are the expensive ones to fault in again.
    auto smallest =
        std::min_element(free_.begin(), free_.end(),
                         [](const Block& a, const Block& b) { return a.capacity < b.capacity; });
    if (smallest->capacity >= capacity) return;  // `memory` is freed on return
    free_.erase(smallest);
  }
  try {
    free_.push_back({std::move(memory), capacity});
  } catch (...) {
    // Out of memory while caching: the block is simply freed.
  }
}

}  // namespace braid::collectives::detail
