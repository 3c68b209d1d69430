// Communicator: a group of ranks and the collectives they run together, as awaitables.
//
//   braid::Runtime runtime;
//   auto world = braid::transport::World::join(runtime);
//   auto comm = braid::collectives::Communicator::world(*world);
//   runtime.spawn([&]() -> asio::awaitable<void> {
//     co_await comm->all_reduce(braid::Buffer(grads), braid::ReduceOp::sum);
//   }()).get();
//   // or, from plain code:  comm->launch(comm->all_reduce(buf, ReduceOp::avg)).get();
//
// Ordering. An operation takes its place when it is *called*, not when it is first
// awaited: each call takes the communicator's next sequence number, which travels in
// every message's tag. Every rank must call the same collectives in the same order (as
// with MPI and NCCL); then any number may be in flight at once (gradient buckets) and
// complete in any order. Calls may come from several threads, but the order between
// threads is then whatever the calls' order was on each rank, so keep issuing to one
// communicator on one thread. An awaitable that is dropped without being awaited leaves a
// hole in the order: the other ranks wait for it until their deadline.
//
// Threading. The awaitables run on the World's runtime: co_await them from coroutines
// spawned there (runtime.spawn), or use launch(). The buffers are the caller's, alive and
// untouched (inputs unmodified, outputs unread) until the operation completes.
//
// CUDA buffers (built with CUDA). This communicator reduces on the CPU, so it moves CUDA
// buffers through pinned host memory on a copy stream of their device (staging, see
// docs/gpu.md): all_reduce, broadcast and reduce in pipelined chunks
// (BRAID_STAGING_CHUNK_KIB) so the GPU copies overlap the network, the other collectives
// as a whole. Copies start after the work enqueued so far on Options::cuda_stream (the
// producer); the awaitable completes once the results are in device memory, so kernels
// enqueued after it see them. Input and output must be the same kind of memory on the same
// device. send and recv hand CUDA memory to UCX directly where UCX was built with CUDA. For
// GPU training, NcclCommunicator (nccl_communicator.hpp) moves CUDA buffers GPU to GPU.
//
// In place. Passing the same buffer as input and output is in place; a partial overlap
// is an error. The single-buffer overloads are the in-place forms.
//
// Errors (braid::Error; context: world rank, the peer's world rank, "all_reduce[ring]",
// sequence). Every call checks its arguments before it takes a sequence number:
//   Errc::invalid_argument  sizes that do not fit the operation, CUDA buffers in a build
//                           without CUDA, input and output in different kinds of memory,
//                           a root or peer outside the group
//   Errc::size_mismatch     a message from a peer has a size other than this rank's
//                           arguments imply: the ranks disagree on counts or dtypes. Never
//                           truncated silently.
//   Errc::desync            (BRAID_DEBUG=detail) ranks called different collectives, or
//                           the same one with different counts, dtypes, ops or roots, at
//                           the same sequence number; the message names both sides, and
//                           every rank reports it before any data moves.
//   Errc::peer_failed       a member died before or during the operation (named, whether or
//                           not this rank exchanges messages with it). Before the error
//                           reaches the caller, every transfer of the operation has ended
//                           (receives cancelled; transfers UCX cannot let go of within
//                           ~200 ms end by closing the endpoint to their peer), so the
//                           caller's buffers are free to reuse.
//   Errc::timeout           the operation did not finish within the timeout (Options)
// Without BRAID_DEBUG=detail, ranks that call different collectives at the same point
// fail on size checks or time out; two ranks passing dtypes of the same width and equal
// counts (f32 and i32) are not told apart.
//
// avg: the sum divided by the number of ranks, once, at the end. On integer dtypes the
// division truncates toward zero (like C++), so avg of {1, 2} is 1; sums wrap around.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <boost/asio/awaitable.hpp>

#include <braid/collectives/algorithm.hpp>
#include <braid/collectives/collective_group.hpp>
#include <braid/collectives/hierarchy.hpp>
#include <braid/collectives/selection.hpp>
#include <braid/core/buffer.hpp>
#include <braid/core/deadline.hpp>
#include <braid/core/future.hpp>
#include <braid/core/reduce_op.hpp>
#include <braid/core/runtime.hpp>

namespace braid::transport {
class World;
}  // namespace braid::transport

namespace braid::collectives {

namespace detail {
struct CommunicatorIdentity;
}  // namespace detail

struct CommunicatorOptions {
  // How long one operation may take to complete, counted from the moment it first has to
  // wait (for a turn, a message or a partner; an operation that never waits reads no
  // clock). nullopt: BRAID_TIMEOUT.
  std::optional<Clock::duration> timeout;
  // Exchange op fingerprints before every collective (BRAID_DEBUG=detail). nullopt: from
  // the environment.
  std::optional<bool> check_fingerprints;
  // Algorithm choice; null: SelectionTable::from_environment().
  std::shared_ptr<const SelectionTable> selection;
  // The cudaStream_t whose work writes and reads this communicator's CUDA buffers: staging
  // copies wait for what was enqueued on it before the call. null: the legacy default
  // stream.
  void* cuda_stream = nullptr;
};

class NcclCommunicator;

class Communicator final : public CollectiveGroup,
                           public std::enable_shared_from_this<Communicator> {
 public:
  using Options = CommunicatorOptions;

  // Every rank of `world`, in world order. The World must outlive the communicator and
  // every operation on it. Not a collective call: no messages are exchanged.
  static std::shared_ptr<Communicator> world(transport::World& world, Options options = {});

  ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const noexcept override;
  int size() const noexcept override;
  // The world rank of this communicator's rank `rank`.
  int world_rank(int rank) const;
  // Unique among the job's live communicators; the world's is 1. An id comes back into use
  // once every member has destroyed its communicator (and split again since).
  std::uint32_t id() const noexcept;
  // Unique in the job and never reused (the world's is 1): what names this communicator's
  // records in the store.
  std::int64_t serial() const noexcept;
  Runtime& runtime() noexcept override;
  transport::World& world() noexcept;

  // From now on, calls (send and recv included) whose buffers are CUDA memory on `nccl`'s
  // device run on `nccl` (same members, same order) instead of being staged through host
  // memory; CUDA buffers of other devices are still staged. Call it on every rank at the
  // same point, with no operation in flight. Null: stage again. Every rank must then pass
  // the same kind of memory to each call: a call staged on one rank and routed on another
  // never meets (BRAID_DEBUG=detail names staged calls in its fingerprints).
  void route_cuda_to(std::shared_ptr<NcclCommunicator> nccl);
  // The NCCL communicator route_cuda_to() set; null while CUDA buffers are staged.
  const std::shared_ptr<NcclCommunicator>& cuda_route() const noexcept;

  // Runs `operation` on the runtime for a caller that is not a coroutine.
  template <class T>
  Future<T> launch(asio::awaitable<T> operation) {
    return runtime().spawn(std::move(operation));
  }

  // ---- the collectives (collective_group.hpp says what each does)
  asio::awaitable<void> all_reduce(Buffer input, Buffer output, ReduceOp op) override;
  asio::awaitable<void> all_reduce(Buffer data, ReduceOp op) override;
  asio::awaitable<void> reduce_scatter(Buffer input, Buffer output, ReduceOp op) override;
  asio::awaitable<void> reduce_scatter(Buffer data, ReduceOp op) override;
  asio::awaitable<void> reduce(Buffer input, Buffer output, ReduceOp op, int root) override;
  asio::awaitable<void> reduce(Buffer data, ReduceOp op, int root) override;
  asio::awaitable<void> all_gather(Buffer input, Buffer output) override;
  asio::awaitable<void> all_gather(Buffer data) override;
  asio::awaitable<void> all_gather_v(Buffer input, Buffer output,
                                     std::span<const std::size_t> counts) override;
  asio::awaitable<void> broadcast(Buffer data, int root) override;
  asio::awaitable<void> gather(Buffer input, Buffer output, int root) override;
  asio::awaitable<void> scatter(Buffer input, Buffer output, int root) override;
  asio::awaitable<void> all_to_all(Buffer input, Buffer output) override;
  asio::awaitable<void> all_to_all(Buffer data) override;
  asio::awaitable<void> all_to_all_v(Buffer input, std::span<const std::size_t> send_counts,
                                     Buffer output,
                                     std::span<const std::size_t> recv_counts) override;
  asio::awaitable<void> barrier() override;

  // ---- memory
  // Collective: `bytes` for this rank's buffers, in memory every member maps when they are
  // all on one node. A collective whose buffers lie, on every rank, in memory from the
  // same allocate_shared call reaches peers' buffers with plain loads and stores: no system
  // call, no pinned pages, no copy through a staging segment (all_reduce reads and writes
  // them directly; the other shared-memory collectives copy with memcpy where they would
  // otherwise use cross-memory attach). DistributedDataParallel keeps its buckets here.
  //   Every rank passes the same `bytes` (Errc::size_mismatch names the ranks that
  //   differ). The result is 4096-byte aligned, at least `bytes` long, and zeroed. It
  //   lives as long as the last copy of the pointer, on each rank independently; freeing
  //   it while a call still uses it is the caller's error, as with any buffer.
  //   Where members span nodes, or the node cannot share the memory (a /dev/shm too small,
  //   say: logged at warn), every rank gets private memory instead, and collectives on it
  //   take their usual paths.
  //   Cost: 3 small collectives, and P x `bytes` of shared memory (every rank's region).
  asio::awaitable<std::shared_ptr<std::byte[]>> allocate_shared(std::size_t bytes);

  // ---- overlap
  // A hint, from any thread while the communicator lives: this rank is computing (a
  // backward pass producing the gradients of later buckets) and its core is needed
  // there. While it says so and some other member on the node does not, the reduction
  // work of its shared-memory all-reduces (single copy, from 64 KiB) is left to the
  // members that are free, which take every rank's share of the vector; it only waits.
  // With every member computing, or none, each starts on its own share and then takes
  // what the others have not started. The results are the same bit for bit whoever
  // reduces. DistributedDataParallel says it is computing from each forward's prepare to
  // the end of its backward pass. One hint per communicator: users that share one
  // communicator share it.
  //   Why: ranks reach a bucket's all-reduce at different moments of backward; the
  //   slowest rank's step is the job's, and the reduction its runtime thread did took
  //   CPU from its remaining backward on a node whose cores the training threads fill.
  //   Cost: where the hint changes, a store to a cache line of the arena, a fence, and an
  //   eventfd write per waiter asleep on it; a computing rank reads its peers' hints
  //   before each piece it claims and while it waits.
  void set_computing(bool computing) noexcept;

  // ---- point to point (collective_group.hpp): recv returns the elements received, at
  // most data.count().
  asio::awaitable<void> send(Buffer data, int peer) override;
  asio::awaitable<std::size_t> recv(Buffer data, int peer) override;

  // ---- numbered point to point: the caller numbers each message, from 0 per pair of ranks
  // and direction, instead of the call order numbering it. A receive takes the message its
  // peer sent under the same number, whichever side calls first and in whatever order
  // either calls: for exchanges whose receiving order is not the sending order (a
  // pipeline's activations and gradients, received ahead of their use). A pair uses
  // numbered or ordered calls, not both. Numbers between one pair go out in increasing
  // order: a rank that leaves the job is taken to have sent every number below its highest,
  // and a receive of a number it never sent fails then, naming it. Host memory over UCX,
  // CUDA memory through host staging; never NCCL (route_cuda_to), which matches by call
  // order only, and runs a posted receive before anything issued after it.
  asio::awaitable<void> send_numbered(Buffer data, int peer, std::uint64_t number);
  asio::awaitable<std::size_t> recv_numbered(Buffer data, int peer, std::uint64_t number);

  // Collective over this communicator: ranks with the same color form a new
  // communicator, ordered by key (ties by rank here). A negative color takes part but
  // joins none and gets nullptr. Ids come from the World's store, so communicators split
  // from different parents never collide; a job may create 4094 in its lifetime.
  asio::awaitable<std::shared_ptr<Communicator>> split(int color, int key);

  // A communicator over `world_ranks` (World ranks, this rank among them, in the order
  // they take ranks 0, 1, ...), made by those ranks alone: the others need not call it,
  // which is what torch.distributed.new_group asks of a backend. Every member calls it
  // with the same list and the same `key`, one no other subgroup of this World uses (a
  // caller that has its own rendezvous draws one there); with an empty key, members must
  // make their subgroups of one list in the same order, and the list and that order name
  // it. The first member draws the id from the World's store (as split's rank 0 does) and
  // publishes it under the key; the others wait for it, until this communicator's
  // timeout, and the last to read it erases it. The new communicator's operations time out
  // after `timeout` (nullopt: this communicator's). Cost: a few store round trips, no
  // collective.
  asio::awaitable<std::shared_ptr<Communicator>> subgroup(
      std::vector<int> world_ranks, std::string key = {},
      std::optional<Clock::duration> timeout = std::nullopt);

  // The algorithm this communicator would use.
  Algorithm algorithm_for(CollectiveKind kind, std::size_t bytes) const;
  // How the members group into nodes (World::node_of): what hierarchical algorithms use.
  const HierarchyPlan& hierarchy() const noexcept;
  // Whether calls may pass CUDA buffers (built with CUDA, or a test gave a host staging
  // engine).
  bool accepts_cuda_buffers() const noexcept;

 private:
  struct Private {};

 public:
  // The implementation, private to libbraid (src/collectives/communicator_state.hpp).
  class State;
  Communicator(Private, transport::World& world, std::vector<int> world_ranks,
               detail::CommunicatorIdentity name, Options options);

 private:
  std::unique_ptr<State> state_;
};

}  // namespace braid::collectives
