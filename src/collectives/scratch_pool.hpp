// Scratch memory for collectives, reused across operations.
//
// Why a pool: a fresh 16 MiB allocation is an mmap whose every page faults on first touch
// (~4000 faults, a few milliseconds), which would dominate a large all-reduce repeated
// every training step. Blocks come back to the pool when a lease ends and are handed out
// again to the next operation that fits; at most `max_cached` blocks are kept.
//
// Runtime thread only (collectives run there), so nothing is locked.
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

#include <braid/core/buffer.hpp>

namespace braid::collectives::detail {

class ScratchPool {
 public:
  class Lease {
   public:
    Lease() = default;
    Lease(Lease&& other) noexcept;
    Lease& operator=(Lease&& other) noexcept;
    Lease(const Lease&) = delete;
    Lease& operator=(const Lease&) = delete;
    ~Lease();

    std::byte* data() const noexcept { return data_; }
    std::size_t size_bytes() const noexcept { return bytes_; }
    // The first `count` elements of the block as a Buffer of `dtype`.
    Buffer buffer(DType dtype, std::size_t count) const;

   private:
    friend class ScratchPool;
    void give_back() noexcept;

    ScratchPool* pool_ = nullptr;
    std::unique_ptr<std::byte[]> block_;
    std::byte* data_ = nullptr;
    std::size_t bytes_ = 0;     // asked for
    std::size_t capacity_ = 0;  // allocated
  };

  explicit ScratchPool(std::size_t max_cached = 8) : max_cached_(max_cached) {}

  // A block of at least `bytes` bytes, 64-byte aligned.
  Lease acquire(std::size_t bytes);

 private:
  struct Block {
    std::unique_ptr<std::byte[]> memory;
    std::size_t capacity = 0;
  };
  void give_back(std::unique_ptr<std::byte[]> memory, std::size_t capacity) noexcept;

  std::size_t max_cached_;
  std::vector<Block> free_;
};

}  // namespace braid::collectives::detail
