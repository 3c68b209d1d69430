// The argument checks of every entry point of both communicators, in one place, as NCCL's
// ArgsCheck serves all of its own: an entry point describes its call in a CollectiveCall
// and check_call() validates it, before the call takes a place in any order. Communicator
// and NcclCommunicator differ in one rule only, which memory their buffers may be in; each
// passes its MemoryRule. A failed check throws Error(Errc::invalid_argument), naming the
// rank and the operation.
#pragma once

#include <cstddef>
#include <functional>
#include <span>
#include <string>
#include <string_view>

#include <braid/core/buffer.hpp>

#include "collectives/collective_call.hpp"

namespace braid::collectives::detail {

// Who calls, for the checks (rank, size) and for the error (world rank, and the operation
// as "all_reduce" for Communicator, "nccl all_reduce" for communicator "nccl").
struct CallSite {
  int rank = 0;  // in the communicator
  int size = 0;
  int world_rank = -1;
  std::string_view communicator;
};

// Where a communicator's buffers may be: why `buffer` (the call's `name`: input, output,
// buffer) is refused, or an empty string where it is accepted.
using MemoryRule = std::function<std::string(const Buffer& buffer, std::string_view name)>;

// Communicator: host memory, and CUDA memory where it can stage it (`stages_cuda`).
MemoryRule host_or_staged_memory(bool stages_cuda);
// NcclCommunicator: CUDA memory of `device`. An empty buffer passes wherever it is.
MemoryRule device_memory(int device);

// The sum of counts, or SIZE_MAX where it would wrap around: no buffer holds that many
// elements, so the size checks that compare with it fail instead of passing on a wrapped
// sum (which would send the shared-memory paths outside the buffers).
std::size_t sum_of_counts(std::span<const std::size_t> counts);

// "all_reduce"; "all_gather_v" and "all_to_all_v" for the variable forms.
std::string_view operation_name(const CollectiveCall& call) noexcept;

// A collective's arguments: its root, where its buffers are, their dtypes and counts (the
// _v forms' counts, summed without wrapping around), and that input and output are the
// same memory (in place, as NCCL defines it: for reduce_scatter, all_gather, gather and
// scatter the rank's block of the whole buffer) or none in common. At a rooted call's
// other ranks, only the buffer they pass is checked.
void check_call(const CollectiveCall& call, const CallSite& site, const MemoryRule& memory);

// send and recv: the peer is a rank of the communicator, the buffer where it may be.
void check_point_to_point(std::string_view operation, const Buffer& data, int peer,
                          const CallSite& site, const MemoryRule& memory);

// The in-place reduce_scatter and all_gather (`kind`): this rank's block of `whole`, which
// must split into site.size equal blocks.
Buffer rank_block(CollectiveKind kind, const Buffer& whole, const CallSite& site);

}  // namespace braid::collectives::detail
