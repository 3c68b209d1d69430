// What the files of Communicator's implementation share (communicator.cpp,
// communicator_entry_points.cpp, communicator_point_to_point.cpp, communicator_cuda.cpp):
// the inputs of its calls' checks, and keeping a routed call's NCCL communicator alive.
#pragma once

#include <memory>
#include <utility>

#include <boost/asio/awaitable.hpp>

#include <braid/collectives/communicator.hpp>

#include "collectives/call_checks.hpp"
#include "collectives/communicator_state.hpp"

namespace braid::collectives::detail {

// The calls' checks (call_checks.hpp): the error names the world rank; buffers are host
// memory, or CUDA memory where the communicator can stage it.
inline CallSite site_of(const Communicator& comm) {
  return {.rank = comm.rank(),
          .size = comm.size(),
          .world_rank = comm.size() > 0 ? comm.world_rank(comm.rank()) : -1};
}

inline MemoryRule memory_rule_of(const Communicator& comm) {
  return host_or_staged_memory(comm.accepts_cuda_buffers());
}

// Keeps the NCCL communicator alive from the call until the operation is done.
template <class T>
asio::awaitable<T> holding(std::shared_ptr<NcclCommunicator> nccl, asio::awaitable<T> operation) {
  (void)nccl;
  co_return co_await std::move(operation);
}

}  // namespace braid::collectives::detail
