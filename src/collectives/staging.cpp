#include "collectives/staging.hpp"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include <braid/core/config.hpp>
#include <braid/core/enforce.hpp>
#include <braid/core/error.hpp>
#include <braid/core/host_stream.hpp>
#include <braid/core/log.hpp>

namespace braid::collectives::detail {

StagingPlan::StagingPlan(std::size_t bytes, std::size_t element_bytes, std::size_t chunk_bytes,
                         std::size_t slots)
    : bytes_(bytes), slots_(slots) {
  BRAID_ENFORCE(element_bytes > 0 && slots > 0, "a staging plan needs elements and slots");
  // Whole elements per chunk, at least one.
  chunk_bytes_ = std::max(element_bytes, chunk_bytes / element_bytes * element_bytes);
  chunks_ = (bytes + chunk_bytes_ - 1) / chunk_bytes_;
  slot_bytes_ = std::min(chunk_bytes_, bytes);
}

StagingChunk StagingPlan::chunk(std::size_t k) const {
  BRAID_ENFORCE(k < chunks_, "chunk {} of a {}-chunk staging plan", k, chunks_);
  const std::size_t offset = k * chunk_bytes_;
  return {.offset = offset, .bytes = std::min(chunk_bytes_, bytes_ - offset), .slot = k % slots_};
}

std::size_t staging_chunk_bytes() {
  static const std::size_t bytes = [] {
    const std::int64_t kib = config::int_value("BRAID_STAGING_CHUNK_KIB");
    return static_cast<std::size_t>(std::clamp<std::int64_t>(kib, 4, 1 << 20)) * 1024;
  }();
  return bytes;
}

// ---------------------------------------------------------------- host copy engine

struct HostCopyEngine::State {
  CopyObserver on_copy;
  HostStream stream{"braid-staging"};
};

HostCopyEngine::HostCopyEngine(CopyObserver on_copy) : state_(std::make_unique<State>()) {
  state_->on_copy = std::move(on_copy);
}

HostCopyEngine::~HostCopyEngine() = default;

Stream& HostCopyEngine::stream() {
  return state_->stream;
}

void HostCopyEngine::copy(void* dst, const void* src, std::size_t bytes) {
  State* state = state_.get();
  state->stream.enqueue([state, dst, src, bytes] {
    if (state->on_copy) state->on_copy(dst, src, bytes);
    std::memcpy(dst, src, bytes);
  });
}

void HostCopyEngine::follow_producer(Stream* producer) {
  if (producer == nullptr) return;
  // A temporary event: the wait holds its point (host_stream.hpp), so it may go now.
  const std::unique_ptr<Event> produced = producer->make_event();
  producer->record(*produced);
  state_->stream.wait(*produced);
}

StagingMemory HostCopyEngine::allocate(std::size_t bytes) {
  constexpr std::size_t kAlignment = 64;
  const std::size_t rounded =
      std::max<std::size_t>(kAlignment, (bytes + kAlignment - 1) / kAlignment * kAlignment);
  auto* memory = static_cast<std::byte*>(std::aligned_alloc(kAlignment, rounded));
  if (memory == nullptr) throw std::bad_alloc();
  return StagingMemory(memory, [](std::byte* p) { std::free(p); });
}

// ---------------------------------------------------------------- pool

StagingPool::Lease::~Lease() {
  if (memory_ == nullptr) return;
  auto& free = pool_->free_;
  if (free.size() >= pool_->max_cached_) {
    auto smallest = std::min_element(free.begin(), free.end(), [](const Block& a, const Block& b) {
      return a.capacity < b.capacity;
    });
    if (smallest->capacity >= capacity_) return;  // ours is freed instead
    free.erase(smallest);
  }
  free.push_back({std::move(memory_), capacity_});
}

StagingPool::Lease StagingPool::acquire(std::size_t bytes) {
  bytes = std::max<std::size_t>(bytes, 1);
  auto best = free_.end();
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    if (it->capacity >= bytes && (best == free_.end() || it->capacity < best->capacity)) best = it;
  }
  if (best != free_.end()) {
    Lease lease(*this, std::move(best->memory), best->capacity);
    free_.erase(best);
    return lease;
  }
  return Lease(*this, engine_.allocate(bytes), bytes);
}

// ---------------------------------------------------------------- pipelines

namespace {

Buffer host_view(std::byte* data, std::size_t bytes, DType dtype) {
  return Buffer(data, bytes / dtype_size(dtype), dtype);
}

// After a failure the copy stream may still be reading or writing staging memory (and the
// caller's buffers): wait until it has drained before the lease goes back to the pool and
// the error reaches the caller. The wait has a deadline of its own, since the operation's
// may be what just passed. A stream that failed itself has nothing left to drain; one that
// does not drain in time keeps its staging memory, which is then never handed out again.
asio::awaitable<void> drain(CopyEngine& engine, StagingPool::Lease& lease) {
  auto drained = engine.stream().make_event();
  bool done = false;
  try {
    engine.stream().record(*drained);
    co_await wait(*drained, deadline_after(default_timeout()));
    done = true;
  } catch (const Error& e) {
    done = e.code() != make_error_code(Errc::timeout);
  } catch (const std::exception&) {
    done = true;  // the stream failed: nothing of it runs any more
  }
  if (!done) {
    log::error(
        "a staging copy stream did not drain after a failed operation; its staging "
        "memory is abandoned");
    lease.abandon();
  }
}

}  // namespace

asio::awaitable<void> run_elementwise_staged(CopyEngine& engine, StagingPool& pool,
                                             ElementwiseStaging staging, ChunkRunner run_chunk,
                                             Deadline deadline) {
  const Buffer input = staging.input;
  const Buffer output = staging.output;
  const Buffer& shape = staging.copy_in ? input : output;
  const DType dtype = shape.dtype();
  const StagingPlan plan(shape.size_bytes(), dtype_size(dtype), staging.chunk_bytes, kStagingSlots);
  if (plan.chunks() == 0) {
    co_await run_chunk(Buffer(nullptr, 0, dtype));
    co_return;
  }
  StagingPool::Lease lease = pool.acquire(plan.slots() * plan.slot_bytes());
  const auto slot_memory = [&](const StagingChunk& c) {
    return lease.data() + c.slot * plan.slot_bytes();
  };
  Stream& stream = engine.stream();
  std::vector<std::unique_ptr<Event>> brought_in;
  for (std::size_t s = 0; s < plan.slots(); ++s) brought_in.push_back(stream.make_event());
  // Chunk k's slot is ready once everything before this record has run: out(k - S), which
  // emptied the slot, and in(k) when the input is read.
  const auto bring_in = [&](std::size_t k) {
    const StagingChunk c = plan.chunk(k);
    if (staging.copy_in) {
      engine.copy(slot_memory(c), static_cast<const std::byte*>(input.data()) + c.offset, c.bytes);
    }
    stream.record(*brought_in[c.slot]);
  };

  engine.follow_producer(stream_of(input, output));
  std::exception_ptr failure;
  try {
    for (std::size_t k = 0; k < std::min(plan.slots(), plan.chunks()); ++k) bring_in(k);
    for (std::size_t k = 0; k < plan.chunks(); ++k) {
      const StagingChunk c = plan.chunk(k);
      co_await wait(*brought_in[c.slot], deadline);
      co_await run_chunk(host_view(slot_memory(c), c.bytes, dtype));
      if (staging.copy_out) {
        engine.copy(static_cast<std::byte*>(output.data()) + c.offset, slot_memory(c), c.bytes);
      }
      if (k + plan.slots() < plan.chunks()) bring_in(k + plan.slots());
    }
    auto finished = stream.make_event();
    stream.record(*finished);
    co_await wait(*finished, deadline);
  } catch (...) {
    failure = std::current_exception();
  }
  if (failure) {
    co_await drain(engine, lease);
    std::rethrow_exception(failure);
  }
}

asio::awaitable<void> run_whole_staged(CopyEngine& engine, StagingPool& pool, Buffer input,
                                       Buffer output, WholeRunner run, Deadline deadline) {
  const auto* in_begin = static_cast<const std::byte*>(input.data());
  const auto* out_begin = static_cast<const std::byte*>(output.data());
  const std::size_t in_bytes = input.size_bytes();
  const std::size_t out_bytes = output.size_bytes();
  // Host views alias each other exactly as the caller's buffers do.
  const bool overlap = in_bytes != 0 && out_bytes != 0 && in_begin < out_begin + out_bytes &&
                       out_begin < in_begin + in_bytes;
  const std::byte* base = overlap ? std::min(in_begin, out_begin) : nullptr;
  const std::size_t span_bytes =
      overlap
          ? static_cast<std::size_t>(std::max(in_begin + in_bytes, out_begin + out_bytes) - base)
          : in_bytes + out_bytes;
  StagingPool::Lease lease = pool.acquire(span_bytes);
  std::byte* host_in = overlap ? lease.data() + (in_begin - base) : lease.data();
  std::byte* host_out = overlap ? lease.data() + (out_begin - base) : lease.data() + in_bytes;
  const Buffer host_input = in_bytes == 0 ? Buffer(nullptr, 0, input.dtype())
                                          : host_view(host_in, in_bytes, input.dtype());
  const Buffer host_output = out_bytes == 0 ? Buffer(nullptr, 0, output.dtype())
                                            : host_view(host_out, out_bytes, output.dtype());

  Stream& stream = engine.stream();
  auto done = stream.make_event();
  engine.follow_producer(stream_of(input, output));
  std::exception_ptr failure;
  try {
    if (in_bytes != 0) engine.copy(host_in, in_begin, in_bytes);
    stream.record(*done);
    co_await wait(*done, deadline);
    const std::size_t produced = std::min(co_await run(host_input, host_output), out_bytes);
    if (produced != 0) engine.copy(output.data(), host_out, produced);
    stream.record(*done);
    co_await wait(*done, deadline);
  } catch (...) {
    failure = std::current_exception();
  }
  if (failure) {
    co_await drain(engine, lease);
    std::rethrow_exception(failure);
  }
}

}  // namespace braid::collectives::detail
