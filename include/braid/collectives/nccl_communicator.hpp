// NcclCommunicator: the Communicator API on CUDA memory, carried GPU to GPU by NCCL. Built
// only with CUDA and NCCL (BRAID_WITH_CUDA).
//
//   auto comm = braid::collectives::Communicator::world(*world);           // UCX, host
//   auto gpu = co_await braid::collectives::NcclCommunicator::create(*comm, device);
//   gpu->set_compute_stream(torch_stream);   // the stream that writes the gradients
//   co_await gpu->all_reduce(grads, braid::ReduceOp::avg);
//   comm->route_cuda_to(gpu);   // optional: comm's calls on CUDA buffers now go to NCCL
//
// Creating one is collective over the bootstrap communicator's members: its rank 0 makes
// the NCCL unique id and hands it out through the World's store. Initialisation is
// non-blocking (config.blocking = 0) and polled with ncclCommGetAsyncError, so a member
// that never arrives ends in a timeout and ncclCommAbort instead of a hang.
//
// Ordering contract (docs/gpu.md has the whole of it):
//  1. Streams. Communication runs on the communicator's own stream (stream(), created with
//     the device's highest priority so it is scheduled ahead of compute kernels that are
//     waiting). A call records an event on the compute stream (set_compute_stream; the
//     legacy default stream until set; or the stream its buffer names, Buffer::on_stream)
//     and makes the communication stream wait on it:
//     the operation sees everything enqueued on the compute stream before it reaches
//     NCCL (point 4), and the host never blocks.
//  2. Completion. The awaitable completes when the operation's event has passed on the
//     GPU: the results are in device memory and any stream may read them. Kernels that
//     consume the results may be enqueued after the co_await, with no extra wait.
//  3. Buffers. From the call until completion the input must stay allocated and unwritten
//     and the output allocated and unread, on every stream. With the caching allocator of
//     PyTorch, a tensor freed on the compute stream may be handed out again while NCCL
//     still reads it: keep the tensor alive until the awaitable completes (braid's DDP
//     does), or record the communication stream on it.
//  4. Order. An operation takes its place when it is *called*, as with Communicator: it
//     reaches NCCL when its awaitable has started and every operation called before it
//     has been handed to NCCL (and NCCL's non-blocking calls have settled; NCCL allows no
//     other call on the communicator meanwhile). Every rank must call the same operations
//     in the same order. Many may be in flight: they run one after another on the
//     communication stream. The compute-stream event of point 1 is recorded when the
//     operation reaches NCCL. An awaitable dropped without being awaited leaves a hole:
//     the operations after it wait for it until their timeout, then abort.
//  5. Tracing. With tracing on at creation, every operation is also a GPU span (CUDA
//     timing events around its kernels) on the track "nccl device D (gpu)", next to the
//     host span on "nccl device D": a timeline shows when the GPU ran it, and whether
//     it overlapped the compute stream's kernels.
//
// Errors (braid::Error, context: world rank and "nccl all_reduce"):
//   invalid_argument  a buffer that is not CUDA memory on this communicator's device, and
//                     every other argument check of the Communicator (the same checks, in
//                     the same words);
//   nccl_category     NCCL reported an error (value: the ncclResult_t), synchronously or
//                     through ncclCommGetAsyncError while an operation was in flight;
//   timeout           an operation or the initialisation did not finish within the
//                     timeout: the communicator is aborted (ncclCommAbort) and every later
//                     call fails with Errc::closed, naming the first failure.
// NCCL cannot tell a mismatched count from a slow peer: ranks that disagree on sizes hang
// until the timeout (then abort) rather than fail at once. send/recv must agree on counts.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <boost/asio/awaitable.hpp>
#include <boost/asio/steady_timer.hpp>
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <braid/collectives/collective_group.hpp>
#include <braid/core/buffer.hpp>
#include <braid/core/cuda_stream.hpp>
#include <braid/core/deadline.hpp>
#include <braid/core/error.hpp>
#include <braid/core/reduce_op.hpp>
#include <braid/core/runtime.hpp>
#include <braid/trace/recorder.hpp>

namespace braid {
class CudaTimeline;
}  // namespace braid

namespace braid::collectives {

class Communicator;

struct NcclCommunicatorOptions {
  // How long one operation (and the initialisation) may take. nullopt: BRAID_TIMEOUT.
  std::optional<Clock::duration> timeout;
  // The stream whose work writes and reads the buffers (contract point 1); nullptr: the
  // legacy default stream. May be changed later with set_compute_stream().
  cudaStream_t compute_stream = nullptr;
};

class NcclCommunicator final : public CollectiveGroup,
                               public std::enable_shared_from_this<NcclCommunicator> {
 public:
  using Options = NcclCommunicatorOptions;

  // Collective over `bootstrap`'s members, each passing the CUDA device it will use. The
  // new communicator has bootstrap's ranks and order. `bootstrap` and its World must
  // outlive it.
  static asio::awaitable<std::shared_ptr<NcclCommunicator>> create(Communicator& bootstrap,
                                                                   int device,
                                                                   Options options = {});

  // Flushes (ncclCommFinalize, bounded by the timeout) and destroys; aborts instead if the
  // communicator failed or the flush does not finish. Blocks; call off the runtime thread
  // or after every operation completed.
  ~NcclCommunicator();
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  int rank() const noexcept override { return rank_; }
  int size() const noexcept override { return size_; }
  int device() const noexcept { return device_; }
  ncclComm_t native() const noexcept { return comm_; }
  // The communication stream (contract point 1).
  CudaStream& stream() noexcept { return stream_; }
  void set_compute_stream(cudaStream_t stream) noexcept { compute_stream_ = stream; }
  Runtime& runtime() noexcept override { return runtime_; }

  // The collectives (collective_group.hpp), checked by the same argument checks as
  // Communicator's, on CUDA buffers of device(). In place is NCCL's: the in-place
  // reduce_scatter's result and the in-place all_gather's contribution are this rank's
  // block of `data`.
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
  // Point to point: NCCL needs the receiver to name the sender's exact count, so recv
  // receives exactly data.count() elements and returns that.
  asio::awaitable<void> send(Buffer data, int peer) override;
  asio::awaitable<std::size_t> recv(Buffer data, int peer) override;

  // ncclCommSplit: ranks with the same color form a new communicator ordered by key; a
  // negative color gets nullptr. Collective; non-blocking like create().
  asio::awaitable<std::shared_ptr<NcclCommunicator>> split(int color, int key);

  // Aborts the NCCL communicator (ncclCommAbort): operations in flight end, and every
  // call from now on fails with Errc::closed naming `why`.
  void abort(const std::string& why);
  bool aborted() const noexcept { return !failure_.empty(); }

 private:
  struct Private {};

 public:
  NcclCommunicator(Private, Runtime& runtime, ncclComm_t comm, int rank, int size, int world_rank,
                   int device, Clock::duration timeout, cudaStream_t compute_stream);

 private:
  // One NCCL call (or group of calls) as an operation: waits on `producer` (producer_of
  // its buffers), enqueues `enqueue` on the communication stream, awaits completion.
  // Takes the operation's place in the issue order (a ticket) now and returns run().
  template <class Enqueue>
  asio::awaitable<void> issue(trace::Name name, std::size_t bytes, cudaStream_t producer,
                              Enqueue enqueue);
  // The stream a call on these buffers follows: the one a buffer names (Buffer::on_stream),
  // else the compute stream. Error(invalid_argument) for a host stream.
  cudaStream_t producer_of(const Buffer& input, const Buffer& output) const;
  // When the ticket's turn comes: follows `producer`, calls `enqueue` (the NCCL
  // calls; returns the last one's result), waits for them to settle, calls
  // `settled_calls`, passes the turn on and awaits completion. Templates defined (and only
  // used) in nccl_communicator_entry_points.cpp; poll() in nccl_communicator_polling.cpp.
  template <class Enqueue, class Settled>
  asio::awaitable<void> run(std::uint64_t ticket, trace::Name name, std::size_t bytes,
                            cudaStream_t producer, Enqueue enqueue, Settled settled_calls);
  asio::awaitable<std::shared_ptr<NcclCommunicator>> run_split(std::uint64_t ticket, int color,
                                                               int key);
  // Waits until `ticket` is being served; past `deadline` the communicator is aborted.
  asio::awaitable<void> wait_turn(std::uint64_t ticket, std::string_view what, Deadline deadline);
  void pass_turn() noexcept;
  // Calls done(round) until it returns true: spinning (yielding to the runtime) at first,
  // then napping with a backoff; aborts with "<what> <late>" at the deadline.
  template <class Done>
  asio::awaitable<void> poll(std::string_view what, std::string_view late, Deadline deadline,
                             Done done);
  // Whether the last non-blocking call has finished; fails on an NCCL error.
  bool settled(std::string_view what);
  // Polls the communicator until a non-blocking call (init, an op, finalize) has settled.
  asio::awaitable<void> settle(std::string_view what, Deadline deadline);
  // Polls `done` (and NCCL's asynchronous error) until the GPU has passed it.
  asio::awaitable<void> await_done(CudaEvent& done, std::string_view what, Deadline deadline);
  Error error(std::error_code code, std::string detail, std::string_view operation) const;
  std::unique_ptr<CudaEvent> take_event();
  void give_back(std::unique_ptr<CudaEvent> event);
  // Aborts (the communicator is unusable after an NCCL error) and throws the error.
  [[noreturn]] void fail(std::string_view what, ncclResult_t result);
  void check_usable(std::string_view operation) const;

  Runtime& runtime_;
  ncclComm_t comm_;
  int rank_;
  int size_;
  int world_rank_;
  int device_;
  Clock::duration timeout_;
  cudaStream_t compute_stream_;
  CudaStream stream_;
  std::vector<std::unique_ptr<CudaEvent>> free_events_;
  void* barrier_word_ = nullptr;  // one device int that barrier() all-reduces
  std::string failure_;           // set once aborted
  std::unique_ptr<CudaTimeline> gpu_timeline_;
  // Issue order: tickets are taken at the call, served one at a time from the NCCL calls
  // until they settle; waiting operations park on their own timers (woken on each pass).
  std::uint64_t next_ticket_ = 0;
  std::uint64_t serving_ = 0;
  std::vector<asio::steady_timer*> waiting_;  // tracing on at creation: GPU spans (point 5)
  trace::Track track_;
};

}  // namespace braid::collectives
