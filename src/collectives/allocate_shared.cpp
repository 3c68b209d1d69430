// Communicator::allocate_shared (communicator.hpp): memory every member on this node maps.
//
// Three steps, each a small collective at a sequence number reserved at the call:
//   1. an all-gather of every rank's size: a difference fails on every rank alike;
//   2. rank 0 creates one segment of P page-rounded regions and broadcasts its name (an
//      empty name if it could not: every rank falls back to private memory);
//   3. the others map it, and an all-gather of who could tells every rank whether all
//      did; if so rank 0 removes the name (the mappings stay), else everyone falls back.
// A rank that fails or dies part way leaves no name behind: the segment's owner removes
// it as it unwinds.
#include <algorithm>
#include <array>
#include <cstdlib>
#include <cstring>
#include <new>

#include <fmt/format.h>

#include <braid/collectives/communicator.hpp>
#include <braid/core/error.hpp>
#include <braid/core/log.hpp>
#include <braid/transport/world.hpp>

#include "collectives/communicator_state.hpp"
#include "collectives/shared_buffers.hpp"
#include "collectives/shared_memory_arena.hpp"
#include "collectives/shared_segment.hpp"

namespace braid::collectives {
namespace {

constexpr std::size_t kPageBytes = 4096;
constexpr std::size_t kNameBytes = 128;

std::size_t region_bytes_for(std::size_t bytes) {
  return std::max<std::size_t>((bytes + kPageBytes - 1) / kPageBytes, 1) * kPageBytes;
}

// Where nothing can be shared: page-aligned and zeroed, like a region.
std::shared_ptr<std::byte[]> private_memory(std::size_t bytes) {
  const std::size_t rounded = region_bytes_for(bytes);
  void* memory = std::aligned_alloc(kPageBytes, rounded);
  if (memory == nullptr) throw std::bad_alloc();
  std::memset(memory, 0, rounded);
  return {static_cast<std::byte*>(memory), [](std::byte* p) { std::free(p); }};
}

// One allocation: its mapping and its entry in the registry, which go together.
struct SharedAllocation {
  detail::SharedSegment segment;
  std::shared_ptr<detail::SharedBufferRegistry> registry;
  std::uint64_t id = 0;

  ~SharedAllocation() {
    if (registry) registry->remove(id);
  }
};

}  // namespace

asio::awaitable<std::shared_ptr<std::byte[]>> Communicator::allocate_shared(std::size_t bytes) {
  // Three collectives, numbered now so the allocation keeps its place in the order; and
  // the allocation's number, the same on every rank because calls are made in one order.
  const std::uint64_t sequence = state_->next_sequence_.fetch_add(3);
  const std::uint64_t id = state_->shared_allocations_.fetch_add(1) + 1;
  std::shared_ptr<Communicator> self = shared_from_this();
  return state_->run_allocate_shared(std::move(self), sequence, id, bytes,
                                     deadline_after(state_->timeout_));
}

asio::awaitable<std::shared_ptr<std::byte[]>> Communicator::State::run_allocate_shared(
    std::shared_ptr<Communicator> self, std::uint64_t sequence, std::uint64_t id, std::size_t bytes,
    Deadline deadline) {
  const auto members = static_cast<std::size_t>(size());
  std::vector<std::int64_t> mine{static_cast<std::int64_t>(bytes)};
  std::vector<std::int64_t> sizes(members);
  co_await run_step(self, CollectiveKind::all_gather, Buffer(mine), Buffer(sizes), sequence,
                    deadline);
  for (std::size_t r = 1; r < members; ++r) {
    if (sizes[r] == sizes[0]) continue;
    throw Error(Errc::size_mismatch,
                fmt::format("allocate_shared: rank {} asks for {} bytes but rank {} for {}; "
                            "every rank must ask for the same size",
                            world_rank(0), sizes[0], world_rank(static_cast<int>(r)), sizes[r]),
                {.rank = world_rank(rank_),
                 .peer = world_rank(rank_ == 0 ? static_cast<int>(r) : 0),
                 .operation = "allocate_shared"});
  }
  if (arena_ == nullptr) co_return private_memory(bytes);  // spans nodes, or a world of one

  const std::size_t region = region_bytes_for(bytes);
  auto allocation = std::make_shared<SharedAllocation>();
  std::array<char, kNameBytes> name{};
  if (rank_ == 0) {
    try {
      allocation->segment = detail::SharedSegment::create(region * members);
      const std::string& created = allocation->segment.name();
      std::memcpy(name.data(), created.data(), std::min(created.size(), kNameBytes - 1));
    } catch (const Error& error) {
      log::warn("allocate_shared: {}; every rank gets private memory instead", error.what());
    }
  }
  co_await run_step(self, CollectiveKind::broadcast, Buffer(name.data(), name.size(), DType::u8),
                    Buffer(name.data(), name.size(), DType::u8), sequence + 1, deadline);
  if (name[0] == '\0') co_return private_memory(bytes);
  if (rank_ != 0) {
    try {
      allocation->segment = detail::SharedSegment::open(std::string(name.data()), region * members);
    } catch (const Error& error) {
      log::warn("allocate_shared: {}; every rank gets private memory instead", error.what());
    }
  }
  std::vector<std::uint8_t> mapped{static_cast<std::uint8_t>(allocation->segment ? 1 : 0)};
  std::vector<std::uint8_t> everyone_mapped(members);
  co_await run_step(self, CollectiveKind::all_gather, Buffer(mapped), Buffer(everyone_mapped),
                    sequence + 2, deadline);
  allocation->segment.unlink_name();  // rank 0: every rank that could map it has
  if (std::find(everyone_mapped.begin(), everyone_mapped.end(), 0) != everyone_mapped.end()) {
    co_return private_memory(bytes);
  }
  std::byte* base = allocation->segment.data();
  allocation->registry = arena_->shared_buffers();
  allocation->id = id;
  allocation->registry->add(id, base, region);
  co_return std::shared_ptr<std::byte[]>(allocation,
                                         base + static_cast<std::size_t>(rank_) * region);
}

}  // namespace braid::collectives
