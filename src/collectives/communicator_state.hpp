// Communicator's implementation (communicator.hpp declares Communicator::State): the
// members, their numbering, the operations in flight, and the steps every entry point
// shares. Private to libbraid; the files of src/collectives/communicator*.cpp define it,
// and tests reach it through staging_engine_override.hpp.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <boost/asio/awaitable.hpp>

#include <braid/collectives/communicator.hpp>
#include <braid/collectives/hierarchy.hpp>
#include <braid/collectives/selection.hpp>
#include <braid/core/buffer.hpp>
#include <braid/core/deadline.hpp>
#include <braid/core/runtime.hpp>
#include <braid/trace/recorder.hpp>
#include <braid/trace/sampling.hpp>
#include <braid/transport/issued_work.hpp>

#include "collectives/collective_call.hpp"

namespace braid::collectives {

namespace detail {
class CollectiveOp;
class CommunicatorIds;
class CopyEngine;
class ScratchPool;
class SharedMemoryArena;
struct StagingResources;

// A split communicator's name: its id, its serial, the sequence its numbering starts from
// (communicator_ids.hpp), and the pool its id returns to.
struct CommunicatorIdentity {
  std::uint32_t id = 0;
  std::int64_t serial = 0;
  std::uint64_t first_sequence = 0;
  std::shared_ptr<CommunicatorIds> ids;
};
}  // namespace detail

class Communicator::State {
 public:
  State(Communicator& self, transport::World& world, std::vector<int> world_ranks,
        detail::CommunicatorIdentity name, Options options);
  ~State();
  State(const State&) = delete;
  State& operator=(const State&) = delete;

  // The state of `comm`: for the files of libbraid that work on a communicator's insides
  // (staging_engine_override.hpp's install).
  static State& of(Communicator& comm) noexcept { return *comm.state_; }

  int rank() const noexcept { return rank_; }
  int size() const noexcept { return static_cast<int>(world_ranks_.size()); }
  int world_rank(int rank) const { return world_ranks_.at(static_cast<std::size_t>(rank)); }

  // Checks the call (the checks both communicators share), picks the algorithm, takes the
  // call's place in the order (sequence number, shared-memory turn) now, and returns run().
  asio::awaitable<void> submit(detail::CollectiveCall call);
  // Runs the call (fingerprints, algorithm, error context, settling after a failure).
  asio::awaitable<void> run(std::shared_ptr<Communicator> self, detail::CollectiveCall call);
  // Whether a call on `buffer` goes to the NCCL communicator (route_cuda_to()).
  bool routes_to_nccl(const Buffer& buffer) const;
  // Hands a checked call to the NCCL communicator, which takes its place in NCCL's order
  // now.
  asio::awaitable<void> start_on_nccl(const detail::CollectiveCall& call);
  // A call on CUDA buffers: run() on host staging copies of them (docs/gpu.md).
  asio::awaitable<void> run_staged(std::shared_ptr<Communicator> self, detail::CollectiveCall call);
  detail::StagingResources& staging_for(int device);
  // send and recv of CUDA memory that UCX cannot take directly.
  asio::awaitable<std::size_t> staged_point_to_point(std::shared_ptr<Communicator> self,
                                                     std::unique_ptr<detail::CollectiveOp> op,
                                                     bool sending, Buffer data, int peer);
  asio::awaitable<std::shared_ptr<Communicator>> run_split(std::shared_ptr<Communicator> self,
                                                           std::uint64_t sequence, int color,
                                                           int key, Deadline deadline);
  asio::awaitable<std::shared_ptr<std::byte[]>> run_allocate_shared(
      std::shared_ptr<Communicator> self, std::uint64_t sequence, std::uint64_t id,
      std::size_t bytes, Deadline deadline);
  // One step of a call made of several (split, allocate_shared), at a sequence number the
  // outer call reserved: all_gather by ring, broadcast (from rank 0) by binomial tree,
  // message algorithms that take no arena turn.
  asio::awaitable<void> run_step(std::shared_ptr<Communicator> self, CollectiveKind kind,
                                 Buffer input, Buffer output, std::uint64_t sequence,
                                 Deadline deadline);
  detail::CollectiveCall prepare(CollectiveKind kind);
  void on_member_failed(int world_peer, const std::string& why);
  // Member `member` (a communicator rank) left the job cleanly having issued `work`: ops it
  // never issued fail now (transport/issued_work.hpp).
  void on_member_ended(int member, const transport::IssuedWork& work);
  // Fails `op` at once when a member it waits on has failed or left without issuing it.
  void abort_if_unreachable(detail::CollectiveOp& op);
  // What this rank has issued, for its peers when it leaves.
  transport::CommunicatorWork issued_work() const;
  // Runs a send or recv (staged or not): in flight, and so aborted, like a collective.
  asio::awaitable<std::size_t> run_point_to_point(std::shared_ptr<Communicator> self,
                                                  std::unique_ptr<detail::CollectiveOp> op,
                                                  bool sending, Buffer data, int peer);
  std::uint64_t take_sequence() noexcept { return next_sequence_.fetch_add(1); }
  // A send or recv at `sequence`: to NCCL where `may_route` and route_cuda_to() say so,
  // through host staging for CUDA memory UCX cannot take, else over UCX directly.
  asio::awaitable<std::size_t> point_to_point(bool sending, Buffer data, int peer,
                                              std::uint64_t sequence, bool may_route);
  // The sequence of numbered message `number` with `peer`, counted in `counters` (sends or
  // receives) as issued, with every number below it.
  std::uint64_t numbered_sequence(std::unique_ptr<std::atomic<std::uint64_t>[]>& counters, int peer,
                                  std::uint64_t number);

  transport::World& world_;
  Runtime& runtime_;
  std::vector<int> world_ranks_;  // this communicator's rank r is world rank world_ranks_[r]
  int rank_ = -1;
  std::uint32_t id_ = 0;
  std::int64_t serial_ = 0;
  std::shared_ptr<detail::CommunicatorIds> ids_;  // shared with every communicator split off
  Clock::duration timeout_;
  bool check_fingerprints_ = false;
  std::size_t trace_steps_from_ = 0;       // BRAID_TRACE_STEPS_KIB, in bytes
  trace::SmallOpSampling trace_sampling_;  // BRAID_TRACE_SAMPLE_KIB and _EVERY
  std::shared_ptr<const SelectionTable> selection_;
  std::atomic<std::uint64_t> next_sequence_{0};
  std::atomic<std::uint64_t> shared_allocations_{0};  // allocate_shared calls so far
  // Point-to-point sequence numbers, per peer and direction.
  std::unique_ptr<std::atomic<std::uint64_t>[]> send_sequence_;
  std::unique_ptr<std::atomic<std::uint64_t>[]> recv_sequence_;
  std::unique_ptr<detail::ScratchPool> scratch_;
  std::unique_ptr<detail::SharedMemoryArena> arena_;  // null unless every member is on this node
  HierarchyPlan hierarchy_;
  // Makes the copy engine that stages CUDA buffers of a device. Empty: CUDA's (a copy
  // stream and pinned memory), in builds with CUDA. Tests give a host engine
  // (staging_engine_override.hpp).
  std::function<std::unique_ptr<detail::CopyEngine>(int device)> staging_engine_;
  void* cuda_stream_ = nullptr;
  std::vector<std::pair<int, std::unique_ptr<detail::StagingResources>>> staging_;  // by device
  std::shared_ptr<NcclCommunicator> nccl_;  // route_cuda_to()
  // Collectives in flight (runtime thread only), aborted when a member dies. A vector:
  // a few at a time, and no allocation per operation once it has grown.
  std::vector<detail::CollectiveOp*> in_flight_;
  std::uint64_t failure_listener_ = 0;
  std::uint64_t ended_listener_ = 0;
  std::uint64_t work_source_ = 0;
  std::uint64_t first_sequence_ = 0;  // the name's: with id_, what peers' issued work names
  // This communicator's row in a timeline ("communicator 1"): its collectives' spans.
  trace::Track track_;
  Communicator& self_;  // the communicator this is the state of
};

}  // namespace braid::collectives
