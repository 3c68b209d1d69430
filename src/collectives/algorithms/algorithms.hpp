// The algorithms, one per file in this folder, each with its cost in its header comment
// (P ranks, n bytes per rank, alpha the per-message latency, beta the per-byte time,
// gamma the per-byte reduction time). docs/algorithms.md collects them in one table.
//
// Each takes the CollectiveOp it runs as and buffers the Communicator has already
// checked (same dtype, sizes consistent with the operation, host memory); input and
// output are either the same memory (in place) or disjoint.
#pragma once

#include <cstddef>
#include <span>
#include <vector>

#include <boost/asio/awaitable.hpp>

#include <braid/collectives/algorithm.hpp>
#include <braid/core/buffer.hpp>
#include <braid/core/reduce_op.hpp>

#include "collectives/collective_call.hpp"
#include "collectives/collective_op.hpp"

namespace braid::collectives {
struct HierarchyPlan;
class SelectionTable;
}  // namespace braid::collectives

namespace braid::collectives::detail {

asio::awaitable<void> ring_all_reduce(CollectiveOp& op, Buffer input, Buffer output,
                                      ReduceOp reduce_op);
asio::awaitable<void> recursive_doubling_all_reduce(CollectiveOp& op, Buffer input, Buffer output,
                                                    ReduceOp reduce_op);
asio::awaitable<void> halving_doubling_all_reduce(CollectiveOp& op, Buffer input, Buffer output,
                                                  ReduceOp reduce_op);
// input: size() blocks of output.count(); rank r's reduced block r lands in output.
asio::awaitable<void> ring_reduce_scatter(CollectiveOp& op, Buffer input, Buffer output,
                                          ReduceOp reduce_op);
// output: the blocks of every rank (counts[r] elements each, in rank order); input is
// this rank's block (it may be that very block of output).
asio::awaitable<void> ring_all_gather(CollectiveOp& op, Buffer input, Buffer output,
                                      std::span<const std::size_t> counts);
// The ~256 KiB pieces a pipelined broadcast moves `data` in, alike on every rank.
EvenSplit broadcast_pieces(const Buffer& data);
asio::awaitable<void> binomial_tree_broadcast(CollectiveOp& op, Buffer data, int root);
// `plan` orders the chain node by node.
asio::awaitable<void> ring_broadcast(CollectiveOp& op, Buffer data, int root,
                                     const HierarchyPlan& plan);
asio::awaitable<void> binomial_tree_reduce(CollectiveOp& op, Buffer input, Buffer output,
                                           ReduceOp reduce_op, int root);
asio::awaitable<void> linear_gather(CollectiveOp& op, Buffer input, Buffer output, int root);
asio::awaitable<void> linear_scatter(CollectiveOp& op, Buffer input, Buffer output, int root);
asio::awaitable<void> pairwise_all_to_all(CollectiveOp& op, Buffer input,
                                          std::span<const std::size_t> send_counts, Buffer output,
                                          std::span<const std::size_t> recv_counts);
asio::awaitable<void> dissemination_barrier(CollectiveOp& op);

// recursive_doubling or halving_doubling by name; ring for any other algorithm.
asio::awaitable<void> message_all_reduce(CollectiveOp& op, Buffer input, Buffer output,
                                         ReduceOp reduce_op, Algorithm algorithm);

// Within nodes, then across them, then within again; `plan` says who is where, and
// `selection` picks the cross-node phase's algorithm for its bytes and ranks.
asio::awaitable<void> hierarchical_all_reduce(CollectiveOp& op, Buffer input, Buffer output,
                                              ReduceOp reduce_op, const HierarchyPlan& plan,
                                              const SelectionTable& selection);

// Rails across nodes and direct exchanges within them (hierarchical_exchange.cpp), for
// plans where hierarchical_exchange_fits(); the ring otherwise.
bool hierarchical_exchange_fits(const HierarchyPlan& plan);
// Node k's members in rank order, for every node of `plan`: rank (k, i) is members[k][i].
std::vector<std::vector<int>> members_by_node(const HierarchyPlan& plan);
asio::awaitable<void> hierarchical_all_gather(CollectiveOp& op, Buffer input, Buffer output,
                                              std::span<const std::size_t> counts,
                                              const HierarchyPlan& plan);
asio::awaitable<void> hierarchical_reduce_scatter(CollectiveOp& op, Buffer input, Buffer output,
                                                  ReduceOp reduce_op, const HierarchyPlan& plan);

// Through the communicator's shared-memory arena (call.arena), when call.arena_ticket
// comes up in its issue order. Calls that fit the inline slots (fits_inline below:
// barriers, all-reduces up to 16 KiB, the others up to 64 KiB) run in
// shared_memory_small, larger all-reduces in shared_memory_all_reduce, the other larger
// collectives in shared_memory_collective. All-reduce and barrier always run in the arena;
// the other collectives only where the members read each other's memory: otherwise
// shared_memory_small and shared_memory_collective give up their turn at once and run the
// message algorithm.
asio::awaitable<void> shared_memory_small(CollectiveOp& op, const CollectiveCall& call);
// Whether `call` goes through the ranks' inline slots, the same answer on every rank whose
// call matches: a barrier; an all-reduce of at most 16 KiB; a reduce, reduce-scatter or
// all-to-all (equal counts) whose input, or an all-gather (equal or variable counts) whose
// output, is at most SharedMemoryArena::kInlineBytes; a broadcast of at most that much, or
// a gather or scatter whose root's whole output or input is.
bool fits_inline(const CollectiveCall& call) noexcept;
asio::awaitable<void> shared_memory_all_reduce(CollectiveOp& op, const CollectiveCall& call);
asio::awaitable<void> shared_memory_collective(CollectiveOp& op, const CollectiveCall& call);
// Gives up the arena turn of a call whose algorithm never ran (arena_turn.hpp, pass()).
asio::awaitable<void> pass_arena_turn(CollectiveOp& op, const CollectiveCall& call);

// The collective's message algorithm (over the transport), for any call but an all-reduce
// selected for shared memory (communicator.cpp).
asio::awaitable<void> run_message_algorithm(CollectiveOp& op, const CollectiveCall& call);

}  // namespace braid::collectives::detail
