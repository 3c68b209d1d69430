// One call to a collective, as its entry point describes it: the checks both communicators
// share read it (call_checks.hpp), and Communicator carries it on to its algorithm.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include <braid/collectives/algorithm.hpp>
#include <braid/core/buffer.hpp>
#include <braid/core/deadline.hpp>
#include <braid/core/reduce_op.hpp>

namespace braid::collectives {
struct HierarchyPlan;
class SelectionTable;
}  // namespace braid::collectives

namespace braid::collectives::detail {

struct CollectiveCall {
  CollectiveKind kind = CollectiveKind::barrier;
  Buffer input;
  Buffer output;
  ReduceOp reduce_op = ReduceOp::sum;
  int root = -1;
  std::span<const std::size_t> counts;       // all_gather_v; all_to_all_v: send counts
  std::span<const std::size_t> recv_counts;  // all_to_all_v
  bool variable = false;                     // the _v forms
  bool staged = false;    // a chunk or copy of a call on CUDA buffers, staged through host memory
  std::size_t bytes = 0;  // the size the selection table sees
  Algorithm algorithm = Algorithm::dissemination;
  std::uint64_t sequence = 0;
  Deadline deadline;
  // shared_memory: the arena and this call's place in its order.
  class SharedMemoryArena* arena = nullptr;
  std::uint64_t arena_ticket = 0;
  // hierarchical: the communicator's plan, and its table for the cross-node phase.
  const HierarchyPlan* hierarchy = nullptr;
  const SelectionTable* selection = nullptr;
};

// What every rank must agree on for a call, exchanged under BRAID_DEBUG=detail. Plain
// bytes on the wire: ranks of one job run the same build.
struct Fingerprint {
  std::uint8_t kind = 0;
  std::uint8_t dtype = 0;
  std::uint8_t reduce_op = 0;  // 0xff: not a reduction
  std::uint8_t variable = 0;
  std::uint8_t staged = 0;  // ranks must agree on where the buffers are, not only on sizes
  std::int32_t root = -1;
  std::uint64_t count = 0;        // the count every rank must pass (0 where counts vary)
  std::uint64_t counts_hash = 0;  // all_gather_v: the counts every rank passes
  std::uint64_t sequence = 0;

  friend bool operator==(const Fingerprint&, const Fingerprint&) = default;
};

Fingerprint fingerprint_of(const CollectiveCall& call);
// Broadcast, reduce, gather and scatter: the collectives with a root.
inline bool is_rooted(CollectiveKind kind) noexcept {
  return kind == CollectiveKind::broadcast || kind == CollectiveKind::reduce ||
         kind == CollectiveKind::gather || kind == CollectiveKind::scatter;
}
// "all_reduce(count 1024, f32, sum)".
std::string describe(const Fingerprint& fingerprint);

}  // namespace braid::collectives::detail
