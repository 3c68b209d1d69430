// Staging: how the UCX communicator moves CUDA buffers when UCX cannot touch GPU memory
// (Debian's UCX is built without CUDA): through host staging memory, in chunks, on a copy
// stream, so the copies of one chunk overlap the network work of its neighbours.
//
// The pieces are written against the Stream/Event contract (stream.hpp) and a CopyEngine,
// so the same pipeline runs with a CUDA stream and pinned memory (CudaCopyEngine) or with
// a host stream and memcpy (HostCopyEngine), which is how CI tests it without a GPU.
//
// Element-wise pipeline (all_reduce, broadcast, reduce: chunk k of the result depends on
// chunk k of the input only), S staging slots, one in-order copy stream:
//
//   copy stream:  in(0) in(1) .. in(S-1) | out(0) in(S) | out(1) in(S+1) | ...
//   runtime:                 run(0) ------^      run(1) --^
//
// in(k) copies chunk k to slot k % S, out(k) copies it back. Because the copy stream is in
// order, in(k+S) starts only after out(k) has drained slot k % S: a slot is never
// overwritten while in use, without a lock. While run(k) moves chunk k over the network,
// the copy engine brings in up to S-1 chunks ahead and takes out the one behind.
// Cost: one extra copy each way per byte (device <-> host at PCIe/C2C speed) overlapped
// with the network for all but the first and last chunk; S * chunk bytes of staging.
//
// Whole-buffer staging (every other collective: all_gather, all_to_all, ... whose output
// chunks depend on all the input) copies the input in (chunk by chunk, one event), runs
// once, copies the output out: correct for any collective, without overlap.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <vector>

#include <boost/asio/awaitable.hpp>

#include <braid/core/buffer.hpp>
#include <braid/core/deadline.hpp>
#include <braid/core/stream.hpp>

namespace braid::collectives::detail {

// Chunks of a staged transfer: `bytes` cut into pieces of at most `chunk_bytes`, chunk k
// using slot k % slots. Chunk boundaries fall on whole elements of `element_bytes`.
struct StagingChunk {
  std::size_t offset = 0;  // bytes from the start of the buffer
  std::size_t bytes = 0;
  std::size_t slot = 0;
};

class StagingPlan {
 public:
  StagingPlan(std::size_t bytes, std::size_t element_bytes, std::size_t chunk_bytes,
              std::size_t slots);

  std::size_t chunks() const noexcept { return chunks_; }
  std::size_t slots() const noexcept { return slots_; }
  // Bytes one slot holds: the chunk size, or the whole transfer when that is smaller.
  std::size_t slot_bytes() const noexcept { return slot_bytes_; }
  StagingChunk chunk(std::size_t k) const;

 private:
  std::size_t bytes_;
  std::size_t chunk_bytes_;
  std::size_t slots_;
  std::size_t chunks_;
  std::size_t slot_bytes_;
};

// BRAID_STAGING_CHUNK_KIB, read once.
std::size_t staging_chunk_bytes();
inline constexpr std::size_t kStagingSlots = 3;

// Memory the engine's copies are fastest to and from (pinned host memory for CUDA).
using StagingMemory = std::unique_ptr<std::byte, void (*)(std::byte*)>;

// Copies between the caller's memory and staging memory, in order, on one stream.
class CopyEngine {
 public:
  virtual ~CopyEngine() = default;
  virtual Stream& stream() = 0;
  // Enqueues a copy of `bytes` bytes on stream(); returns at once.
  virtual void copy(void* dst, const void* src, std::size_t bytes) = 0;
  virtual StagingMemory allocate(std::size_t bytes) = 0;
  // Makes stream() wait for the work already enqueued by whoever produced the caller's
  // buffers, so copies never read half-written data: `producer` where the buffer names
  // its stream (Buffer::on_stream; of stream()'s kind), else the engine's default (the
  // communicator's CUDA stream; none for the host engine).
  virtual void follow_producer(Stream* producer) = 0;
};

// A host stream and memcpy: the CPU stand-in for the GPU's copy engine. Copies run on the
// stream's worker thread; `on_copy` (tests) sees each one as it runs. It follows a host
// producer stream a buffer names, as CUDA's engine follows a CUDA one.
class HostCopyEngine final : public CopyEngine {
 public:
  using CopyObserver = std::function<void(void* dst, const void* src, std::size_t bytes)>;
  explicit HostCopyEngine(CopyObserver on_copy = {});
  ~HostCopyEngine() override;
  Stream& stream() override;
  void copy(void* dst, const void* src, std::size_t bytes) override;
  StagingMemory allocate(std::size_t bytes) override;
  void follow_producer(Stream* producer) override;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

// Staging memory reused across operations (pinned allocations cost milliseconds). Runtime
// thread only. Blocks come back when their lease ends.
class StagingPool {
 public:
  class Lease {
   public:
    Lease(StagingPool& pool, StagingMemory memory, std::size_t capacity)
        : pool_(&pool), memory_(std::move(memory)), capacity_(capacity) {}
    Lease(Lease&&) noexcept = default;
    Lease& operator=(Lease&&) = delete;
    ~Lease();
    std::byte* data() const noexcept { return memory_.get(); }
    // Leaks the memory on purpose: a copy that could not be stopped may still write it.
    void abandon() noexcept { (void)memory_.release(); }

   private:
    StagingPool* pool_;
    StagingMemory memory_;
    std::size_t capacity_;
  };

  explicit StagingPool(CopyEngine& engine, std::size_t max_cached = 4)
      : engine_(engine), max_cached_(max_cached) {}
  Lease acquire(std::size_t bytes);

 private:
  struct Block {
    StagingMemory memory;
    std::size_t capacity;
  };
  CopyEngine& engine_;
  std::size_t max_cached_;
  std::vector<Block> free_;
};

using ChunkRunner = std::function<asio::awaitable<void>(Buffer host_chunk)>;

struct ElementwiseStaging {
  Buffer input;             // the caller's (device) input
  Buffer output;            // the caller's (device) output; the same memory in place
  bool copy_in = true;      // false where the input is not read (broadcast's receivers)
  bool copy_out = true;     // false where the output is not written (reduce's non-roots)
  std::size_t chunk_bytes;  // staging_chunk_bytes() outside tests
};

// Runs `run_chunk` on each chunk's staging slot, in order, as the pipeline above.
asio::awaitable<void> run_elementwise_staged(CopyEngine& engine, StagingPool& pool,
                                             ElementwiseStaging staging, ChunkRunner run_chunk,
                                             Deadline deadline);

// Returns how many bytes of the output it produced (all of them, but for a receive).
using WholeRunner =
    std::function<asio::awaitable<std::size_t>(Buffer host_input, Buffer host_output)>;

// Copies `input` to staging memory, runs `run` on host views that alias each other as the
// caller's buffers do (the same memory, one inside the other, or disjoint), and copies
// back the first bytes of `output` that `run` says it produced. Either buffer may be
// empty (a rooted collective's non-root side, a send, a receive).
asio::awaitable<void> run_whole_staged(CopyEngine& engine, StagingPool& pool, Buffer input,
                                       Buffer output, WholeRunner run, Deadline deadline);

// A copy engine and the staging memory it copies through, for one device.
struct StagingResources {
  std::unique_ptr<CopyEngine> engine;
  std::unique_ptr<StagingPool> pool;
};

}  // namespace braid::collectives::detail
