// ProcessGroup: braid as a torch.distributed backend. A c10d::Backend whose collectives run
// on a braid Communicator, so PyTorch code -- DistributedDataParallel's bucket all-reduces,
// FSDP2, DTensor and pipelining included -- runs on braid's collectives unchanged.
// Python reaches it through the braid_torch module (python/braid_torch), which registers it as
// "braid":
//
//   import braid_torch
//   torch.distributed.init_process_group("braid", init_method="env://", rank=r, world_size=n)
//
// Joining (join()): every rank writes its host name to the PyTorch store it is handed (the
// prefix store init_process_group made, so groups never share keys); the ranks on one host
// form a node. Rank 0 picks a free port and publishes "host:port" and a random token there;
// every rank then joins a braid World with that store address (World::join: rank 0 serves
// braid's own store, then UCX connects every pair) and takes the world communicator.
// The host rank 0 publishes: MASTER_ADDR when set, 127.0.0.1 when every rank is on one
// host, else rank 0's host name. A torch.distributed.new_group whose members all hold the
// World a braid group joined (a braid default group) is a communicator over those members
// (Communicator::subgroup): it shares the World, its connections and its progress thread,
// and a trace (BRAID_TRACE) has its calls beside the default group's. Otherwise (gloo the
// default, braid only in new_group) the group joins a World of its own, the same way.
//
// Calls. Each collective checks its tensors, takes its place in the communicator's order
// on the calling thread (communicator.hpp: call every collective in the same order on
// every rank) and returns at once with a Work that completes on the progress thread.
// Work::wait() blocks until then and rethrows the operation's error; isCompleted() does
// not block; getFuture() is a c10::ivalue::Future holding the output tensors, completed
// on a completion thread (Completions below: DDP's communication hooks chain on it, and
// their callbacks may wait on this group's work). Until a Work completes, its tensors must
// stay alive and unread (outputs) or unmodified (inputs).
//
// Supported: one contiguous CPU tensor per call (the single-device list PyTorch passes),
// of a dtype braid moves (braid/torch/tensor_buffer.hpp: not bool, int8, int16 or complex).
//   allreduce, reduce       SUM, AVG, PRODUCT, MIN, MAX (AVG divides once, at the end; on
//                           integers it truncates, as braid's avg does)
//   allreduce_coalesced     any number of tensors of one dtype, in one all-reduce
//   broadcast, barrier
//   allgather (list), _allgather_base (one tensor), gather
//   allgather_into_tensor_coalesced, reduce_scatter_tensor_coalesced
//                           several _allgather_base / _reduce_scatter_base in one Work, each
//                           its own collective (DTensor's and FSDP2's functional collectives)
//   reduce_scatter (list), _reduce_scatter_base (one tensor), scatter
//   alltoall (list), alltoall_base (one tensor, with or without split sizes)
//   send, recv              matched per pair of ranks in call order; the tag is not used
// Cost beyond the collective itself: the list forms copy through one flat tensor (a
// concatenation before, or a copy into each list entry after); the rest are zero-copy.
//
// Errors are c10::Error (RuntimeError in Python) whose message starts "braid rank R: op:".
// A bad argument throws from the call; a failure during the operation (a dead peer,
// Errc::peer_failed, naming it; the timeout passed to join) comes from wait() and from
// the future.
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <braid/collectives/communicator.hpp>
#include <braid/core/buffer.hpp>
#include <braid/core/runtime.hpp>
#include <braid/dp/bucket_device.hpp>
#include <braid/transport/world.hpp>

namespace braid::torch {

// A c10d::Backend, which PyTorch wraps in a c10d::ProcessGroup of its own that carries the
// group's name and device map; a bare ProcessGroup subclass is PyTorch's legacy path, where
// destroying a subgroup, coalescing and group names fail.
class ProcessGroup final : public c10d::Backend {
 public:
  // Joins the ranks that share `store` (see Joining above); `timeout` bounds the join and
  // every operation. Collective: every rank calls it. Throws c10::Error naming the rank.
  static c10::intrusive_ptr<ProcessGroup> join(const c10::intrusive_ptr<c10d::Store>& store,
                                               int rank, int size,
                                               std::chrono::milliseconds timeout);

  // Leaves the World (a barrier with the other ranks, World's destructor) and stops the
  // progress thread.
  ~ProcessGroup() override;

  const std::string getBackendName() const override { return "braid"; }
  collectives::Communicator& communicator() noexcept { return *communicator_; }

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors,
                                        const c10d::ReduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& output_tensors,
                                           std::vector<at::Tensor>& input_tensors,
                                           const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& output_tensors,
                                        std::vector<at::Tensor>& input_tensors,
                                        const c10d::GatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& output_tensors,
                                         std::vector<std::vector<at::Tensor>>& input_tensors,
                                         const c10d::ScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& output_tensors,
                                                std::vector<std::vector<at::Tensor>>& input_tensors,
                                                const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(
      at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& output_split_sizes,
                                               std::vector<int64_t>& input_split_sizes,
                                               const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& output_tensors,
                                          std::vector<at::Tensor>& input_tensors,
                                          const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst_rank,
                                      int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src_rank,
                                      int tag) override;
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override;

  // The Runtime and World a process joined for a braid group, with the World's
  // communicator, shared by the groups made over it (new_group: Communicator::subgroup)
  // and gone with the last of them.
  struct JoinedWorld {
    std::unique_ptr<Runtime> runtime;
    std::unique_ptr<transport::World> world;
    std::shared_ptr<collectives::Communicator> communicator;
    std::string identity;  // rank 0's published store address and token: the same on every rank
    ~JoinedWorld() {
      communicator.reset();
      world.reset();  // leaves the World (a barrier with its other ranks)
      runtime.reset();
    }
  };

  // Public for c10::make_intrusive; use join().
  ProcessGroup(int rank, int size, std::shared_ptr<JoinedWorld> joined,
               std::shared_ptr<collectives::Communicator> communicator);

  // What a finished operation held (its tensors, its future), left by braid's thread and let
  // go on a caller's thread (the next call, or destruction): the last reference to a tensor
  // Python made frees a Python object, which takes the GIL, and braid's thread must never
  // wait for it while Python's thread waits for braid's (destroy_process_group).
  struct Remains;
  // The threads that complete the Works' futures. Completing a future runs the callbacks
  // chained on it with then() (DDP's comm hooks), and a callback may wait for another
  // operation (PowerSGD's waits for its all-reduces inside its callbacks): run on braid's
  // thread, it would wait for the thread that must make the progress. A thread is added
  // whenever every one is busy, so a callback that waits never holds up the completion it
  // waits for; one idle for 2 s leaves. One callback chain runs at a time, the earliest
  // issued of the completed operations first, so the operations callbacks issue follow one
  // order on every rank (process_group.cpp). Cost: one hand-off between threads per
  // operation.
  struct Completions;

 private:
  // Runs `operation` (already called, so in the communicator's order) to completion on
  // the progress thread, then `finish` there (copies out of a flat tensor), then completes
  // the Work with `outputs` on a completion thread, or fails it with the error named
  // after `op`.
  c10::intrusive_ptr<c10d::Work> start(c10d::OpType type, std::string_view op,
                                       asio::awaitable<void> operation,
                                       std::vector<at::Tensor> outputs,
                                       std::function<void()> finish = {});

  // A Buffer over a contiguous CPU tensor, or a CUDA one ordered on libtorch's current
  // stream (a libtorch with CUDA); anything else is a c10::Error naming the call.
  Buffer buffer_of(const at::Tensor& tensor, std::string_view op);
  // The coalesced forms' (input, output) buffers, every tensor checked before the first
  // operation is issued, so a refused call issues none.
  std::vector<std::pair<Buffer, Buffer>> coalesced_buffers(const std::vector<at::Tensor>& outputs,
                                                           const std::vector<at::Tensor>& inputs,
                                                           std::string_view op);

  std::shared_ptr<Remains> remains_;
  std::shared_ptr<Completions> completions_;
  // CUDA tensors: per device, the braid Stream over libtorch's current stream. Shared
  // with the operations in flight, whose buffers name those streams: a group destroyed
  // while they run leaves them alive.
  struct CudaStreams {
    std::mutex mutex;
    std::map<int, std::shared_ptr<dp::BucketDevice>> by_device;
  };
  std::shared_ptr<CudaStreams> cuda_streams_ = std::make_shared<CudaStreams>();
  std::shared_ptr<JoinedWorld> joined_;
  std::shared_ptr<collectives::Communicator> communicator_;
};

// Announces that this process is leaving through an error `why` on every World its braid
// groups joined (transport::World::announce_failure): peers waiting on it fail at once,
// naming its rank, instead of at their deadline. For errors that never unwind through C++:
// the braid_torch module calls it from sys.excepthook, for a Python exception that reaches
// the interpreter's top.
void announce_failure(const std::string& why);

}  // namespace braid::torch
