// Single copy (arena_turn.hpp): reading and writing peers' buffers, through this process's
// mapping where every rank's lie in one allocate_shared allocation, else through
// cross-memory attach, and the error that names the rank where that fails.
#include <cerrno>
#include <cstring>

#include <fmt/format.h>

#include <braid/core/error.hpp>

#include "collectives/algorithms/arena_turn.hpp"
#include "collectives/cross_memory.hpp"

namespace braid::collectives::detail {

const std::byte* ArenaTurn::mapped_input(int rank) noexcept {
  return mapped_input_.at(rank, arena_.record(rank).shared_input_offset);
}

std::byte* ArenaTurn::mapped_output(int rank) noexcept {
  return mapped_output_.at(rank, arena_.record(rank).shared_output_offset);
}

void ArenaTurn::read_input(int rank, std::size_t offset, void* into, std::size_t bytes) {
  if (mapped()) {
    std::memcpy(into, mapped_input(rank) + offset, bytes);
  } else {
    read(rank, arena_.record(rank).input + offset, into, bytes);
  }
}

void ArenaTurn::read_output(int rank, std::size_t offset, void* into, std::size_t bytes) {
  if (mapped()) {
    std::memcpy(into, mapped_output(rank) + offset, bytes);
  } else {
    read(rank, arena_.record(rank).output + offset, into, bytes);
  }
}

void ArenaTurn::read(int rank, std::uint64_t remote, void* into, std::size_t bytes) {
  const int error = read_process_memory(arena_.record(rank).pid, remote, into, bytes);
  if (error != 0) cross_memory_failed(rank, error, "read");
}

void ArenaTurn::write_output(int rank, std::size_t offset, const void* from, std::size_t bytes) {
  if (mapped()) {
    std::memcpy(mapped_output(rank) + offset, from, bytes);
    return;
  }
  const RankRecord& peer = arena_.record(rank);
  const int error = write_process_memory(peer.pid, peer.output + offset, from, bytes);
  if (error != 0) cross_memory_failed(rank, error, "write");
}

void ArenaTurn::cross_memory_failed(int rank, int error, std::string_view what) {
  if (error == ESRCH) {
    // Its process is gone: the same failure a dead peer is everywhere else.
    throw Error(
        Errc::peer_failed,
        fmt::format("rank {}'s process ({}) is gone; its buffer cannot be {}", op_.world_rank(rank),
                    arena_.record(rank).pid, what == "read" ? "read" : "written"),
        {.rank = op_.world_rank(op_.rank()), .peer = op_.world_rank(rank)});
  }
  throw Error(std::error_code(error, std::generic_category()),
              fmt::format("cannot {} rank {}'s buffer (process {}) through cross-memory attach",
                          what, op_.world_rank(rank), arena_.record(rank).pid),
              {.rank = op_.world_rank(op_.rank()), .peer = op_.world_rank(rank)});
}

}  // namespace braid::collectives::detail
